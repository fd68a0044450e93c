// Model EMA against PyTorch: timm ModelEmaV3's decay schedule, and the fp32 update
// ema.lerp_(weights, 1 - decay) bit for bit over several updates (tests/reference/ema_ref.py
// writes ema.safetensors; the ctest fixture `torch_reference` group runs it first).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "ops/cpu/ema.h"
#include "train/schedule.h"

namespace {

const std::string kRefPath = std::string(VIT_REFERENCE_DIR) + "/ema.safetensors";

class EmaTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::filesystem::exists(kRefPath)) return;
    if (std::getenv("VIT_ALLOW_MISSING_REFERENCE") != nullptr)
      GTEST_SKIP() << "no PyTorch reference at " << kRefPath;
    FAIL() << "missing " << kRefPath << ": run `/usr/bin/python3 tests/reference/ema_ref.py --out "
           << VIT_REFERENCE_DIR << "`";
  }
};

std::vector<std::string> cases(const vit::io::SafeTensors& st) {
  std::vector<std::string> names;
  std::stringstream ss(st.metadata.at("cases"));
  for (std::string c; std::getline(ss, c, ',');) names.push_back(c);
  return names;
}

TEST_F(EmaTorch, DecayScheduleIsTimms) {
  const vit::io::SafeTensors st = vit::io::read_safetensors(kRefPath);
  for (const std::string& c : cases(st)) {
    const bool warmup = c.find("warmup") != std::string::npos;
    const std::vector<double> want = st.at(c + ".decays").to_f64();
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_DOUBLE_EQ(vit::ema_decay(int64_t(i) + 1, 0.9998, warmup), want[i]) << c << " " << i;
  }
}

TEST_F(EmaTorch, UpdateIsBitwiseTorchLerp) {
  const vit::io::SafeTensors st = vit::io::read_safetensors(kRefPath);
  const auto names = cases(st);
  ASSERT_EQ(names.size(), 4u);
  for (const std::string& c : names) {
    std::vector<float> ema = st.at(c + ".ema0").to_f32();
    const std::vector<double> decays = st.at(c + ".decays").to_f64();
    for (size_t step = 1; step <= decays.size(); ++step) {
      const std::vector<float> w = st.at(c + ".weights" + std::to_string(step)).to_f32();
      ASSERT_EQ(w.size(), ema.size());
      vit::cpu::ema_update(ema.data(), w.data(), vit::Index(ema.size()), decays[step - 1]);
    }
    const std::vector<float> want = st.at(c + ".ema").to_f32();
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i)
      differ += std::memcmp(&ema[i], &want[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << c << ": elements not bitwise torch's";
  }
}

}  // namespace
