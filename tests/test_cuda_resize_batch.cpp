// The device's input ops (src/ops/cuda/resize_batch.cu, pixel_steps.cu) against the CPU
// reference (src/ops/cpu/resize_batch.cpp, pixel_steps.cpp, themselves checked against
// timm_sample in test_planned_batch.cpp): the same bytes after each pass, the same floats after
// the normalisation, and in bf16 the float rounded once to nearest even. Planned batches of
// random-noise images: RandomResizedCrop with random interpolation and flips, RandAugment and
// colour jitter, ImageNet-sized images at 224 px and small ones at 32 px, evaluation centre
// crops, 1 and 3 channels; and every RandAugment op on its own, both samplings, on noise,
// low-contrast and flat images; EfficientTrain++'s low-frequency pass and the mix after it.
// Guard bytes around every device buffer catch out-of-bounds writes; outputs start as garbage
// so an unwritten pixel fails.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/erase_plan.h"
#include "core/lowfreq_operator.h"
#include "core/rng.h"
#include "cuda_test_util.h"
#include "data/planned_batch.h"
#include "data/randaugment.h"
#include "gpu_test_util.h"
#include "ops/cpu/lowfreq_batch.h"
#include "ops/cpu/pixel_steps.h"
#include "ops/cpu/resize_batch.h"
#include "ops/cuda/ops.h"

