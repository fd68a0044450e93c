// Size curricula of the seed methods (methods.md §1.4, §2.3, §4): Borealis multi-size training and
// the EfficientTrain++ compute-driven schedule (sizes, RandAugment magnitude, LR, progress).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/common.h"
#include "train/curriculum.h"

namespace {

TEST(SizeCurriculum, BorealisBestConfig) {
  // init 32, +32 px every 5 epochs, final 224, patch 16.
  const int want[] = {32, 64, 96, 128, 160, 192, 224};
  for (int k = 0; k < 7; ++k) {
    for (int e = 5 * k; e < 5 * k + 5; ++e)
      EXPECT_EQ(vit::size_curriculum(e, 32, 32, 5, 224, 16), want[k]) << "epoch " << e;
  }
  EXPECT_EQ(vit::size_curriculum(35, 32, 32, 5, 224, 16), 224);
  EXPECT_EQ(vit::size_curriculum(1000, 32, 32, 5, 224, 16), 224);
  EXPECT_EQ(vit::size_curriculum(1 << 30, 32, 32, 5, 224, 16), 224);  // no overflow
}

TEST(SizeCurriculum, RoundsDownToPatchAndAtLeastOnePatch) {
  // init 50 with patch 16 -> 48; +16 -> 66 -> 64; final 100 -> 96.
  EXPECT_EQ(vit::size_curriculum(0, 50, 16, 3, 100, 16), 48);
  EXPECT_EQ(vit::size_curriculum(3, 50, 16, 3, 100, 16), 64);
  EXPECT_EQ(vit::size_curriculum(30, 50, 16, 3, 100, 16), 96);
  EXPECT_EQ(vit::size_curriculum(0, 8, 8, 1, 224, 16), 16);  // below one patch -> one patch
  EXPECT_EQ(vit::size_curriculum(7, 8, 0, 1, 32, 4), 8);     // step 0 -> constant
  // CIFAR-scale: 8 -> 32 with patch 4.
  EXPECT_EQ(vit::size_curriculum(0, 8, 8, 2, 32, 4), 8);
  EXPECT_EQ(vit::size_curriculum(2, 8, 8, 2, 32, 4), 16);
  EXPECT_EQ(vit::size_curriculum(6, 8, 8, 2, 32, 4), 32);
}

TEST(SizeCurriculum, RejectsBadArguments) {
  EXPECT_THROW(vit::size_curriculum(-1, 32, 32, 5, 224, 16), vit::Error);
  EXPECT_THROW(vit::size_curriculum(0, 0, 32, 5, 224, 16), vit::Error);
  EXPECT_THROW(vit::size_curriculum(0, 32, -1, 5, 224, 16), vit::Error);
  EXPECT_THROW(vit::size_curriculum(0, 32, 32, 0, 224, 16), vit::Error);
  EXPECT_THROW(vit::size_curriculum(0, 32, 32, 5, 224, 0), vit::Error);
  EXPECT_THROW(vit::size_curriculum(0, 32, 32, 5, 8, 16), vit::Error);
}

TEST(EtSchedule, DeitSizesAtProgress) {
  const vit::EtSchedule s = vit::et_schedule_deit(224, 16);
  EXPECT_EQ(s.final_size, 224);
  EXPECT_EQ(s.sizes, (std::vector<int>{96, 96, 160, 160, 160, 160, 192, 192, 224, 224}));
  const double p[] = {0, 0.19, 0.2, 0.59, 0.6, 0.79, 0.8, 0.99};
  const int want[] = {96, 96, 160, 160, 192, 192, 224, 224};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(vit::et_size(s, p[i]), want[i]) << "p " << p[i];
  EXPECT_EQ(vit::et_size(s, 1.0), 224);
  EXPECT_EQ(vit::et_size(s, 1.5), 224);
  EXPECT_THROW(vit::et_size(s, -0.1), vit::Error);
  EXPECT_THROW(vit::et_size(s, std::nan("")), vit::Error);
  EXPECT_THROW(vit::et_size(vit::EtSchedule{{96, 160}, 224}, 0.5), vit::Error);
}

TEST(EtSchedule, MagnitudeIsFloorTenP) {
  for (int k = 0; k <= 100; ++k) {
    const double p = k / 100.0;
    EXPECT_EQ(vit::et_magnitude(p), std::min(9, int(std::floor(10 * p)))) << p;
  }
  EXPECT_EQ(vit::et_magnitude(0.0), 0);
  EXPECT_EQ(vit::et_magnitude(0.0999), 0);
  EXPECT_EQ(vit::et_magnitude(0.1), 1);
  EXPECT_EQ(vit::et_magnitude(0.55), 5);
  EXPECT_EQ(vit::et_magnitude(0.95), 9);
  EXPECT_EQ(vit::et_magnitude(1.0), 9);
  EXPECT_THROW(vit::et_magnitude(-1e-9), vit::Error);
}

TEST(EtSchedule, ScaledTables) {
  // final 32, patch 4: 96*32/224 = 13.7 -> 12, 160 -> 22.9 -> 24, 192 -> 27.4 -> 28, 224 -> 32.
  const vit::EtSchedule s = vit::et_schedule_deit(32, 4);
  EXPECT_EQ(s.final_size, 32);
  EXPECT_EQ(s.sizes, (std::vector<int>{12, 12, 24, 24, 24, 24, 28, 28, 32, 32}));
  // final 64, patch 8: 27.4 -> 24, 45.7 -> 48, 54.9 -> 56, 64.
  EXPECT_EQ(vit::et_schedule_deit(64, 8).sizes,
            (std::vector<int>{24, 24, 48, 48, 48, 48, 56, 56, 64, 64}));
  // final 16, patch 16: everything at least one patch.
  EXPECT_EQ(vit::et_schedule_deit(16, 16).sizes, std::vector<int>(10, 16));
  EXPECT_THROW(vit::et_schedule_deit(30, 4), vit::Error);
  EXPECT_THROW(vit::et_schedule_deit(32, 0), vit::Error);
  EXPECT_THROW(vit::et_schedule_deit(0, 4), vit::Error);
}

TEST(EtSchedule, NamedAndExplicitTables) {
  // The paper's Swin and ConvNeXt tables at 224, and scaled to 28 px with 4-px patches
  // (96 -> 12, 160 -> 20, 224 -> 28).
  EXPECT_EQ(vit::et_schedule("swin", 224, 16).sizes,
            (std::vector<int>{96, 96, 160, 160, 160, 160, 224, 224, 224, 224}));
  EXPECT_EQ(vit::et_schedule("convnext", 224, 16).sizes,
            (std::vector<int>{160, 160, 160, 160, 160, 160, 224, 224, 224, 224}));
  EXPECT_EQ(vit::et_schedule("convnext", 28, 4).sizes,
            (std::vector<int>{20, 20, 20, 20, 20, 20, 28, 28, 28, 28}));
  EXPECT_EQ(vit::et_schedule("deit", 32, 4).sizes, vit::et_schedule_deit(32, 4).sizes);
  EXPECT_EQ(vit::et_schedule("16,16,20,20,20,24,24,28,28,28", 28, 4).sizes,
            (std::vector<int>{16, 16, 20, 20, 20, 24, 24, 28, 28, 28}));
  EXPECT_TRUE(vit::is_named_et_table("convnext"));
  EXPECT_FALSE(vit::is_named_et_table("resnet"));
  // Bad tables: unknown name, nine sizes, a size off the patch grid, above the final size, junk.
  EXPECT_THROW(vit::et_schedule("resnet", 28, 4), vit::Error);
  EXPECT_THROW(vit::et_schedule("16,16,20,20,20,24,24,28,28", 28, 4), vit::Error);
  EXPECT_THROW(vit::et_schedule("16,16,20,20,20,24,24,28,28,27", 28, 4), vit::Error);
  EXPECT_THROW(vit::et_schedule("16,16,20,20,20,24,24,28,28,32", 28, 4), vit::Error);
  EXPECT_THROW(vit::et_schedule("16,16,20,x,20,24,24,28,28,28", 28, 4), vit::Error);
  EXPECT_THROW(vit::et_schedule("16,,20,20,20,24,24,28,28,28", 28, 4), vit::Error);
}

TEST(EtSchedule, ComputeWeight) {
  EXPECT_DOUBLE_EQ(vit::et_compute_weight(224, 224), 1.0);
  EXPECT_DOUBLE_EQ(vit::et_compute_weight(112, 224), 0.25);
  EXPECT_DOUBLE_EQ(vit::et_compute_weight(96, 224), (96.0 / 224) * (96.0 / 224));
  EXPECT_THROW(vit::et_compute_weight(0, 224), vit::Error);
}

TEST(EtSchedule, LrWarmupAndCosine) {
  const double base = 4e-3, mn = 1e-6, wl = 0;
  EXPECT_DOUBLE_EQ(vit::et_lr(0.0, base, mn, wl), 0.0);
  EXPECT_NEAR(vit::et_lr(0.1, base, mn, wl), 2e-3, 1e-15);  // half-way through the warm-up
  EXPECT_NEAR(vit::et_lr(0.15, base, mn, wl), 3e-3, 1e-15);
  EXPECT_NEAR(vit::et_lr(0.05, base, mn, 1e-6), 1e-6 + 0.25 * (base - 1e-6), 1e-15);
  // After warm-up: timm cosine in p (t = p, not shifted by the warm-up).
  auto cosv = [&](double p) { return mn + 0.5 * (base - mn) * (1 + std::cos(M_PI * p)); };
  EXPECT_NEAR(vit::et_lr(0.2, base, mn, wl), cosv(0.2), 1e-15);
  EXPECT_NEAR(vit::et_lr(0.5, base, mn, wl), mn + 0.5 * (base - mn), 1e-15);
  EXPECT_NEAR(vit::et_lr(0.8, base, mn, wl), cosv(0.8), 1e-15);
  EXPECT_NEAR(vit::et_lr(0.999999, base, mn, wl), mn, 1e-12);
  EXPECT_DOUBLE_EQ(vit::et_lr(1.0, base, mn, wl), mn);
  EXPECT_DOUBLE_EQ(vit::et_lr(1.3, base, mn, wl), mn);
  // No warm-up: cosine from p = 0.
  EXPECT_DOUBLE_EQ(vit::et_lr(0.0, base, mn, wl, 0.0), base);
  EXPECT_THROW(vit::et_lr(-0.1, base, mn, wl), vit::Error);
  EXPECT_THROW(vit::et_lr(0.5, base, mn, wl, 1.0), vit::Error);
  EXPECT_THROW(vit::et_lr(0.5, base, mn, wl, -0.1), vit::Error);
}

TEST(ComputeBudget, ProgressFollowsWeightedImages) {
  // 10 equivalent epochs of 1000 images at final 224.
  vit::ComputeBudget b(10, 1000, 224);
  EXPECT_DOUBLE_EQ(b.total(), 10000.0);
  EXPECT_DOUBLE_EQ(b.progress(), 0.0);
  b.add(1000, 112);  // one data epoch at 112 px = 0.25 equivalent epochs
  EXPECT_DOUBLE_EQ(b.consumed, 250.0);
  EXPECT_DOUBLE_EQ(b.progress(), 0.025);
  b.add(750, 224);
  EXPECT_DOUBLE_EQ(b.progress(), 0.1);
  EXPECT_FALSE(b.done());
  b.add(9000, 224);
  EXPECT_DOUBLE_EQ(b.progress(), 1.0);  // clamped (consumed 10000 + 0 overshoot = exactly 1)
  EXPECT_TRUE(b.done());
  b.add(1, 224);
  EXPECT_DOUBLE_EQ(b.progress(), 1.0);
  EXPECT_THROW(b.add(-1, 224), vit::Error);
  EXPECT_THROW(vit::ComputeBudget(0, 1000, 224), vit::Error);
  EXPECT_THROW(vit::ComputeBudget(1, 0, 224), vit::Error);
  EXPECT_THROW(vit::ComputeBudget(1, 10, 0), vit::Error);
}

TEST(ComputeBudget, DeitScheduleStagesUseEqualCompute) {
  // Drive the ET++ DeiT-S schedule to the end at batch granularity: every stage spends ~10% of
  // the compute, so the low-resolution stages see many more images (methods.md §2.3 worked
  // example: 96 px ~ 217 data epochs of E = 200, i.e. 2 * 0.1 * 200 * (224/96)^2).
  const vit::EtSchedule s = vit::et_schedule_deit(224, 16);
  vit::ComputeBudget b(200, 1000, 224);
  std::vector<double> images_at(10, 0.0);
  const int batch = 10;
  while (!b.done()) {
    const int stage = vit::et_stage(b.progress());
    b.add(batch, s.sizes[stage]);
    images_at[stage] += batch;
  }
  double at96 = images_at[0] + images_at[1];
  EXPECT_NEAR(at96 / 1000, 2 * 0.1 * 200 * (224.0 / 96) * (224.0 / 96), 0.1);
  EXPECT_NEAR(at96 / 1000, 217.8, 0.5);
  double at224 = images_at[8] + images_at[9];
  EXPECT_NEAR(at224 / 1000, 40.0, 0.05);
}

}  // namespace
