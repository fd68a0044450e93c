// The engine's device-side planned input (src/train/planned_input.h: DevicePlannedInput) against
// its host twin expand_on_host on the same plans. test_cuda_resize_batch.cpp checks the input ops
// one by one on buffers of its own; this checks what the engine wires around them: the six-array
// pinned upload (upload_input_n), the two input slots used in turn with input_released after
// each batch and no host wait in between (so only the input path's events order the side
// stream's copies against the op stream's reads), the growth of the per-slot and shared device
// buffers (fit), the targets landing in the engine's buffer (or not, without targets), and the
// re-upload of EfficientTrain++'s operator when the training side or kind changes.
// fp32 engines must give the host's floats bit for bit, bf16 engines the host's floats rounded
// once to nearest even; a batch with a low-frequency pass (fp32 GEMMs, other summation order)
// is equal to 1e-5. Outputs start as 0x7f garbage with guard bytes on both sides (DevBuf).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda.h"
#include "core/batch_mix.h"
#include "core/lowfreq_operator.h"
#include "core/rng.h"
#include "cuda_test_util.h"
#include "data/planned_batch.h"
#include "data/randaugment.h"
#include "gpu_test_util.h"
#include "ops/cuda/ops.h"
#include "train/planned_input.h"

namespace {

using vit::Index;
using namespace vit::test;  // CudaTest, DevBuf, from_float, expect_same_bits: cuda_test_util.h
namespace data = vit::data;

constexpr Index K = 10;  // classes: targets (B, K)

struct Shape {
  Index h, w;
};

// One engine batch: the plan, its lookup table (C, 256) and its targets (B, K) (empty: the
// engine was given none, so nothing may be written to its targets buffer).
struct Batch {
  std::string what;
  data::PlannedBatch plan;
  std::vector<float> lut;
  std::vector<float> targets;
};

data::BatchConfig train_config(Index S) {
  data::BatchConfig c;
  c.img_size = int(S);
  c.mean = {0.485f, 0.456f, 0.406f};
  c.std = {0.229f, 0.224f, 0.225f};
  c.rrc = true;
  c.hflip = 0.5;
  c.interpolation = "random";
  return c;
}

// B noise images of the sizes in `shapes` (in turn), planned with cfg; seed varies the images
// and the draws, so consecutive batches differ.
Batch make_batch(std::string what, Index C, const data::BatchConfig& cfg, bool train,
                 const std::vector<Shape>& shapes, Index B, uint64_t seed, bool targets = true) {
  Batch batch;
  batch.what = std::move(what);
  batch.plan.clear(C, cfg.img_size);
  const auto ra = data::make_rand_augment(cfg, train);
  for (Index b = 0; b < B; ++b) {
    const Shape s = shapes[size_t(b) % shapes.size()];
    std::vector<uint8_t> img(size_t(C * s.h * s.w));  // (C, h, w)
    vit::Rng px(seed * 1000 + uint64_t(b));
    for (auto& p : img) p = uint8_t(px.below(256));
    vit::Rng rng(seed * 7919 + uint64_t(b));
    data::plan_sample(img.data(), C, s.h, s.w, cfg, ra.get(), train, rng, batch.plan);
  }
  batch.lut = data::normalize_lut(cfg, C);
  if (targets) {
    batch.targets.resize(size_t(B * K));  // (B, K)
    vit::Rng rng(seed + 17);
    for (float& t : batch.targets) t = float(rng.uniform());
  }
  return batch;
}

vit::BatchMix mixup(float lam) {
  vit::BatchMix m;
  m.lam = lam;
  return m;
}
vit::BatchMix cutmix(int32_t y0, int32_t y1, int32_t x0, int32_t x1) {
  vit::BatchMix m;
  m.cutmix = 1;
  m.y0 = y0, m.y1 = y1, m.x0 = x0, m.x1 = x1;
  return m;
}

// Feeds the batches, `rounds` times over, through one DevicePlannedInput as the engine does
// (upload_planned / release_batch): batch i through slot i % 2, input_released after it, no host
// wait until all are queued. By the third round (the first's slot order again) every buffer is
// big enough, so fit() never synchronises: only the events order the copies against the reads.
// Then compares every batch's images and targets with the host's.
template <class T>
void expand_and_compare(const std::vector<Batch>& batches, int rounds) {
  using Backend = vit::CudaBackend<T>;
  const bool bf16 = !std::is_same_v<T, float>;
  const size_t n = batches.size() * size_t(rounds);
  auto image_count = [](const data::PlannedBatch& p) {
    return size_t(p.size() * p.C * p.out_side() * p.out_side());
  };
  auto label = [&](size_t i) {
    return batches[i % batches.size()].what + " (round " + std::to_string(i / batches.size() + 1) +
           ", slot " + std::to_string(i % 2) + (bf16 ? ", bf16)" : ", fp32)");
  };
  // Every output allocated first: a cudaMalloc between batches would add a host wait.
  std::vector<std::unique_ptr<DevBuf<T>>> images(n);              // each (B, C, S', S')
  std::vector<std::unique_ptr<DevBuf<float>>> device_targets(n);  // each (B, K)
  for (size_t i = 0; i < n; ++i) {
    const data::PlannedBatch& p = batches[i % batches.size()].plan;
    images[i] = std::make_unique<DevBuf<T>>(image_count(p), label(i) + " images");
    device_targets[i] =
        std::make_unique<DevBuf<float>>(size_t(p.size() * K), label(i) + " targets");
  }
  vit::cuda::synchronize();

  vit::cuda::reset_gemm_fallback_count();
  vit::DevicePlannedInput<Backend> input;
  for (size_t i = 0; i < n; ++i) {
    const Batch& b = batches[i % batches.size()];
    const int slot = int(i % 2);
    input.expand(b.plan, b.lut, b.targets.empty() ? nullptr : b.targets.data(),
                 device_targets[i]->get(), b.plan.size() * K, slot, images[i]->get());
    Backend::input_released(slot);  // the model is done with the batch
  }
  vit::cuda::synchronize();
  EXPECT_EQ(vit::cuda::gemm_fallback_count(), 0) << "cuBLASLt had no algorithm";

  for (size_t i = 0; i < n; ++i) {
    const Batch& b = batches[i % batches.size()];
    const std::string what = label(i);
    std::vector<float> want(image_count(b.plan));  // (B, C, S', S')
    vit::expand_on_host(b.plan, b.lut, want.data());
    const Vec got = images[i]->download();
    if (!b.plan.lowfreq.active()) {
      if (bf16)
        for (float& w : want) w = to_float(from_float<T>(w));  // rounded once
      expect_same_bits(what + ": images", got, want);
    } else {
      // The GEMMs' summation order differs from the CPU's: 1e-5; in bf16 plus half an ulp of
      // the rounding (<= 2^-8 relative) and the 1e-5 that may move it.
      size_t bad = 0, first = 0;
      for (size_t j = 0; j < got.size(); ++j) {
        const double lim = bf16 ? 2e-5 + std::ldexp(std::fabs(double(want[j])), -8) : 1e-5;
        if (!(std::fabs(double(got[j]) - double(want[j])) <= lim) && bad++ == 0) first = j;
      }
      EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                         << " images' values beyond tolerance; first [" << first << "] "
                         << got[first] << " vs " << want[first];
    }
    const Vec t = device_targets[i]->download();
    if (b.targets.empty()) {
      Vec untouched(t.size());
      std::memset(untouched.data(), kPattern, untouched.size() * sizeof(float));
      expect_same_bits(what + ": targets written without targets", t, untouched);
    } else {
      expect_same_bits(what + ": targets", t, b.targets);
    }
  }
}

const std::vector<Shape> kSmall = {{40, 52}, {70, 60}, {33, 90}};
const std::vector<Shape> kLarge = {{375, 500}, {500, 333}, {300, 280}, {640, 427}};

// Plain batches: an eval batch (no uint8 ops: slot 0's step buffer stays unallocated), then
// train batches whose crops, sample counts and sides grow (fit reallocates per-slot and shared
// buffers), one at a larger training side with another mean/std (the lookup table is per slot),
// then a smaller one again without targets (the grown buffers are reused, only partly).
std::vector<Batch> plain_batches() {
  std::vector<Batch> v;
  data::BatchConfig eval;
  eval.img_size = 64;
  eval.mean = {0.485f, 0.456f, 0.406f};
  eval.std = {0.229f, 0.224f, 0.225f};
  eval.eval_crop_pct = 0.875;
  v.push_back(make_batch("eval 64 centre crop", 3, eval, false, {{80, 100}, {64, 64}}, 3, 1));

  data::BatchConfig ra = train_config(64);
  ra.auto_augment = "rand-m9-mstd0.5-inc1";
  ra.reprob = 0.5;
  v.push_back(
      make_batch("train 64 small crops, RandAugment, erasing, mixup", 3, ra, true, kSmall, 4, 2));
  v.back().plan.mix = mixup(0.3712f);

  ra.auto_augment = "rand-n3-m10-p1.0-mstd101";
  ra.reprob = 0.25;
  v.push_back(make_batch("train 64 large crops, 9 samples, RandAugment n3, cutmix", 3, ra, true,
                         kLarge, 9, 3));
  v.back().plan.mix = cutmix(5, 41, 0, 29);

  data::BatchConfig jitter = train_config(96);
  jitter.mean = {0.5f, 0.5f, 0.5f};
  jitter.std = {0.5f, 0.5f, 0.5f};
  jitter.color_jitter = 0.4;
  jitter.reprob = 0.5;
  v.push_back(make_batch("train 96 (new side), colour jitter, other mean/std", 3, jitter, true,
                         kLarge, 7, 4));

  data::BatchConfig small = train_config(48);
  small.auto_augment = "rand-m9-mstd0.5-inc1";
  v.push_back(make_batch("train 48 (smaller again), no targets", 3, small, true, kSmall, 5, 5,
                         /*targets=*/false));
  v.back().plan.mix = mixup(0.81f);
  return v;
}

// EfficientTrain++ batches: made at the final side F, mapped to the training side. The operator
// is uploaded on the first, reused on the second (other slot), re-uploaded for a new training
// side, a new kind and a new final side (op_ reallocated), and again for the first's sizes
// (into the larger buffer); a plain batch between them takes the other path on the same
// instance.
std::vector<Batch> lowfreq_batches() {
  std::vector<Batch> v;
  auto add = [&](std::string what, Index F, vit::LowFreqKind kind, int32_t side,
                 const std::vector<Shape>& shapes, Index B, uint64_t seed, vit::BatchMix mix) {
    data::BatchConfig cfg = train_config(F);
    cfg.auto_augment = "rand-m9-mstd0.5-inc1";
    cfg.reprob = 0.5;
    v.push_back(make_batch(std::move(what), 3, cfg, true, shapes, B, seed));
    if (side) v.back().plan.lowfreq = {kind, side};
    v.back().plan.mix = mix;
  };
  using vit::LowFreqKind;
  add("fft 64 -> 32, mixup", 64, LowFreqKind::kFft, 32, kSmall, 4, 11, mixup(0.3712f));
  add("fft 64 -> 32 again, cutmix", 64, LowFreqKind::kFft, 32, kLarge, 4, 12, cutmix(1, 17, 0, 11));
  add("fft 64 -> 48 (new training side)", 64, LowFreqKind::kFft, 48, kLarge, 5, 13, {});
  add("downsample 64 -> 40 (new kind)", 64, LowFreqKind::kDownsample, 40, kSmall, 3, 14,
      mixup(0.6f));
  add("plain 64 between them", 64, LowFreqKind::kFft, 0, kSmall, 4, 15, cutmix(10, 30, 20, 50));
  add("fft 96 -> 48 (new final side, larger operator)", 96, LowFreqKind::kFft, 48, kLarge, 6, 16,
      mixup(0.45f));
  add("fft 64 -> 32 (back into the larger operator buffer)", 64, LowFreqKind::kFft, 32, kSmall, 5,
      17, cutmix(0, 32, 3, 9));
  return v;
}

class CudaPlannedInput : public CudaTest {};

TEST_F(CudaPlannedInput, Fp32IsTheHostExpansionBitForBit) {
  expand_and_compare<float>(plain_batches(), 3);
}

TEST_F(CudaPlannedInput, Bf16IsTheHostExpansionRoundedOnce) {
  expand_and_compare<__nv_bfloat16>(plain_batches(), 2);
}

TEST_F(CudaPlannedInput, EfficientTrainBatchesReuploadTheOperator) {
  const std::vector<Batch> batches = lowfreq_batches();
  expand_and_compare<float>(batches, 2);
  expand_and_compare<__nv_bfloat16>(batches, 1);
}

}  // namespace
