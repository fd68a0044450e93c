// The whole model on the GPU against the host: CUDA fp32 against the CPU fp32 reference, and
// CUDA bf16 against the CPU bf16 emulation, which rounds at the same points. Label `gpu`; skips
// without a device (fails under VIT_REQUIRE_GPU=1).
//
// Tolerances:
//  * fp32: the two sides differ only in the order of fp32 sums (cuBLASLt vs OpenBLAS, block vs
//    sequential reductions): ~1e-6 relative per op; after a dozen layers and three AdamW updates
//    1e-4 relative (per tensor, against the tensor's largest value) leaves a wide margin and
//    still catches any real indexing or layout error (those are O(1)).
//  * bf16 vs emulation: both round to bf16 at the same points, so they differ only where an
//    fp32 summation-order difference moves a value across a bf16 rounding boundary: one bf16
//    ulp (2^-8 relative) on a few elements, which the next ops average. Logits: 4 ulps of the
//    largest logit (1.6e-2). Losses: 2e-3 relative. Weights after three updates: Adam moves
//    each weight by ~lr whatever its gradient, so an ulp flip on a near-zero gradient can flip
//    that weight's step; the updates must still agree in direction (cosine >= 0.99 per run),
//    and no weight may differ by more than two opposite Adam steps per update: a bias-corrected
//    Adam step is at most lr * (1 - beta1) / sqrt(1 - beta2) ~ 3.2 lr, so 3 * 2 * 3.2 * lr.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine_test_util.h"
#include "gpu_test_util.h"
#include "train/engine.h"
#include "train/engine_cuda.h"

