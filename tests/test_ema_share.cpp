// The share of a model EMA still held by the first update's weights (train/schedule.h), which
// decides the trainer's warning that a short run's EMA result shows early weights.
#include <gtest/gtest.h>

#include <cmath>

#include "train/schedule.h"

namespace {

TEST(EmaFirstShare, WithoutWarmupIsTheDecayToTheUpdatesAfterTheFirst) {
  EXPECT_DOUBLE_EQ(vit::ema_first_share(0, 0.9998, false), 1.0);
  EXPECT_DOUBLE_EQ(vit::ema_first_share(1, 0.9998, false), 1.0);
  EXPECT_NEAR(vit::ema_first_share(150, 0.9998, false), std::pow(0.9998, 149), 1e-15);
  // timm's default decay keeps more than half of the first weights for ~3,466 updates.
  EXPECT_GT(vit::ema_first_share(3000, 0.9998, false), 0.5);
  EXPECT_LT(vit::ema_first_share(4000, 0.9998, false), 0.5);
}

TEST(EmaFirstShare, WarmupForgetsTheFirstWeightsWithinAFewUpdates) {
  // Update 2 has decay 1 - 2^(-2/3) = 0.37: the product falls below a half at once.
  EXPECT_NEAR(vit::ema_first_share(2, 0.9998, true), 1.0 - std::pow(2.0, -2.0 / 3.0), 1e-15);
  EXPECT_LT(vit::ema_first_share(150, 0.9998, true), 1e-6);
  double product = 1.0;
  for (int64_t step = 2; step <= 20; ++step) product *= vit::ema_decay(step, 0.9998, true);
  EXPECT_NEAR(vit::ema_first_share(20, 0.9998, true), product, 1e-15);
}

}  // namespace