namespace {

using vit::Index;
using namespace vit::test;  // cuda_ok, CudaTest, kGuard, kPattern: cuda_test_util.h
namespace data = vit::data;

// A device copy of a host vector of any trivially copyable E, with guard bytes on both sides.
template <typename E>
class RawBuf {
 public:
  RawBuf(size_t n, std::string name) : n_(n), name_(std::move(name)) {
    cuda_ok(cudaMalloc(&base_, n_ * sizeof(E) + 2 * kGuard), "cudaMalloc");
    cuda_ok(cudaMemset(base_, kPattern, n_ * sizeof(E) + 2 * kGuard), "cudaMemset");
  }
  RawBuf(const std::vector<E>& host, std::string name) : RawBuf(host.size(), std::move(name)) {
    cuda_ok(cudaMemcpy(get(), host.data(), n_ * sizeof(E), cudaMemcpyHostToDevice), "upload");
  }
  ~RawBuf() {
    std::vector<unsigned char> g(2 * kGuard);
    auto* b = static_cast<unsigned char*>(base_);
    if (cudaMemcpy(g.data(), b, kGuard, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(g.data() + kGuard, b + kGuard + n_ * sizeof(E), kGuard,
                   cudaMemcpyDeviceToHost) == cudaSuccess) {
      size_t bad = 0;
      for (unsigned char c : g) bad += c != kPattern;
      EXPECT_EQ(bad, 0u) << name_ << ": guard bytes changed (out-of-bounds write)";
    } else {
      ADD_FAILURE() << name_ << ": cannot read guard bytes";
    }
    cudaFree(base_);
  }
  RawBuf(const RawBuf&) = delete;
  RawBuf& operator=(const RawBuf&) = delete;
  E* get() { return reinterpret_cast<E*>(static_cast<unsigned char*>(base_) + kGuard); }
  std::vector<E> download() {
    std::vector<E> h(n_);
    cuda_ok(cudaMemcpy(h.data(), get(), n_ * sizeof(E), cudaMemcpyDeviceToHost), "download");
    return h;
  }

 private:
  void* base_ = nullptr;
  size_t n_;
  std::string name_;
};

std::vector<uint8_t> noise(Index n, uint64_t seed) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  vit::Rng rng(seed);
  for (auto& p : v) p = uint8_t(rng.below(256));
  return v;
}

struct Shape {
  Index h, w;
};

// B samples of random sizes from `shapes`, planned with cfg for the split.
data::PlannedBatch plan(Index C, const data::BatchConfig& cfg, bool train,
                        const std::vector<Shape>& shapes, Index B) {
  data::PlannedBatch batch;
  batch.clear(C, cfg.img_size);
  const auto ra = data::make_rand_augment(cfg, train);
  for (Index b = 0; b < B; ++b) {
    const Shape s = shapes[size_t(b) % shapes.size()];
    const std::vector<uint8_t> img = noise(C * s.h * s.w, 100 + uint64_t(b));  // (C, h, w)
    vit::Rng rng(7 + uint64_t(b));
    data::plan_sample(img.data(), C, s.h, s.w, cfg, ra.get(), train, rng, batch);
  }
  return batch;
}

data::BatchConfig config(Index S, bool train) {
  data::BatchConfig c;
  c.img_size = int(S);
  c.mean = {0.485f, 0.456f, 0.406f};
  c.std = {0.229f, 0.224f, 0.225f};
  if (train) {
    c.rrc = true;
    c.hflip = 0.5;
    c.interpolation = "random";
  } else {
    c.eval_crop_pct = 0.875;
  }
  return c;
}

class CudaResizeBatch : public CudaTest {
 protected:
  // Runs both sides on the batch and compares every stage.
  void check(const data::PlannedBatch& batch, const std::vector<float>& lut,
             const std::string& what) {
    const Index B = batch.size(), C = batch.C, S = batch.S, n = B * C * S * S;
    std::vector<uint8_t> rows(size_t(batch.scratch_bytes)), u8(static_cast<size_t>(n));
    std::vector<float> images(static_cast<size_t>(n));
    vit::cpu::resize_rows(batch.pixels.data(), batch.tables.data(), batch.samples.data(), B, C, S,
                          rows.data());
    vit::cpu::resize_cols(rows.data(), batch.tables.data(), batch.samples.data(), B, C, S,
                          u8.data());
    const std::vector<uint8_t> resized = u8;
    vit::cpu::apply_pixel_steps(u8.data(), batch.steps.data(), batch.step_slots, B, C, S,
                                batch.fill);
    vit::cpu::normalize_u8(u8.data(), lut.data(), vit::erase_noise_table().data(),
                           batch.samples.data(), batch.mix, B, C, S, images.data());

    RawBuf<uint8_t> d_pixels(batch.pixels, what + " pixels");
    RawBuf<int32_t> d_tables(batch.tables, what + " tables");
    RawBuf<vit::ResizeSample> d_samples(batch.samples, what + " samples");
    RawBuf<float> d_lut(lut, what + " lut");
    RawBuf<vit::PixelStep> d_steps(batch.steps, what + " steps");
    RawBuf<float> d_noise(vit::erase_noise_table(), what + " noise");
    RawBuf<uint8_t> d_rows(rows.size(), what + " rows"), d_u8(u8.size(), what + " u8");
    RawBuf<float> d_f32(static_cast<size_t>(n), what + " f32");
    RawBuf<__nv_bfloat16> d_b16(static_cast<size_t>(n), what + " bf16");
    vit::cuda::resize_rows(d_pixels.get(), d_tables.get(), d_samples.get(), B, C, S, d_rows.get());
    vit::cuda::resize_cols(d_rows.get(), d_tables.get(), d_samples.get(), B, C, S, d_u8.get());
    vit::cuda::synchronize();
    EXPECT_TRUE(d_u8.download() == resized) << what << ": vertical pass / flip differs";
    vit::cuda::apply_pixel_steps(d_u8.get(), d_steps.get(), batch.step_slots, B, C, S, batch.fill);
    vit::cuda::normalize_u8(d_u8.get(), d_lut.get(), d_noise.get(), d_samples.get(), batch.mix, B,
                            C, S, d_f32.get());
    vit::cuda::normalize_u8(d_u8.get(), d_lut.get(), d_noise.get(), d_samples.get(), batch.mix, B,
                            C, S, d_b16.get());
    vit::cuda::synchronize();

    EXPECT_TRUE(d_rows.download() == rows) << what << ": horizontal pass differs";
    EXPECT_TRUE(d_u8.download() == u8) << what << ": RandAugment / colour jitter differs";
    const std::vector<float> f32 = d_f32.download();
    EXPECT_EQ(std::memcmp(f32.data(), images.data(), images.size() * sizeof(float)), 0)
        << what << ": normalised fp32 differs";
    const std::vector<__nv_bfloat16> b16 = d_b16.download();
    size_t bad = 0;
    for (size_t i = 0; i < b16.size(); ++i) {
      const __nv_bfloat16 want = __float2bfloat16_rn(images[i]);
      bad += std::memcmp(&b16[i], &want, sizeof(want)) != 0;
    }
    EXPECT_EQ(bad, 0u) << what << ": normalised bf16 differs from the rounded fp32";
  }
};

TEST_F(CudaResizeBatch, TrainImageNetSized) {
  const std::vector<Shape> shapes = {{375, 500}, {500, 333}, {224, 224}, {180, 260}, {640, 427}};
  const data::BatchConfig cfg = config(224, true);
  check(plan(3, cfg, true, shapes, 13), data::normalize_lut(cfg, 3), "train 224");
}

TEST_F(CudaResizeBatch, TrainSmallImagesOneChannel) {
  const std::vector<Shape> shapes = {{28, 28}, {17, 40}, {64, 20}};
  const data::BatchConfig cfg = config(32, true);
  check(plan(1, cfg, true, shapes, 9), data::normalize_lut(cfg, 1), "train 32 C=1");
}

TEST_F(CudaResizeBatch, ErasingMixupAndCutmix) {
  // Random erasing's noise (hash + interpolated quantile), then the batch's mixup (fused
  // multiply-add in fp32) and cutmix (the partner's box), odd batch.
  const std::vector<Shape> shapes = {{375, 500}, {500, 333}, {224, 224}, {180, 260}, {640, 427}};
  data::BatchConfig cfg = config(224, true);
  cfg.reprob = 0.75;
  data::PlannedBatch batch = plan(3, cfg, true, shapes, 17);
  check(batch, data::normalize_lut(cfg, 3), "erasing 224");
  batch.mix.lam = 0.3712f;
  check(batch, data::normalize_lut(cfg, 3), "mixup 224");
  batch.mix = vit::BatchMix{};
  batch.mix.cutmix = 1;
  batch.mix.y0 = 20, batch.mix.y1 = 131, batch.mix.x0 = 0, batch.mix.x1 = 97;
  check(batch, data::normalize_lut(cfg, 3), "cutmix 224");
}

TEST_F(CudaResizeBatch, RandAugmentAndColourJitter) {
  // The planned uint8 ops: timm's DeiT RandAugment with erasing, every op at full probability
  // with uniform magnitudes (three ops: the odd count copies back from the ping-pong buffer),
  // colour jitter (three steps).
  const std::vector<Shape> shapes = {{375, 500}, {500, 333}, {224, 224}, {180, 260}, {640, 427}};
  data::BatchConfig cfg = config(224, true);
  cfg.auto_augment = "rand-m9-mstd0.5-inc1";
  cfg.reprob = 0.25;
  check(plan(3, cfg, true, shapes, 16), data::normalize_lut(cfg, 3), "randaugment 224");
  cfg.auto_augment = "rand-n3-m10-p1.0-mstd101";
  check(plan(3, cfg, true, shapes, 11), data::normalize_lut(cfg, 3), "randaugment n3 224");
  data::BatchConfig small = config(32, true);
  small.auto_augment = "rand-n3-m10-p1.0-mstd101-inc1";
  check(plan(1, small, true, {{28, 28}, {17, 40}}, 24), data::normalize_lut(small, 1),
        "randaugment 32 C=1");
  cfg.auto_augment.clear();
  cfg.color_jitter = 0.4;
  check(plan(3, cfg, true, shapes, 9), data::normalize_lut(cfg, 3), "colour jitter 224");
}

// Each op alone at two levels and both signs, both samplings, on noise (full range),
// low-contrast noise (AutoContrast and Equalize stretch it), a gradient and a flat image
// (Equalize and AutoContrast leave it), 1 and 3 channels, at each side S.
void check_every_randaugment_op(std::initializer_list<Index> sides) {
  const vit::RaOp ops[] = {vit::RaOp::AutoContrast,
                           vit::RaOp::Equalize,
                           vit::RaOp::Invert,
                           vit::RaOp::Rotate,
                           vit::RaOp::Posterize,
                           vit::RaOp::Solarize,
                           vit::RaOp::SolarizeAdd,
                           vit::RaOp::Color,
                           vit::RaOp::Contrast,
                           vit::RaOp::Brightness,
                           vit::RaOp::Sharpness,
                           vit::RaOp::ShearX,
                           vit::RaOp::ShearY,
                           vit::RaOp::TranslateXRel,
                           vit::RaOp::TranslateYRel,
                           vit::RaOp::PosterizeIncreasing,
                           vit::RaOp::SolarizeIncreasing,
                           vit::RaOp::ColorIncreasing,
                           vit::RaOp::ContrastIncreasing,
                           vit::RaOp::BrightnessIncreasing,
                           vit::RaOp::SharpnessIncreasing};
  vit::PixelFill fill;
  fill.v[0] = 124, fill.v[1] = 116, fill.v[2] = 104;
  for (Index C : {Index(3), Index(1)}) {
    for (Index S : sides) {
      std::vector<vit::PixelStep> steps;
      for (vit::RaOp op : ops)
        for (double level : {3.0, 9.0})
          for (int variant = 0; variant < 4; ++variant) {  // sign x sampling
            const vit::PixelStep step = vit::make_pixel_step(
                op, data::ra_level_arg(op, level, variant & 1), (variant & 2) != 0, S, S);
            steps.insert(steps.end(), 4, step);  // on each kind of image (b % 4)
          }
      const Index B = Index(steps.size()), P = S * S;
      std::vector<uint8_t> u8(static_cast<size_t>(B * C * P));  // (B, C, S, S)
      vit::Rng rng(uint64_t(S * C));
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < C * P; ++i) {
          const Index y = (i % P) / S, x = i % S;
          const int kind = int(b % 4);
          u8[size_t(b * C * P + i)] = uint8_t(kind == 0   ? rng.below(256)
                                              : kind == 1 ? 60 + rng.below(81)
                                              : kind == 2 ? (3 * x + 2 * y + 40 * (i / P)) % 256
                                                          : 77);
        }
      std::vector<uint8_t> want = u8;
      vit::cpu::apply_pixel_steps(want.data(), steps.data(), 1, B, C, S, fill);
      RawBuf<vit::PixelStep> d_steps(steps, "steps");
      RawBuf<uint8_t> d_u8(u8, "u8");
      vit::cuda::apply_pixel_steps(d_u8.get(), d_steps.get(), 1, B, C, S, fill);
      vit::cuda::synchronize();
      const std::vector<uint8_t> got = d_u8.download();
      for (Index b = 0; b < B; ++b) {
        size_t bad = 0;
        for (Index i = 0; i < C * P; ++i)
          bad += got[size_t(b * C * P + i)] != want[size_t(b * C * P + i)];
        EXPECT_EQ(bad, 0u) << data::ra_op_name(vit::RaOp(steps[size_t(b)].op)) << " arg "
                           << steps[size_t(b)].arg << " bicubic " << steps[size_t(b)].bicubic
                           << " image kind " << b % 4 << " C=" << C << " S=" << S;
      }
    }
  }
}

