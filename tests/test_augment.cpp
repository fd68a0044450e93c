// Sampling properties of the augmentation: RandomResizedCrop ranges, RandAugment grammar,
// thread-count independence of make_batch with the timm pipeline, Mixup/CutMix targets and area.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "data/augment.h"
#include "data/batch.h"
#include "data/randaugment.h"

using namespace vit;
using namespace vit::data;

namespace {

ImageDataset synthetic(Index n, Index C, Index H, Index W, int K) {
  ImageDataset d;
  d.n = n;
  d.channels = C;
  d.height = H;
  d.width = W;
  d.num_classes = K;
  d.pixels.resize(n * C * H * W);  // (n, C, H, W)
  Rng rng(7);
  for (auto& p : d.pixels) p = uint8_t(rng.below(256));
  for (Index i = 0; i < n; ++i) d.labels.push_back(int32_t(i % K));
  return d;
}

BatchConfig timm_config(Index S) {
  BatchConfig c;
  c.img_size = int(S);
  c.hflip = 0.5;
  c.smoothing = 0.1;
  c.mean = {0.5f, 0.4f, 0.3f};
  c.std = {0.25f, 0.25f, 0.25f};
  c.rrc = true;
  c.interpolation = "random";
  c.reprob = 0.25;
  c.auto_augment = "rand-m9-mstd0.5-inc1";
  return c;
}

}  // namespace

TEST(Augment, RrcScaleAndRatioRanges) {
  Rng rng(1);
  const Index H = 48, W = 64;
  double mean_area = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const CropBox b = sample_rrc(rng, H, W, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, H);
    ASSERT_LE(b.left + b.width, W);
    const double area = double(b.height * b.width) / double(H * W);
    const double ratio = double(b.width) / double(b.height);
    // Integer rounding of w and h widens the ranges slightly at small crops.
    EXPECT_GE(area, 0.06);
    EXPECT_GE(ratio, 0.75 * 0.85);
    EXPECT_LE(ratio, 4.0 / 3.0 / 0.85);
    mean_area += area / n;
  }
  // Accepted draws are uniform in [0.08, 1] minus the too-large ones that got redrawn.
  EXPECT_GT(mean_area, 0.40);
  EXPECT_LT(mean_area, 0.56);
}

TEST(Augment, RrcFallbackIsCentredCrop) {
  Rng rng(3);
  // A 4:1 image with scale fixed at 1 cannot fit any box: the fallback cuts to ratio 4/3.
  const CropBox b = sample_rrc(rng, 30, 120, 1.0, 1.0, 3.0 / 4.0, 4.0 / 3.0);
  EXPECT_EQ(b.height, 30);
  EXPECT_EQ(b.width, 40);
  EXPECT_EQ(b.left, 40);
  EXPECT_EQ(b.top, 0);
}

TEST(Augment, RandAugmentGrammar) {
  const RandAugmentConfig c = parse_rand_augment("rand-m9-mstd0.5-inc1");
  EXPECT_EQ(c.magnitude, 9);
  EXPECT_EQ(c.magnitude_std, 0.5);
  EXPECT_TRUE(c.increasing);
  EXPECT_EQ(c.num_ops, 2);
  EXPECT_EQ(c.prob, 0.5);
  const RandAugmentConfig d = parse_rand_augment("rand-m7-n3-p0.8-mmax12-mstd101", 3.5);
  EXPECT_EQ(d.magnitude, 3.5);  // override wins
  EXPECT_EQ(d.num_ops, 3);
  EXPECT_EQ(d.prob, 0.8);
  EXPECT_EQ(d.magnitude_max, 12);
  EXPECT_TRUE(std::isinf(d.magnitude_std));
  EXPECT_FALSE(d.increasing);
  EXPECT_THROW(parse_rand_augment("augmix-m5"), Error);
  EXPECT_THROW(parse_rand_augment("rand-q5"), Error);
  EXPECT_THROW(parse_rand_augment("rand-m9x"), Error);
  // Counts and magnitudes whose integers would overflow (fuzz_config, 2026-11-25: n6333333333600
  // was converted to int unchecked), fractional counts, magnitudes off any sensible scale.
  for (const char* bad : {"rand-n6333333333600", "rand-n101", "rand-n2.5", "rand-m1e9",
                          "rand-mmax2000", "rand-m9-mmax1001", "rand-p1.5"})
    EXPECT_THROW(parse_rand_augment(bad), Error) << bad;
  EXPECT_EQ(parse_rand_augment("rand-n100-m1000-mmax1000").num_ops, kMaxRandAugmentOps);
  RandAugment ra(c, {124, 116, 104});
  ASSERT_EQ(ra.ops().size(), 15u);
  EXPECT_EQ(ra.ops()[4], RaOp::PosterizeIncreasing);
}

// The largest magnitude the grammar takes (m = mmax = 1000) makes PosterizeIncreasing keep
// 4 - 400 bits: PIL's mask ~(2^(8 - bits) - 1) is then 0, so every pixel goes to 0 (the shift
// itself would overflow an int).
TEST(Augment, PosterizeBelowOneBitKeepsNothing) {
  for (const double bits : {0.0, -1.0, -396.0})
    for (int i : {0, 1, 127, 255}) EXPECT_EQ(pointwise_value(int32_t(RaOp::Posterize), bits, i), 0);
  EXPECT_EQ(pointwise_value(int32_t(RaOp::Posterize), 1.0, 200), 128);
  EXPECT_EQ(pointwise_value(int32_t(RaOp::Posterize), 8.0, 201), 201);
  EXPECT_EQ(ra_level_arg(RaOp::PosterizeIncreasing, 1000.0, false), -396.0);
}

