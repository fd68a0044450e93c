// GpuMonitor without a GPU: a missing library, a library without NVML's symbols and this
// machine's default all leave it unavailable (no throw, empty reads); a fake NVML table checks
// the unit conversions, per-field omission on failure, init/shutdown pairing, and the exact
// console and JSON formatting.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/gpu_stats.h"

namespace {

using vit::GpuMonitor;
using vit::GpuStats;
namespace nvml = vit::nvml;

constexpr unsigned long long kGiB = 1ull << 30;
constexpr nvml::Return kInvalidArgument = 2;  // NVML_ERROR_INVALID_ARGUMENT
constexpr nvml::Return kNotSupported = 3;     // NVML_ERROR_NOT_SUPPORTED
constexpr nvml::Return kDriverNotLoaded = 9;  // NVML_ERROR_DRIVER_NOT_LOADED

// State behind the fake NVML entry points: return codes to give and calls seen.
struct FakeNvml {
  nvml::Return init_rc = nvml::kSuccess, handle_rc = nvml::kSuccess, util_rc = nvml::kSuccess,
               memory_rc = nvml::kSuccess, power_rc = nvml::kSuccess, clock_rc = nvml::kSuccess,
               name_rc = nvml::kSuccess;
  int init_calls = 0, shutdown_calls = 0;
  unsigned int last_index = 12345;
};
FakeNvml fake;
int device_token;  // its address is the fake device handle
nvml::Device const kHandle = &device_token;

nvml::Return fake_init() {
  ++fake.init_calls;
  return fake.init_rc;
}
nvml::Return fake_shutdown() {
  ++fake.shutdown_calls;
  return nvml::kSuccess;
}
nvml::Return fake_device(unsigned int index, nvml::Device* dev) {
  fake.last_index = index;
  if (fake.handle_rc == nvml::kSuccess) *dev = kHandle;
  return fake.handle_rc;
}
nvml::Return fake_util(nvml::Device dev, nvml::Utilization* u) {
  if (dev != kHandle) return kInvalidArgument;
  *u = {97, 40};
  return fake.util_rc;
}
nvml::Return fake_memory(nvml::Device dev, nvml::Memory* m) {
  if (dev != kHandle) return kInvalidArgument;
  *m = {159 * kGiB / 2, 134 * kGiB / 2, 25 * kGiB / 2};  // total 79.5, free 67, used 12.5 GiB
  return fake.memory_rc;
}
nvml::Return fake_power(nvml::Device dev, unsigned int* mw) {
  if (dev != kHandle) return kInvalidArgument;
  *mw = 412345;
  return fake.power_rc;
}
nvml::Return fake_clock(nvml::Device dev, int type, unsigned int* mhz) {
  if (dev != kHandle) return kInvalidArgument;
  *mhz = type == nvml::kClockSm ? 1980 : 1593;  // any other clock domain reads differently
  return fake.clock_rc;
}
nvml::Return fake_name(nvml::Device dev, char* buf, unsigned int len) {
  if (dev != kHandle) return kInvalidArgument;
  std::snprintf(buf, len, "Fake H100");
  return fake.name_rc;
}
const char* fake_error_string(nvml::Return rc) {
  return rc == kDriverNotLoaded ? "Driver Not Loaded" : "Unknown Error";
}

nvml::Api fake_api() {
  nvml::Api api;
  api.init = fake_init;
  api.shutdown = fake_shutdown;
  api.device_by_index = fake_device;
  api.utilization = fake_util;
  api.memory = fake_memory;
  api.power_mw = fake_power;
  api.clock_mhz = fake_clock;
  api.name = fake_name;
  api.error_string = fake_error_string;
  return api;
}

class GpuStatsTest : public ::testing::Test {
 protected:
  void SetUp() override { fake = FakeNvml{}; }
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// An unavailable monitor: a reason, and nothing read, named, formatted or logged.
void expect_unavailable(const GpuMonitor& m) {
  EXPECT_FALSE(m.available());
  EXPECT_FALSE(m.reason().empty());
  EXPECT_EQ(m.name(), "");
  const GpuStats s = m.read();
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(vit::format_gpu_stats(s), "");
  nlohmann::json j = {{"step", 7}};
  vit::add_gpu_stats(j, s);
  EXPECT_EQ(j, nlohmann::json({{"step", 7}}));
}

TEST_F(GpuStatsTest, MissingLibraryIsUnavailable) {
  const std::string path = "/nonexistent/dir/libnvidia-ml.so.1";
  GpuMonitor m(0, path);
  expect_unavailable(m);
  EXPECT_TRUE(contains(m.reason(), path)) << m.reason();
}

TEST_F(GpuStatsTest, LibraryWithoutNvmlSymbolsIsUnavailable) {
  GpuMonitor m(0, "libc.so.6");  // loads fine, has no NVML entry points
  expect_unavailable(m);
  EXPECT_TRUE(contains(m.reason(), "nvmlInit_v2")) << m.reason();
  EXPECT_TRUE(contains(m.reason(), "libc.so.6")) << m.reason();
}

// Without a driver (this build machine) the default monitor is unavailable; with one it must
// read at least the memory size. Either way nothing throws.
TEST_F(GpuStatsTest, DefaultMonitorNeverThrows) {
  std::optional<GpuMonitor> m;
  ASSERT_NO_THROW(m.emplace());
  if (!m->available()) {
    expect_unavailable(*m);
    return;
  }
  EXPECT_EQ(m->reason(), "");
  EXPECT_NE(m->name(), "");
  const GpuStats s = m->read();
  ASSERT_TRUE(s.mem_total_gib.has_value());
  EXPECT_GT(*s.mem_total_gib, 0.0);
}

TEST_F(GpuStatsTest, FakeNvmlReadsEveryField) {
  {
    GpuMonitor m(fake_api(), 2);
    ASSERT_TRUE(m.available()) << m.reason();
    EXPECT_EQ(m.reason(), "");
    EXPECT_EQ(fake.last_index, 2u);
    EXPECT_EQ(m.name(), "Fake H100");
    const GpuStats s = m.read();
    EXPECT_EQ(s.util_pct, 97.0);
    EXPECT_EQ(s.mem_used_gib, 12.5);
    EXPECT_EQ(s.mem_total_gib, 79.5);
    ASSERT_TRUE(s.power_w.has_value());
    EXPECT_DOUBLE_EQ(*s.power_w, 412.345);  // milliwatts -> watts
    EXPECT_EQ(s.sm_clock_mhz, 1980.0);
    EXPECT_EQ(vit::format_gpu_stats(s), "GPU 97% 12.5/79.5 GiB 412 W 1980 MHz");
    nlohmann::json j;
    vit::add_gpu_stats(j, s);
    EXPECT_EQ(j.size(), 5u);
    EXPECT_EQ(j["gpu_util_pct"], 97.0);
    EXPECT_EQ(j["gpu_mem_used_gib"], 12.5);
    EXPECT_EQ(j["gpu_mem_total_gib"], 79.5);
    EXPECT_DOUBLE_EQ(j["gpu_power_w"].get<double>(), 412.345);
    EXPECT_EQ(j["gpu_sm_clock_mhz"], 1980.0);
    EXPECT_EQ(fake.shutdown_calls, 0);
  }
  EXPECT_EQ(fake.init_calls, 1);
  EXPECT_EQ(fake.shutdown_calls, 1);  // the destructor balances nvmlInit_v2
}

TEST_F(GpuStatsTest, FailingPowerIsOmitted) {
  fake.power_rc = kNotSupported;
  GpuMonitor m(fake_api());
  ASSERT_TRUE(m.available()) << m.reason();
  const GpuStats s = m.read();
  EXPECT_FALSE(s.power_w.has_value());
  EXPECT_EQ(s.util_pct, 97.0);
  EXPECT_EQ(s.mem_used_gib, 12.5);
  EXPECT_EQ(s.mem_total_gib, 79.5);
  EXPECT_EQ(s.sm_clock_mhz, 1980.0);
  EXPECT_EQ(vit::format_gpu_stats(s), "GPU 97% 12.5/79.5 GiB 1980 MHz");
  nlohmann::json j;
  vit::add_gpu_stats(j, s);
  EXPECT_EQ(j, nlohmann::json({{"gpu_util_pct", 97.0},
                               {"gpu_mem_used_gib", 12.5},
                               {"gpu_mem_total_gib", 79.5},
                               {"gpu_sm_clock_mhz", 1980.0}}));
}

TEST_F(GpuStatsTest, FailingMemoryClockAndNameAreOmitted) {
  fake.memory_rc = kNotSupported;
  fake.clock_rc = kNotSupported;
  fake.name_rc = kNotSupported;
  GpuMonitor m(fake_api());
  ASSERT_TRUE(m.available()) << m.reason();
  EXPECT_EQ(m.name(), "");
  const GpuStats s = m.read();
  EXPECT_FALSE(s.mem_used_gib.has_value());
  EXPECT_FALSE(s.mem_total_gib.has_value());
  EXPECT_FALSE(s.sm_clock_mhz.has_value());
  EXPECT_EQ(vit::format_gpu_stats(s), "GPU 97% 412 W");
}

TEST_F(GpuStatsTest, InitFailureIsUnavailable) {
  fake.init_rc = kDriverNotLoaded;
  {
    GpuMonitor m(fake_api());
    expect_unavailable(m);
    EXPECT_TRUE(contains(m.reason(), "Driver Not Loaded")) << m.reason();
    EXPECT_TRUE(contains(m.reason(), "9")) << m.reason();
  }
  EXPECT_EQ(fake.shutdown_calls, 0);  // nothing to shut down after a failed init

  nvml::Api no_strings = fake_api();
  no_strings.error_string = nullptr;  // optional: the code alone is reported
  GpuMonitor m(no_strings);
  EXPECT_FALSE(m.available());
  EXPECT_EQ(m.reason(), "nvmlInit_v2 failed: NVML error 9");
}

TEST_F(GpuStatsTest, MissingDeviceShutsNvmlDown) {
  fake.handle_rc = kInvalidArgument;
  GpuMonitor m(fake_api(), 3);
  expect_unavailable(m);
  EXPECT_EQ(fake.last_index, 3u);
  EXPECT_TRUE(contains(m.reason(), "GPU 3")) << m.reason();
  EXPECT_EQ(fake.init_calls, 1);
  EXPECT_EQ(fake.shutdown_calls, 1);
}

TEST_F(GpuStatsTest, MissingEntryPointOrBadIndexNeverInits) {
  nvml::Api api = fake_api();
  api.power_mw = nullptr;
  GpuMonitor missing(api);
  expect_unavailable(missing);
  EXPECT_TRUE(contains(missing.reason(), "nvmlDeviceGetPowerUsage")) << missing.reason();

  GpuMonitor negative(fake_api(), -1);
  expect_unavailable(negative);
  EXPECT_EQ(fake.init_calls, 0);
}

TEST_F(GpuStatsTest, FormattingShowsOnlyPresentFields) {
  EXPECT_EQ(vit::format_gpu_stats(GpuStats{}), "");
  GpuStats util_only;
  util_only.util_pct = 42.6;
  EXPECT_EQ(vit::format_gpu_stats(util_only), "GPU 43%");
  GpuStats used_only;
  used_only.mem_used_gib = 3.26;
  used_only.power_w = 70.4;
  EXPECT_EQ(vit::format_gpu_stats(used_only), "GPU 3.3/? GiB 70 W");

  nlohmann::json j = {{"type", "train"}};
  vit::add_gpu_stats(j, used_only);
  EXPECT_EQ(j,
            nlohmann::json({{"type", "train"}, {"gpu_mem_used_gib", 3.26}, {"gpu_power_w", 70.4}}));
}

}  // namespace