// S = 16: fewer pixels than the block's threads (ET++'s smallest stage: idle threads in the
// reductions); 37: odd. Small enough for racecheck (gpu_check.sh's c_racecheck_resize).
TEST_F(CudaResizeBatch, EveryRandAugmentOpSmallSides) {
  check_every_randaugment_op({16, 37});
}

TEST_F(CudaResizeBatch, EveryRandAugmentOpAt224) {
  check_every_randaugment_op({224});
}

TEST_F(CudaResizeBatch, EvalCentreCrop) {
  const std::vector<Shape> shapes = {{375, 500}, {256, 256}, {500, 375}};
  const data::BatchConfig cfg = config(224, false);
  check(plan(3, cfg, false, shapes, 6), data::normalize_lut(cfg, 3), "eval 224");
}

// EfficientTrain++'s low-frequency pass (lowfreq_batch.cu: two fp32 GEMMs, no TF32) against the
// CPU products (equal to float rounding: the summation orders differ), then the mix after it
// (mix_images: fp32 bit for bit, bf16 the fp32 rounded once), on random planes of normalised
// range at ImageNet and small sides, both kinds, one and three channels.
TEST_F(CudaResizeBatch, EfficientTrainLowFrequencyPass) {
  struct Case {
    vit::LowFreqKind kind;
    Index B, C, F, S;
  };
  vit::cuda::reset_gemm_fallback_count();
  const Case cases[] = {{vit::LowFreqKind::kFft, 4, 3, 224, 160},
                        {vit::LowFreqKind::kFft, 3, 3, 224, 96},
                        {vit::LowFreqKind::kFft, 5, 1, 32, 16},
                        {vit::LowFreqKind::kDownsample, 4, 3, 224, 112},
                        {vit::LowFreqKind::kDownsample, 5, 1, 31, 11}};
  for (const Case& k : cases) {
    const bool complex = k.kind == vit::LowFreqKind::kFft;
    const Index planes = k.B * k.C, n_in = planes * k.F * k.F, n_out = planes * k.S * k.S;
    const std::string what = std::string(complex ? "fft " : "downsample ") + std::to_string(k.F) +
                             " -> " + std::to_string(k.S);
    std::vector<float> in(static_cast<size_t>(n_in));
    vit::Rng rng(uint64_t(k.F * 1000 + k.S));
    for (float& v : in) v = float(rng.uniform() * 5.0 - 2.5);
    const std::vector<float>& op = vit::lowfreq_operator(k.kind, k.F, k.S);
    const size_t scratch_n = vit::cpu::lowfreq_scratch_floats(planes, k.F, k.S, complex);
    std::vector<float> scratch(scratch_n), want(static_cast<size_t>(n_out));
    vit::cpu::lowfreq_batch(in.data(), op.data(), complex, planes, k.F, k.S, scratch.data(),
                            want.data());

    RawBuf<float> d_in(in, what + " in"), d_op(op, what + " op");
    RawBuf<float> d_scratch(scratch_n, what + " scratch"), d_out(want.size(), what + " out");
    vit::cuda::lowfreq_batch(d_in.get(), d_op.get(), complex, planes, k.F, k.S, d_scratch.get(),
                             d_out.get());
    vit::cuda::synchronize();
    const std::vector<float> got = d_out.download();
    float worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float d = std::fabs(got[i] - want[i]);
      if (!(d <= worst)) worst = d;  // std::max would keep worst over a NaN
    }
    EXPECT_LT(worst, 1e-5f) << what;  // NaN fails too
    EXPECT_EQ(vit::cuda::gemm_fallback_count(), 0) << what << ": cuBLASLt had no algorithm";

    // The mix after the pass, on the CPU's output: cutmix box and mixup.
    for (int mode = 0; mode < 2; ++mode) {
      vit::BatchMix mix;
      if (mode == 0) {
        mix.cutmix = 1;
        mix.y0 = 1, mix.y1 = k.S / 2 + 1, mix.x0 = 0, mix.x1 = k.S / 3 + 1;
      } else {
        mix.lam = 0.3712f;
      }
      std::vector<float> mixed(want.size());
      vit::cpu::mix_images(want.data(), mix, k.B, k.C, k.S, mixed.data());
      RawBuf<float> d_low(want, what + " low");
      RawBuf<float> d_f32(want.size(), what + " mixed f32");
      RawBuf<__nv_bfloat16> d_b16(want.size(), what + " mixed bf16");
      vit::cuda::mix_images(d_low.get(), mix, k.B, k.C, k.S, d_f32.get());
      vit::cuda::mix_images(d_low.get(), mix, k.B, k.C, k.S, d_b16.get());
      vit::cuda::synchronize();
      const std::vector<float> f32 = d_f32.download();
      EXPECT_EQ(std::memcmp(f32.data(), mixed.data(), mixed.size() * sizeof(float)), 0)
          << what << " mode " << mode << ": mixed fp32 differs";
      const std::vector<__nv_bfloat16> b16 = d_b16.download();
      size_t bad = 0;
      for (size_t i = 0; i < b16.size(); ++i) {
        const __nv_bfloat16 r = __float2bfloat16_rn(mixed[i]);
        bad += std::memcmp(&b16[i], &r, sizeof(r)) != 0;
      }
      EXPECT_EQ(bad, 0u) << what << " mode " << mode << ": mixed bf16 differs";
    }
  }
}

}  // namespace