TEST(Augment, DefaultConfigKeepsLegacyPath) {
  BatchConfig c;
  EXPECT_FALSE(uses_timm_pipeline(c, true));
  EXPECT_FALSE(uses_timm_pipeline(c, false));
  c.crop_padding = 4;
  c.hflip = 0.5;
  EXPECT_FALSE(uses_timm_pipeline(c, true));
  c.reprob = 0.25;
  EXPECT_TRUE(uses_timm_pipeline(c, true));
  EXPECT_FALSE(uses_timm_pipeline(c, false));
}

TEST(Augment, MakeBatchIndependentOfThreads) {
  const ImageDataset d = synthetic(12, 3, 32, 40, 5);
  const BatchConfig c = timm_config(24);
  std::vector<Index> idx = {3, 0, 11, 7, 7, 1, 5, 9};
  const Index B = Index(idx.size()), n_img = B * 3 * 24 * 24;
  std::vector<float> img1(n_img), img2(n_img), t1(B * 5), t2(B * 5);  // (B, C, S, S), (B, K)
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  make_batch(d, idx.data(), B, c, true, 42, 3, img1.data(), t1.data());
  omp_set_num_threads(2);
  make_batch(d, idx.data(), B, c, true, 42, 3, img2.data(), t2.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(img1, img2);
  EXPECT_EQ(t1, t2);
  // Same index in one batch gives the same sample; another epoch gives another.
  EXPECT_TRUE(std::equal(img1.begin() + 3 * n_img / B, img1.begin() + 4 * n_img / B,
                         img1.begin() + 4 * n_img / B));
  make_batch(d, idx.data(), B, c, true, 42, 4, img2.data(), t2.data());
  EXPECT_NE(img1, img2);
  // Eval transform (resize + centre crop) is deterministic and ignores the train options.
  BatchConfig e = c;
  e.eval_crop_pct = 0.875;
  make_batch(d, idx.data(), B, e, false, 42, 3, img1.data(), t1.data());
  make_batch(d, idx.data(), B, e, false, 42, 9, img2.data(), t2.data());
  EXPECT_EQ(img1, img2);
}

TEST(Augment, MixupTargetsSumToOne) {
  const Index B = 6, C = 1, S = 8, K = 4;
  int mixed = 0;
  for (uint64_t batch = 0; batch < 20; ++batch) {
    std::vector<float> img(B * C * S * S), tgt(B * K, 0.0f);  // (B, C, S, S), (B, K)
    for (Index b = 0; b < B; ++b) {
      std::fill(img.begin() + b * S * S, img.begin() + (b + 1) * S * S, float(b));
      for (Index k = 0; k < K; ++k) tgt[b * K + k] = k == b % K ? 0.925f : 0.025f;
    }
    const MixupResult r =
        apply_mixup({0.8, 1.0, 1.0, 0.5}, img.data(), tgt.data(), B, C, S, K, 1, 2, batch);
    ASSERT_GE(r.lam, 0.0);
    ASSERT_LE(r.lam, 1.0);
    for (Index b = 0; b < B; ++b) {
      double s = 0;
      for (Index k = 0; k < K; ++k) s += tgt[b * K + k];
      EXPECT_NEAR(s, 1.0, 1e-5);
    }
    if (r.cutmix) {
      // The pasted box comes from the partner B-1-b; its area fraction is 1 - lam.
      Index from_partner = 0;
      for (Index i = 0; i < S * S; ++i) from_partner += img[i] == float(B - 1);
      EXPECT_NEAR(double(from_partner) / (S * S), 1.0 - r.lam, 1e-9);
    } else {
      EXPECT_NEAR(img[0], r.lam * 0 + (1 - r.lam) * (B - 1), 1e-4);
    }
    mixed += r.cutmix ? 1 : 2;
  }
  EXPECT_GT(mixed, 20);  // both branches occur (cutmix counts 1, mixup 2)
  EXPECT_LT(mixed, 40);
}

TEST(Augment, BetaMean) {
  Rng rng(5);
  double m = 0;
  for (int i = 0; i < 20000; ++i) m += sample_beta(rng, 0.8) / 20000;
  EXPECT_NEAR(m, 0.5, 0.01);
}

// Random erasing's noise (core/erase_plan.h): a table of increasing normal quantiles, and
// values over many keys and indices with a standard normal's mean and tail mass, and the
// spread the construction gives (0.9983, computed in double from the quantiles).
TEST(Augment, EraseNoiseIsStandardNormalShaped) {
  const std::vector<float>& t = vit::erase_noise_table();
  ASSERT_EQ(int(t.size()), vit::kEraseNoiseTable);
  for (size_t j = 1; j < t.size(); ++j) ASSERT_LT(t[j - 1], t[j]) << j;
  EXPECT_FLOAT_EQ(t[t.size() / 2], 0.0f);
  double sum = 0, sum2 = 0;
  int beyond2 = 0;
  const int n = 1 << 20;
  for (int i = 0; i < n; ++i) {
    const double v = vit::erase_noise(t.data(), 0x1234u + uint64_t(i >> 10), uint64_t(i & 1023));
    sum += v;
    sum2 += v * v;
    beyond2 += std::fabs(v) > 2.0;
  }
  const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
  std::printf("erase noise: mean %.5f, sd %.5f, P(|v| > 2) %.5f\n", mean, sd, double(beyond2) / n);
  EXPECT_NEAR(mean, 0.0, 0.005);  // sd of the mean ~0.001
  EXPECT_NEAR(sd, 1.0, 0.005);    // the cut tails take ~0.0005
  EXPECT_NEAR(double(beyond2) / n, 0.0455, 0.002);
}
