// Shared by the engine tests (test_engine.cpp, test_cuda_model.cpp, test_conv_stem.cpp,
// test_fp32_residual.cpp): a random training batch, the engine options they use, and the
// three-update runs that compare two engines.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "train/engine.h"

namespace vit::test {

struct Batch {
  std::vector<float> images, targets;  // (B, Cin, S, S), (B, K)
};

// Normal images; soft targets with 0.9 extra on one random class per sample.
inline Batch random_batch(const ModelConfig& c, Index B, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.images.resize(B * c.in_chans * c.img_size * c.img_size);
  for (auto& x : b.images) x = float(rng.normal());
  b.targets.assign(B * c.num_classes, 0.02f);
  for (Index i = 0; i < B; ++i) b.targets[i * c.num_classes + rng.below(c.num_classes)] += 0.9f;
  return b;
}

// Clipping on, so the clip path runs on every backend.
inline EngineOptions engine_options(const std::string& device, const std::string& precision,
                                    const ModelConfig& c, Index B) {
  EngineOptions o;
  o.device = device;
  o.precision = precision;
  o.cfg = c;
  o.max_batch = B;
  o.adamw.clip_grad = 1.0;
  return o;
}

// The models of the engine comparisons (CUDA vs CPU, CPU fp32 vs fp64).
struct Case {  // a model of the engine comparisons
  const char* name;
  Ffn ffn;
  Classifier cls;
  double drop_path;
  double layer_scale;
  Stem stem = Stem::Patch;
};

inline void PrintTo(const Case& k, std::ostream* os) {
  *os << k.name;
}  // readable test names

inline ModelConfig config_of(const Case& k) {
  ModelConfig c = model_preset("vit_fmnist_tiny");
  c.img_size = 28;  // 7 x 7 patches of 4: N = 49 (+1)
  c.patch_size = 4;
  c.in_chans = 1;
  c.embed_dim = 96;
  c.num_heads = 3;
  c.depth = 3;
  c.num_classes = 10;
  c.ffn = k.ffn;
  c.classifier = k.cls;
  c.drop_path = k.drop_path;
  c.layer_scale_init = k.layer_scale;
  c.stem = k.stem;  // conv: 28 -> 14 -> 7 through 3x3 stride-2 layers of 48 and 96 channels
  c.validate();
  return c;
}

inline const Case kComparisonCases[] = {
    {"mlp_token", Ffn::Mlp, Classifier::Token, 0.0, 0.0},
    {"local_avg", Ffn::Local, Classifier::Avg, 0.0, 0.0},
    {"mlp_droppath_layerscale", Ffn::Mlp, Classifier::Token, 0.2, 0.1},
    {"conv_stem_local_avg", Ffn::Local, Classifier::Avg, 0.0, 0.0, Stem::Conv},
    {"mlp_tanh_token", Ffn::MlpTanh, Classifier::Token, 0.0, 0.0}};  // GELU in the GEMM epilogues

constexpr double kThreeStepsLr = 1e-3;

struct ThreeSteps {
  std::vector<double> losses;
  std::vector<float> logits;  // (B, K) of one inference before training
  std::vector<float> m1;      // first moments after the first update: (1 - beta1) x its gradient
  std::vector<float> params;  // weights after three updates
};

// Logits of one inference, then three AdamW updates of two micro-batches each.
inline ThreeSteps train_three_steps(Engine& e, const std::vector<float>& p0, const ModelConfig& c,
                                    Index B) {
  ThreeSteps r;
  e.write_params(p0);
  const Batch first = random_batch(c, B, 99);
  r.logits.resize(B * c.num_classes);
  std::vector<float> losses(B), v;
  e.infer(first.images.data(), first.targets.data(), B, r.logits.data(), losses.data());
  for (int step = 0; step < 3; ++step) {
    e.zero_grad();
    for (int a = 0; a < 2; ++a) {
      const Batch b = random_batch(c, B, 10 * step + a);
      e.forward_backward(b.images.data(), b.targets.data(), B, 1.0f / float(2 * B), 5 + a);
    }
    e.step(kThreeStepsLr);
    if (step == 0) e.read_moments(r.m1, v);
    const TrainStats ts = e.read_stats();
    EXPECT_EQ(ts.updates, 1);
    r.losses.push_back(ts.last_loss);
  }
  r.params = e.read_params();
  return r;
}

inline double max_abs(const std::vector<float>& a, Index off, Index n) {
  double m = 0;
  for (Index i = off; i < off + n; ++i) m = std::max(m, double(std::fabs(a[i])));
  return m;
}

// Largest |a - b| over [off, off + n) divided by the largest |b| there.
inline double tensor_rel_err(const std::vector<float>& a, const std::vector<float>& b, Index off,
                             Index n) {
  double err = 0, scale = 1e-30;
  for (Index i = off; i < off + n; ++i) {
    EXPECT_TRUE(std::isfinite(a[i])) << "element " << i;
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return err / scale;
}

// Two fp32-accurate runs of train_three_steps (`got` against the reference `ref`), which differ
// only in the order of their sums (~1e-7 relative per op).
//  * Logits and losses: 1e-4 relative.
//  * Gradients of the first update (its first moments): 1e-5 relative per tensor (CPU fp32 vs
//    fp64 measured 9e-7 at most). The key bias is the exception: softmax ignores a constant
//    added to every key of a row, so its gradient is zero in exact arithmetic and what either
//    side holds there is rounding noise (~1e-22 measured): it must be tiny next to the query
//    and value biases' gradients, and nothing more.
//  * Weights after three updates: 2.5e-4 relative per tensor. Adam turns a gradient g into
//    lr g / (|g| + eps), so where |g| is near eps a rounding difference in g becomes a step
//    difference of up to lr: with the default eps = 1e-8, CPU fp32 and fp64 differ by 4e-4 (an
//    fc1 weight whose gradient is 5e-10) and 2e-3 (the key bias). The runs therefore use
//    eps = 1e-6 (kComparisonAdamEps), where CPU fp32 vs fp64 measured 6e-5 at most on the
//    machine the test was written on, and 1.23e-4 (blocks.0.attn.proj.bias, mlp_token) on an
//    AMD EPYC Zen 3 (2026-11-25): the sums' order, and so the rounding of near-cancelling
//    gradients, depends on the CPU the BLAS and -march=native pick kernels for. Hence 2.5e-4
//    (kWeightRelTol); a wrong gradient or update is off by far more (1e-2 and up).
constexpr double kComparisonAdamEps = 1e-6;
constexpr double kWeightRelTol = 2.5e-4;

inline void expect_three_steps_match(const ThreeSteps& got, const ThreeSteps& ref,
                                     const ParamTable& table, const ModelConfig& c) {
  EXPECT_LE(tensor_rel_err(got.logits, ref.logits, 0, Index(ref.logits.size())), 1e-4) << "logits";
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-4 * std::fabs(ref.losses[s])) << "update " << s;
  const Index C = c.embed_dim;
  for (const auto& spec : table.specs) {
    const bool qkv_bias =
        spec.name.size() > 13 && spec.name.compare(spec.name.size() - 13, 13, "attn.qkv.bias") == 0;
    if (!qkv_bias) {
      EXPECT_LE(tensor_rel_err(got.m1, ref.m1, spec.offset, spec.numel()), 1e-5)
          << spec.name << " gradient";
    } else {
      const Index q = spec.offset, k = q + C, v = k + C;
      const double qv_scale = std::max(max_abs(ref.m1, q, C), max_abs(ref.m1, v, C));
      EXPECT_LE(tensor_rel_err(got.m1, ref.m1, q, C), 1e-5) << spec.name << " query gradient";
      EXPECT_LE(tensor_rel_err(got.m1, ref.m1, v, C), 1e-5) << spec.name << " value gradient";
      for (const auto* m : {&got.m1, &ref.m1})
        for (Index i = k; i < v; ++i)
          EXPECT_LE(std::fabs((*m)[i]), 1e-6 * qv_scale) << spec.name << " key gradient " << i - k;
    }
    EXPECT_LE(tensor_rel_err(got.params, ref.params, spec.offset, spec.numel()), kWeightRelTol)
        << spec.name;
  }
}

// The bf16 emulation (or another bf16 engine) against the fp32 CPU engine from the same weights
// p0: three updates on random batches, each update's loss within 1e-2 and grad norm within 3e-2
// relative (bf16 keeps 8 significant bits, so activations carry ~2^-9 relative rounding per op
// and the loss ~1e-3 to 1e-2 after a dozen ops), and the weight updates pointing the same way
// (cosine > 0.95: Adam steps are ~lr per element whatever the gradient's size; rounding noise
// flips only small components).
inline void expect_trains_close_to_fp32(Engine& bf16, Engine& fp32, const std::vector<float>& p0,
                                        const ModelConfig& c, Index B) {
  fp32.write_params(p0);
  bf16.write_params(p0);
  for (int step = 0; step < 3; ++step) {
    const Batch b = random_batch(c, B, 100 + step);
    for (Engine* e : {&fp32, &bf16}) {
      e->zero_grad();
      e->forward_backward(b.images.data(), b.targets.data(), B, 1.0f / B, 3);
      e->step(2e-3);
    }
    const TrainStats a = fp32.read_stats(), e = bf16.read_stats();
    EXPECT_NEAR(e.last_loss, a.last_loss, 1e-2 * std::fabs(a.last_loss)) << "update " << step;
    EXPECT_NEAR(e.grad_norm, a.grad_norm, 3e-2 * a.grad_norm) << "update " << step;
  }
  const std::vector<float> pa = fp32.read_params(), pe = bf16.read_params();
  double dot = 0, na = 0, ne = 0;
  for (size_t i = 0; i < p0.size(); ++i) {
    const double da = pa[i] - p0[i], de = pe[i] - p0[i];
    dot += da * de;
    na += da * da;
    ne += de * de;
  }
  EXPECT_GT(dot / std::sqrt(na * ne), 0.95) << "cosine of the fp32 and bf16 weight updates";
}

}  // namespace vit::test
