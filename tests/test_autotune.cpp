// The autotuner (ops/autotune.h) with a fake timer: it keeps the fastest candidate, times a
// shape once, keeps its picks on disk under the device's versions, times again when they
// change, and refuses to tune a family whose candidates change results.
#include <gtest/gtest.h>

#include <fstream>

#include "ops/autotune.h"
#include "temp_dir.h"

namespace vit {
namespace {

const OpKey kFlashKey = attention_key(OpFamily::kFlashForward, 256, 197, 6, 64, Storage::kBf16);

// Milliseconds a candidate "takes": 3 warps fastest; counts the calls.
struct FakeTimer {
  int calls = 0;
  double operator()(const KernelChoice& c) {
    ++calls;
    return c.param == 3 ? 1.0 : 2.0 + c.param;
  }
};

std::vector<KernelChoice> flash_candidates() {
  return tune_candidates(fake_device(90), kFlashKey, KernelOptions{});
}

TEST(Autotune, PicksTheFastestAndTimesAShapeOnce) {
  Autotuner tuner("");
  FakeTimer timer;
  auto time = [&](const KernelChoice& c) { return timer(c); };
  const KernelChoice pick = tuner.pick("dev", kFlashKey, flash_candidates(), time, 3);
  EXPECT_EQ(pick.param, 3);
  EXPECT_EQ(pick.why, ChoiceWhy::kTuned);
  EXPECT_EQ(timer.calls, 4 * 3);
  EXPECT_EQ(tuner.pick("dev", kFlashKey, flash_candidates(), time, 3).param, 3);
  EXPECT_EQ(timer.calls, 12);  // the second ask came from memory
  EXPECT_EQ(tuner.timed_count(), 1u);
}

TEST(Autotune, MediansDecideNotOneSlowCall) {
  Autotuner tuner("");
  int call = 0;
  // 1 warp: one outlier of 100 ms among 1 ms calls; 2 warps: a steady 1.5 ms.
  auto time = [&](const KernelChoice& c) {
    ++call;
    if (c.param == 1) return call == 1 ? 100.0 : 1.0;
    return c.param == 2 ? 1.5 : 9.0;
  };
  EXPECT_EQ(tuner.pick("dev", kFlashKey, flash_candidates(), time, 5).param, 1);
}

TEST(Autotune, PicksPersistUnderTheirVersionsOnly) {
  testing::TempDir dir;
  const std::string path = dir.str() + "/cache/autotune.json";
  DeviceProps h100 = fake_device(90);
  FakeTimer timer;
  auto time = [&](const KernelChoice& c) { return timer(c); };
  {
    Autotuner tuner(path);
    tuner.pick(h100.cache_key(), kFlashKey, flash_candidates(), time, 1);
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  const int after_first = timer.calls;
  {
    Autotuner again(path);  // a new process on the same machine: from the file, no timing
    EXPECT_EQ(again.pick(h100.cache_key(), kFlashKey, flash_candidates(), time, 1).param, 3);
    EXPECT_EQ(timer.calls, after_first);
  }
  h100.driver = "another driver";  // a driver update invalidates: timed again
  Autotuner updated(path);
  updated.pick(h100.cache_key(), kFlashKey, flash_candidates(), time, 1);
  EXPECT_EQ(timer.calls, 2 * after_first);
  EXPECT_EQ(updated.timed_count(), 1u);
}

TEST(Autotune, AMalformedCacheIsIgnored) {
  testing::TempDir dir;
  const std::string path = dir.str() + "/autotune.json";
  std::ofstream(path) << "{ not json";
  Autotuner tuner(path);
  FakeTimer timer;
  auto time = [&](const KernelChoice& c) { return timer(c); };
  EXPECT_EQ(tuner.pick("dev", kFlashKey, flash_candidates(), time, 1).param, 3);
  EXPECT_GT(timer.calls, 0);
}

TEST(Autotune, RefusesFamiliesThatChangeBits) {
  Autotuner tuner("");
  auto time = [](const KernelChoice&) { return 1.0; };
  const std::vector<KernelChoice> two{{"erf", 0, ChoiceWhy::kRule}, {"fast", 0, ChoiceWhy::kRule}};
  EXPECT_THROW(tuner.pick("dev", gelu_key(100, Storage::kBf16), two, time), Error);
  EXPECT_THROW(tuner.pick("dev", layernorm_key(8, 384, Storage::kBf16), two, time), Error);
  EXPECT_THROW(tuner.pick("dev", kFlashKey, {}, time), Error);
}

TEST(Autotune, APlanTunesOnlyWhenAskedAndReplaysWithoutTiming) {
  auto tuner = std::make_shared<Autotuner>("");
  FakeTimer timer;
  auto time = [&](const KernelChoice& c) { return timer(c); };
  KernelPlan off(fake_device(90), KernelOptions{});
  off.set_tuner(tuner);
  EXPECT_FALSE(off.wants_timing(kFlashKey));
  EXPECT_EQ(off.choice(kFlashKey, time).why, ChoiceWhy::kRule);
  EXPECT_EQ(timer.calls, 0);

  KernelPlan on(fake_device(90), parse_kernel_options("autotune=on"));
  on.set_tuner(tuner);
  EXPECT_TRUE(on.wants_timing(kFlashKey));
  const KernelChoice tuned = on.choice(kFlashKey, time);
  EXPECT_EQ(tuned.why, ChoiceWhy::kTuned);
  EXPECT_EQ(tuned.param, 3);
  // Bit-changing families stay on their rule with autotune on.
  EXPECT_EQ(on.choice(gelu_key(100, Storage::kBf16), time).why, ChoiceWhy::kRule);

  // Resumed with an empty cache that would pick otherwise: the recorded pick, no timing.
  auto other_cache = std::make_shared<Autotuner>("");
  KernelPlan resumed(fake_device(90), parse_kernel_options("autotune=on"));
  resumed.set_tuner(other_cache);
  resumed.replay(nlohmann::json::parse(on.to_json().dump()));
  const int calls = timer.calls;
  int other_calls = 0;
  EXPECT_EQ(
      resumed.choice(kFlashKey, [&](const KernelChoice&) { return ++other_calls, 1.0; }).param, 3);
  EXPECT_EQ(other_calls, 0);
  EXPECT_EQ(timer.calls, calls);
}

}  // namespace
}  // namespace vit
