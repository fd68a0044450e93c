// EfficientTrain++'s low-frequency pass as matrix products (core/lowfreq_operator.h,
// ops/cpu/lowfreq_batch.h) against the per-image references it replaces on the device path
// (data/lowfreq.h: FFTW's spectral crop, torch's antialiased down-sampling, themselves checked
// against PyTorch in test_lowfreq_torch.cpp): equal to float rounding on random planes, even and
// odd sides, small and ImageNet-sized; a planned ET++ batch (normalise + erase at the final size,
// the pass, then mixup/cutmix) expands as the CPU pipeline makes it; bad sides are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/lowfreq_operator.h"
#include "core/rng.h"
#include "data/augment.h"
#include "data/batch.h"
#include "data/lowfreq.h"
#include "data/planned_batch.h"
#include "data/source.h"
#include "data/source_batch.h"
#include "ops/cpu/lowfreq_batch.h"
#include "ops/cpu/resize_batch.h"
#include "train/planned_input.h"

using namespace vit;

namespace {

// (planes, F, F) values in [-2.5, 2.5): the range of normalised images.
std::vector<float> random_planes(Index planes, Index F, uint64_t seed) {
  std::vector<float> v(size_t(planes * F * F));
  Rng rng(seed);
  for (float& x : v) x = float(rng.uniform() * 5.0 - 2.5);
  return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The batched pass of `kind` from F to S on `planes` planes.
std::vector<float> batched(LowFreqKind kind, const std::vector<float>& in, Index planes, Index F,
                           Index S, bool complex) {
  std::vector<float> scratch(cpu::lowfreq_scratch_floats(planes, F, S, complex));
  std::vector<float> out(size_t(planes * S * S));
  cpu::lowfreq_batch(in.data(), lowfreq_operator(kind, F, S).data(), complex, planes, F, S,
                     scratch.data(), out.data());
  return out;
}

// The per-image reference of `kind`, one plane at a time.
std::vector<float> reference(LowFreqKind kind, const std::vector<float>& in, Index planes, Index F,
                             Index S) {
  std::vector<float> out(size_t(planes * S * S));
  for (Index p = 0; p < planes; ++p) {
    if (kind == LowFreqKind::kFft)
      fft_lowfreq_crop(in.data() + p * F * F, 1, int(F), out.data() + p * S * S, int(S));
    else
      antialias_downsample(in.data() + p * F * F, 1, int(F), out.data() + p * S * S, int(S));
  }
  return out;
}

struct Sides {
  Index F, S;
};

}  // namespace

TEST(LowFreqBatch, SpectralCropMatchesFftw) {
  // 1e-5: FFTW's and the products' float roundings on values of magnitude 2.5 (measured worst
  // 3.6e-6, at 224 -> 160); dropping the imaginary part (the Nyquist terms) is off by 4e-3 to 0.1.
  for (const Sides s : {Sides{32, 16}, Sides{32, 24}, Sides{30, 10}, Sides{16, 2}, Sides{224, 160},
                        Sides{224, 96}}) {
    const Index planes = s.F > 100 ? 3 : 6;
    const std::vector<float> in = random_planes(planes, s.F, uint64_t(s.F * 1000 + s.S));
    const std::vector<float> want = reference(LowFreqKind::kFft, in, planes, s.F, s.S);
    const std::string what = std::to_string(s.F) + " -> " + std::to_string(s.S);
    EXPECT_LT(max_abs_diff(batched(LowFreqKind::kFft, in, planes, s.F, s.S, true), want), 1e-5f)
        << what;
    EXPECT_GT(max_abs_diff(batched(LowFreqKind::kFft, in, planes, s.F, s.S, false), want), 1e-3f)
        << what << ": the imaginary part must matter";
  }
}

TEST(LowFreqBatch, DownsampleMatchesTorchSemantics) {
  // The operator is real (its imaginary half all zero) and equals antialias_downsample, which
  // sums in double: one float rounding of the weights and the sums apart.
  for (const Sides s :
       {Sides{32, 16}, Sides{32, 11}, Sides{31, 7}, Sides{32, 32}, Sides{20, 1}, Sides{224, 96}}) {
    const Index planes = 3;
    const std::vector<float>& op = lowfreq_operator(LowFreqKind::kDownsample, s.F, s.S);
    EXPECT_TRUE(std::all_of(op.begin() + s.S * s.F, op.end(), [](float v) { return v == 0; }));
    const std::vector<float> in = random_planes(planes, s.F, uint64_t(s.F * 100 + s.S));
    const std::vector<float> want = reference(LowFreqKind::kDownsample, in, planes, s.F, s.S);
    EXPECT_LT(max_abs_diff(batched(LowFreqKind::kDownsample, in, planes, s.F, s.S, false), want),
              1e-5f)
        << s.F << " -> " << s.S;
  }
}

TEST(LowFreqBatch, KeepsEachPlanesMean) {
  // The spectral crop keeps each plane's DC term; the down-sampling's weights sum to 1 per
  // output pixel, so a constant plane stays that constant.
  const Index F = 48, S = 20, planes = 4;
  const std::vector<float> in = random_planes(planes, F, 5);
  const std::vector<float> out = batched(LowFreqKind::kFft, in, planes, F, S, true);
  for (Index p = 0; p < planes; ++p) {
    double a = 0, b = 0;
    for (Index i = 0; i < F * F; ++i) a += in[size_t(p * F * F + i)];
    for (Index i = 0; i < S * S; ++i) b += out[size_t(p * S * S + i)];
    EXPECT_NEAR(a / double(F * F), b / double(S * S), 1e-5) << "plane " << p;
  }
  const std::vector<float> flat(size_t(F * F), 0.75f);
  for (const float v : batched(LowFreqKind::kDownsample, flat, 1, F, S, false))
    ASSERT_NEAR(v, 0.75f, 1e-6f);
}

TEST(LowFreqBatch, RefusesSidesItCannotMap) {
  EXPECT_THROW(lowfreq_operator(LowFreqKind::kFft, 32, 15), Error);  // odd spectral side
  EXPECT_THROW(lowfreq_operator(LowFreqKind::kFft, 32, 0), Error);
  EXPECT_THROW(lowfreq_operator(LowFreqKind::kDownsample, 32, 33), Error);  // up-sampling
  EXPECT_THROW(lowfreq_operator(LowFreqKind(7), 32, 16), Error);
  EXPECT_NO_THROW(lowfreq_operator(LowFreqKind::kDownsample, 32, 15));
}

TEST(LowFreqBatch, MixImagesAsTheCpuPipeline) {
  // mix_images (the mix after the pass) is apply_mixup's image half, bit for bit.
  const Index B = 5, C = 3, S = 12, K = 4;
  const data::MixupConfig mix{0.8, 1.0, 1.0, 0.5};
  int drawn = 0;
  for (uint64_t k = 0; k < 10; ++k) {
    const std::vector<float> in = random_planes(B * C, S, 40 + k);
    std::vector<float> want = in, targets(size_t(B * K), 0.25f), got(in.size());
    const data::MixupResult r =
        data::apply_mixup(mix, want.data(), targets.data(), B, C, S, K, 3, 1, k);
    cpu::mix_images(in.data(), r.batch_mix(), B, C, S, got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "batch " << k;
    drawn += r.lam != 1.0;
  }
  EXPECT_GT(drawn, 3);
}

TEST(LowFreqBatch, PlannedEfficientTrainBatchIsTheCpuPipelines) {
  // A planned batch at the final side F with a low-frequency pass to S expands (on the host)
  // to what the CPU pipeline makes: the images at F (RandomResizedCrop, flip, erasing), the
  // per-image reference pass, then mixup.
  const Index B = 5, C = 3, F = 32, K = 4;
  data::ImageDataset set;  // 8 noise images (3, 40, 52), labels i % K
  set.n = 8;
  set.channels = C;
  set.height = 40;
  set.width = 52;
  set.num_classes = int(K);
  set.pixels.resize(size_t(set.n * C * 40 * 52));
  Rng rng(11);
  for (auto& p : set.pixels) p = uint8_t(rng.below(256));
  for (Index i = 0; i < set.n; ++i) set.labels.push_back(int32_t(i % K));
  for (Index k = 0; k < K; ++k) set.class_names.push_back(std::to_string(k));
  const data::MemorySource src(std::move(set));
  data::BatchConfig cfg;
  cfg.img_size = int(F);
  cfg.mean = {0.485f, 0.456f, 0.406f};
  cfg.std = {0.229f, 0.224f, 0.225f};
  cfg.rrc = true;
  cfg.hflip = 0.5;
  cfg.reprob = 0.5;
  const std::vector<float> lut = data::normalize_lut(cfg, C);
  const std::vector<Index> idx = {3, 7, 0, 5, 1};
  const data::MixupConfig mix{0.8, 1.0, 1.0, 0.5};
  for (const LowFreqKind kind : {LowFreqKind::kFft, LowFreqKind::kDownsample})
    for (const Index S : {Index(16), Index(24)}) {
      const std::string what = std::string(kind == LowFreqKind::kFft ? "fft " : "downsample ") +
                               std::to_string(F) + " -> " + std::to_string(S);
      std::vector<float> full(size_t(B * C * F * F)), targets(size_t(B * K)), ptargets(targets);
      std::vector<int32_t> labels(static_cast<size_t>(B)), plabels(labels);
      data::make_source_batch(src, idx.data(), B, cfg, true, 9, 2, full.data(), targets.data(),
                              labels.data());
      std::vector<float> want(size_t(B * C * S * S));
      for (Index b = 0; b < B; ++b) {
        const float* in = full.data() + b * C * F * F;
        float* out = want.data() + b * C * S * S;
        if (kind == LowFreqKind::kFft)
          fft_lowfreq_crop(in, int(C), int(F), out, int(S));
        else
          antialias_downsample(in, int(C), int(F), out, int(S));
      }
      const data::MixupResult r =
          data::apply_mixup(mix, want.data(), targets.data(), B, C, S, K, 7, 1, uint64_t(S));

      data::PlannedBatch plan;
      data::make_planned_batch(src, idx.data(), B, cfg, true, 9, 2, plan, ptargets.data(),
                               plabels.data());
      plan.lowfreq = {kind, int32_t(S)};
      plan.mix = r.batch_mix();
      ASSERT_EQ(plan.out_side(), S);
      std::vector<float> got(want.size());
      expand_on_host(plan, lut, got.data());
      EXPECT_LT(max_abs_diff(got, want), 1e-5f) << what;
      EXPECT_EQ(labels, plabels) << what;
    }
}
