// GPU statistics for the training log (utilisation, memory, power, SM clock), read through NVML.
// NVML is loaded at run time with dlopen("libnvidia-ml.so.1"), the library the NVIDIA driver
// installs, and never linked at build time: a vitrain binary must start and train on machines
// without a driver or GPU, where the monitor is simply unavailable and every read is empty.
// nvml.h is not needed either: the few ABI types and entry points used are declared below.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace vit {

// The slice of NVML's C ABI the monitor uses (names and values as in nvml.h).
namespace nvml {

using Return = int;                              // nvmlReturn_t
using Device = void*;                            // nvmlDevice_t, an opaque handle
inline constexpr Return kSuccess = 0;            // NVML_SUCCESS
inline constexpr int kClockSm = 1;               // NVML_CLOCK_SM in nvmlClockType_t
inline constexpr unsigned kNameBufferSize = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE

struct Utilization {  // nvmlUtilization_t: percent of the last sample period
  unsigned int gpu;
  unsigned int memory;
};

struct Memory {  // nvmlMemory_t (v1), bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// Entry points, loaded from the library or supplied by a test. All but error_string are
// required; a null one makes the monitor unavailable.
struct Api {
  Return (*init)() = nullptr;                                  // nvmlInit_v2
  Return (*shutdown)() = nullptr;                              // nvmlShutdown
  Return (*device_by_index)(unsigned int, Device*) = nullptr;  // nvmlDeviceGetHandleByIndex_v2
  Return (*utilization)(Device, Utilization*) = nullptr;       // nvmlDeviceGetUtilizationRates
  Return (*memory)(Device, Memory*) = nullptr;                 // nvmlDeviceGetMemoryInfo
  Return (*power_mw)(Device, unsigned int*) = nullptr;         // nvmlDeviceGetPowerUsage
  Return (*clock_mhz)(Device, int, unsigned int*) = nullptr;   // nvmlDeviceGetClockInfo
  Return (*name)(Device, char*, unsigned int) = nullptr;       // nvmlDeviceGetName
  const char* (*error_string)(Return) = nullptr;               // nvmlErrorString (optional)
};

}  // namespace nvml

// One reading; a field NVML could not report (e.g. power on some boards) is left empty.
struct GpuStats {
  std::optional<double> util_pct;       // GPU busy, percent
  std::optional<double> mem_used_gib;   // device memory in use, GiB (2^30 bytes)
  std::optional<double> mem_total_gib;  // device memory in all, GiB
  std::optional<double> power_w;        // board power draw, watts
  std::optional<double> sm_clock_mhz;   // current SM clock, MHz

  bool empty() const {
    return !util_pct && !mem_used_gib && !mem_total_gib && !power_w && !sm_clock_mhz;
  }
};

// Reads one GPU through NVML. Never throws and never prints: when the library, one of its
// entry points or the device is missing, or NVML fails to start, available() is false, reason()
// says why, name() is empty and read() returns empty stats. device_index is NVML's numbering
// (PCI bus order), which ignores CUDA_VISIBLE_DEVICES. Each read() costs a few driver calls:
// take one per log line, not per step.
class GpuMonitor {
 public:
  static constexpr const char* kLibrary = "libnvidia-ml.so.1";

  // library: the NVML shared library to dlopen (tests point it elsewhere).
  explicit GpuMonitor(int device_index = 0, const std::string& library = kLibrary);
  // Test seam: uses the given entry points instead of loading a library.
  explicit GpuMonitor(const nvml::Api& api, int device_index = 0);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  bool available() const { return available_; }
  const std::string& reason() const { return reason_; }  // empty when available
  std::string name() const;                              // e.g. "NVIDIA H100 80GB HBM3"
  GpuStats read() const;

 private:
  void start(int device_index, const std::string& source);
  std::string error_text(nvml::Return code) const;

  void* library_ = nullptr;  // dlopen handle; null for an injected Api
  nvml::Api api_;
  nvml::Device device_ = nullptr;
  bool available_ = false;
  std::string reason_;
};

// Console fragment with the fields present, e.g. "GPU 97% 12.3/79.6 GiB 412 W 1980 MHz";
// a missing memory side prints as "?". Empty when no field is present.
std::string format_gpu_stats(const GpuStats& s);

// Adds gpu_util_pct, gpu_mem_used_gib, gpu_mem_total_gib, gpu_power_w and gpu_sm_clock_mhz to
// a log record, each only when present.
void add_gpu_stats(nlohmann::json& j, const GpuStats& s);

}  // namespace vit
