#include "core/gpu_stats.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <type_traits>

namespace vit {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Calls f(symbol, entry) for each required entry point, so the names live in one place.
template <class F>
void for_each_required(nvml::Api& api, F&& f) {
  f("nvmlInit_v2", api.init);
  f("nvmlShutdown", api.shutdown);
  f("nvmlDeviceGetHandleByIndex_v2", api.device_by_index);
  f("nvmlDeviceGetUtilizationRates", api.utilization);
  f("nvmlDeviceGetMemoryInfo", api.memory);
  f("nvmlDeviceGetPowerUsage", api.power_mw);
  f("nvmlDeviceGetClockInfo", api.clock_mhz);
  f("nvmlDeviceGetName", api.name);
}

template <class Fn>
Fn lookup(void* library, const char* symbol) {
  return reinterpret_cast<Fn>(dlsym(library, symbol));
}

nvml::Api bind(void* library) {
  nvml::Api api;
  for_each_required(api, [library](const char* symbol, auto& fn) {
    fn = lookup<std::remove_reference_t<decltype(fn)>>(library, symbol);
  });
  api.error_string = lookup<decltype(api.error_string)>(library, "nvmlErrorString");
  return api;
}

// The first required entry point that is null, or nullptr when all are there.
const char* first_missing(nvml::Api api) {
  const char* missing = nullptr;
  for_each_required(api, [&missing](const char* symbol, auto& fn) {
    if (!fn && !missing) missing = symbol;
  });
  return missing;
}

std::optional<double> read_util(const nvml::Api& api, nvml::Device dev) {
  nvml::Utilization u{};
  if (api.utilization(dev, &u) != nvml::kSuccess) return std::nullopt;
  return u.gpu;
}

std::optional<double> read_power(const nvml::Api& api, nvml::Device dev) {
  unsigned int mw = 0;
  if (api.power_mw(dev, &mw) != nvml::kSuccess) return std::nullopt;
  return mw / 1000.0;
}

std::optional<double> read_sm_clock(const nvml::Api& api, nvml::Device dev) {
  unsigned int mhz = 0;
  if (api.clock_mhz(dev, nvml::kClockSm, &mhz) != nvml::kSuccess) return std::nullopt;
  return mhz;
}

std::string format_memory(const GpuStats& s) {
  if (!s.mem_used_gib && !s.mem_total_gib) return "";
  auto side = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.1f}", *v) : std::string("?");
  };
  return side(s.mem_used_gib) + "/" + side(s.mem_total_gib) + " GiB";
}

}  // namespace

GpuMonitor::GpuMonitor(int device_index, const std::string& library) {
  library_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library_) {
    const char* err = dlerror();
    reason_ = "cannot load NVML: " + (err ? std::string(err) : library);
    return;
  }
  api_ = bind(library_);
  dlerror();  // drop the error a missing optional symbol leaves behind
  start(device_index, " in " + library);
}

GpuMonitor::GpuMonitor(const nvml::Api& api, int device_index) : api_(api) {
  start(device_index, "");
}

GpuMonitor::~GpuMonitor() {
  if (available_) api_.shutdown();
  if (library_) dlclose(library_);
}

// Starts NVML and opens the device; on any failure leaves the monitor unavailable.
void GpuMonitor::start(int device_index, const std::string& source) {
  if (const char* missing = first_missing(api_)) {
    reason_ = fmt::format("NVML entry point {} not found{}", missing, source);
    return;
  }
  if (device_index < 0) {
    reason_ = fmt::format("invalid GPU index {}", device_index);
    return;
  }
  if (nvml::Return rc = api_.init(); rc != nvml::kSuccess) {
    reason_ = "nvmlInit_v2 failed: " + error_text(rc);
    return;
  }
  if (nvml::Return rc = api_.device_by_index(unsigned(device_index), &device_);
      rc != nvml::kSuccess) {
    reason_ = fmt::format("no GPU {}: {}", device_index, error_text(rc));
    device_ = nullptr;
    api_.shutdown();
    return;
  }
  available_ = true;
}

std::string GpuMonitor::error_text(nvml::Return code) const {
  const char* text = api_.error_string ? api_.error_string(code) : nullptr;
  return text ? fmt::format("{} (NVML error {})", text, code) : fmt::format("NVML error {}", code);
}

std::string GpuMonitor::name() const {
  if (!available_) return "";
  char buf[nvml::kNameBufferSize] = {};
  if (api_.name(device_, buf, sizeof buf) != nvml::kSuccess) return "";
  buf[sizeof buf - 1] = '\0';
  return buf;
}

GpuStats GpuMonitor::read() const {
  GpuStats s;
  if (!available_) return s;
  s.util_pct = read_util(api_, device_);
  if (nvml::Memory m{}; api_.memory(device_, &m) == nvml::kSuccess) {
    s.mem_used_gib = m.used / kGiB;
    s.mem_total_gib = m.total / kGiB;
  }
  s.power_w = read_power(api_, device_);
  s.sm_clock_mhz = read_sm_clock(api_, device_);
  return s;
}

std::string format_gpu_stats(const GpuStats& s) {
  if (s.empty()) return "";
  std::string out = "GPU";
  auto add = [&out](const std::string& part) {
    if (!part.empty()) out += " " + part;
  };
  if (s.util_pct) add(fmt::format("{:.0f}%", *s.util_pct));
  add(format_memory(s));
  if (s.power_w) add(fmt::format("{:.0f} W", *s.power_w));
  if (s.sm_clock_mhz) add(fmt::format("{:.0f} MHz", *s.sm_clock_mhz));
  return out;
}

void add_gpu_stats(nlohmann::json& j, const GpuStats& s) {
  auto put = [&j](const char* key, const std::optional<double>& v) {
    if (v) j[key] = *v;
  };
  put("gpu_util_pct", s.util_pct);
  put("gpu_mem_used_gib", s.mem_used_gib);
  put("gpu_mem_total_gib", s.mem_total_gib);
  put("gpu_power_w", s.power_w);
  put("gpu_sm_clock_mhz", s.sm_clock_mhz);
}

}  // namespace vit