namespace {

using vit::Index;

struct Case {
  const char* name;
  vit::Ffn ffn;
  vit::Classifier cls;
  double drop_path;
  double layer_scale;
  vit::Stem stem = vit::Stem::Patch;
};

vit::ModelConfig config_of(const Case& k) {
  vit::ModelConfig c = vit::model_preset("vit_fmnist_tiny");
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

using vit::test::Batch;

Batch batch_of(const vit::ModelConfig& c, Index B, uint64_t seed) {
  return vit::test::random_batch(c, B, seed);
}

std::unique_ptr<vit::Engine> engine_on(const std::string& device, const std::string& precision,
                                       const vit::ModelConfig& c, Index B) {
  return vit::make_engine(vit::test::engine_options(device, precision, c, B));
}

// Largest |a - b| over the tensor divided by the tensor's largest |b|.
double tensor_rel_err(const std::vector<float>& a, const std::vector<float>& b, Index off,
                      Index n) {
  double err = 0, scale = 1e-30;
  for (Index i = off; i < off + n; ++i) {
    EXPECT_TRUE(std::isfinite(a[i])) << "element " << i;
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return err / scale;
}

constexpr double kLr = 1e-3;

struct ThreeSteps {
  std::vector<double> losses;
  std::vector<float> logits, params;  // logits of the first forward, weights after 3 updates
};

// Logits of one inference, then three AdamW updates of two micro-batches each.
ThreeSteps train_three_steps(vit::Engine& e, const std::vector<float>& p0,
                             const vit::ModelConfig& c, Index B) {
  ThreeSteps r;
  e.write_params(p0);
  const Batch first = batch_of(c, B, 99);
  r.logits.resize(B * c.num_classes);
  std::vector<float> losses(B);
  e.infer(first.images.data(), first.targets.data(), B, r.logits.data(), losses.data());
  for (int step = 0; step < 3; ++step) {
    e.zero_grad();
    for (int a = 0; a < 2; ++a) {
      const Batch b = batch_of(c, B, 10 * step + a);
      e.forward_backward(b.images.data(), b.targets.data(), B, 1.0f / float(2 * B), 5 + a);
    }
    e.step(kLr);
    const vit::TrainStats ts = e.read_stats();
    EXPECT_EQ(ts.updates, 1);
    r.losses.push_back(ts.last_loss);
  }
  r.params = e.read_params();
  return r;
}

class CudaModel : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    vit::register_cuda_backend();
    VIT_GPU_TEST_PRECONDITION();
  }
};

TEST_P(CudaModel, Fp32MatchesTheCpuReference) {
  const vit::ModelConfig c = config_of(GetParam());
  const Index B = 5;  // odd on purpose
  auto cpu = engine_on("cpu", "fp32", c, B);
  auto gpu = engine_on("cuda", "fp32", c, B);
  std::vector<float> p0(size_t(cpu->table().total), 0.0f);
  vit::init_params(p0.data(), cpu->table(), c, 3);
  const ThreeSteps a = train_three_steps(*cpu, p0, c, B), g = train_three_steps(*gpu, p0, c, B);
  EXPECT_LE(tensor_rel_err(g.logits, a.logits, 0, Index(a.logits.size())), 1e-4) << "logits";
  for (int s = 0; s < 3; ++s)
    EXPECT_NEAR(g.losses[s], a.losses[s], 1e-4 * std::fabs(a.losses[s])) << "update " << s;
  for (const auto& spec : cpu->table().specs)
    EXPECT_LE(tensor_rel_err(g.params, a.params, spec.offset, spec.numel()), 1e-4) << spec.name;
}

TEST_P(CudaModel, Bf16MatchesTheEmulation) {
  const vit::ModelConfig c = config_of(GetParam());
  const Index B = 5;
  auto emu = engine_on("emu", "bf16", c, B);
  auto gpu = engine_on("cuda", "bf16", c, B);
  std::vector<float> p0(size_t(emu->table().total), 0.0f);
  vit::init_params(p0.data(), emu->table(), c, 3);
  const ThreeSteps a = train_three_steps(*emu, p0, c, B), g = train_three_steps(*gpu, p0, c, B);
  EXPECT_LE(tensor_rel_err(g.logits, a.logits, 0, Index(a.logits.size())), 1.6e-2) << "logits";
  for (int s = 0; s < 3; ++s)
    EXPECT_NEAR(g.losses[s], a.losses[s], 2e-3 * std::fabs(a.losses[s])) << "update " << s;
  double dot = 0, na = 0, ng = 0, worst = 0;
  for (size_t i = 0; i < p0.size(); ++i) {
    const double da = a.params[i] - p0[i], dg = g.params[i] - p0[i];
    dot += da * dg;
    na += da * da;
    ng += dg * dg;
    worst = std::max(worst, std::fabs(da - dg));
  }
  EXPECT_GE(dot / std::sqrt(na * ng), 0.99) << "direction of the weight updates";
  EXPECT_LE(worst, 3 * 2 * 3.2 * kLr) << "largest weight difference after three updates";
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaModel,
    ::testing::Values(Case{"mlp_token", vit::Ffn::Mlp, vit::Classifier::Token, 0.0, 0.0},
                      Case{"local_avg", vit::Ffn::Local, vit::Classifier::Avg, 0.0, 0.0},
                      Case{"mlp_droppath_layerscale", vit::Ffn::Mlp, vit::Classifier::Token, 0.2,
                           0.1},
                      Case{"conv_stem_local_avg", vit::Ffn::Local, vit::Classifier::Avg, 0.0, 0.0,
                           vit::Stem::Conv}),
    [](const auto& info) { return std::string(info.param.name); });

// A ViT-S/16-shaped model (two blocks) trains on the device: finite losses and grad norms, and
// the engine reports its device memory.
TEST(CudaEngine, BenchShapeStepRunsAndReportsMemory) {
  vit::register_cuda_backend();
  VIT_GPU_TEST_PRECONDITION();
  vit::ModelConfig c = vit::model_preset("vit_small_patch16_224");
  c.depth = 2;
  const Index B = 16;
  auto gpu = engine_on("cuda", "bf16", c, B);
  EXPECT_GT(gpu->device_memory_bytes(), 0.0);
  EXPECT_NE(gpu->description().find("cuda bf16"), std::string::npos) << gpu->description();
  std::vector<float> p0(size_t(gpu->table().total), 0.0f);
  vit::init_params(p0.data(), gpu->table(), c, 1);
  gpu->write_params(p0);
  const Batch b = batch_of(c, B, 4);
  for (int i = 0; i < 3; ++i) {
    gpu->zero_grad();
    gpu->forward_backward(b.images.data(), b.targets.data(), B, 1.0f / B, 0);
    gpu->step(1e-3);
  }
  const vit::TrainStats ts = gpu->read_stats();
  EXPECT_EQ(ts.updates, 3);
  EXPECT_TRUE(std::isfinite(ts.loss_sum) && std::isfinite(ts.grad_norm));
  EXPECT_LT(ts.last_loss, ts.loss_sum / 3 + 1.0);  // trains on one batch: the loss does not blow up
}

}  // namespace
