// The whole model on the GPU against the host: CUDA fp32 against the CPU fp32 reference, and
// CUDA bf16 against the CPU bf16 emulation, which rounds at the same points. Label `gpu`; skips
// without a device (fails under VIT_REQUIRE_GPU=1).
//
// Tolerances:
//  * fp32: the two sides differ only in the order of fp32 sums (cuBLASLt vs OpenBLAS, block vs
//    sequential reductions), as CPU fp32 and fp64 do: vit::test::expect_three_steps_match, whose
//    tolerances (logits and losses 1e-4, weights 2.5e-4, first gradients 1e-5 relative per tensor)
//    are derived there and met by CPU fp32 against fp64 (Engine.Fp32MatchesFp64...), and still
//    catch any real indexing or layout error (those are O(1)).
//  * bf16 vs emulation (fused attention, and again unfused): both round to bf16 at the same points,
//  so they differ only where an
//    fp32 summation-order difference moves a value across a bf16 rounding boundary: one bf16
//    ulp (2^-8 relative) on a few elements, which the next ops average. Logits: 4 ulps of the
//    largest logit (1.6e-2). Losses: 2e-3 relative. Weights after three updates: Adam moves
//    each weight by ~lr whatever its gradient, so an ulp flip on a near-zero gradient can flip
//    that weight's step; the updates must still agree in direction (cosine >= 0.99 per run),
//    and no weight may differ by more than two opposite Adam steps per update: a bias-corrected
//    Adam step is at most lr * (1 - beta1) / sqrt(1 - beta2) ~ 3.2 lr, so 3 * 2 * 3.2 * lr.
//    The mlp_tanh case adds cuBLASLt's own tanh in the GELU epilogues against the emulation's
//    (CublasLtEpilogue.MatmulGeluTanhMatchesTheEmulation: within one ulp, some elements): the
//    same kind of noise, through the same averaging fc2 applies.
//  * bf16 with --fp32-residual vs its emulation (EmuBackendFp32Residual): the same tolerances;
//    the fp32 residual stream only removes rounding points from both sides.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "backend/cuda.h"
#include "cuda_test_util.h"
#include "engine_test_util.h"
#include "gpu_test_util.h"
#include "residual_share_util.h"
#include "train/engine.h"
#include "ops/kernel_options.h"
#include "train/engine_cuda.h"

namespace {

using vit::Index;

using vit::test::Case;
using vit::test::config_of;

using vit::test::Batch;

Batch batch_of(const vit::ModelConfig& c, Index B, uint64_t seed) {
  return vit::test::random_batch(c, B, seed);
}

std::unique_ptr<vit::Engine> engine_on(const std::string& device, const std::string& precision,
                                       const vit::ModelConfig& c, Index B) {
  return vit::make_engine(vit::test::engine_options(device, precision, c, B));
}

using vit::test::kThreeStepsLr;
using vit::test::ThreeSteps;
using vit::test::train_three_steps;

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
  vit::EngineOptions o = vit::test::engine_options("cpu", "fp32", c, B);
  o.adamw.eps = vit::test::kComparisonAdamEps;  // why: expect_three_steps_match
  auto cpu = vit::make_engine(o);
  o.device = "cuda";
  auto gpu = vit::make_engine(o);
  std::vector<float> p0(size_t(cpu->table().total), 0.0f);
  vit::init_params(p0.data(), cpu->table(), c, 3);
  const ThreeSteps a = train_three_steps(*cpu, p0, c, B), g = train_three_steps(*gpu, p0, c, B);
  vit::test::expect_three_steps_match(g, a, cpu->table(), c);
}

// Both engines make the same fused/unfused attention choice (their kernel plans: these models
// have D = 32, so fused unless the options say attention=unfused). fp32_residual: both keep the
// residual stream in fp32 (--fp32-residual).
void expect_bf16_matches_emulation(const vit::ModelConfig& c, bool fp32_residual = false,
                                   const char* kernels = "") {
  const Index B = 5;
  vit::EngineOptions o = vit::test::engine_options("emu", "bf16", c, B);
  o.fp32_residual = fp32_residual;
  o.kernels = vit::parse_kernel_options(kernels);
  auto emu = vit::make_engine(o);
  o.device = "cuda";
  auto gpu = vit::make_engine(o);
  if (fp32_residual) {  // the backends that keep the stream in fp32, not the plain bf16 ones
    EXPECT_NE(emu->description().find("fp32 residual"), std::string::npos) << emu->description();
    EXPECT_NE(gpu->description().find("fp32 residual"), std::string::npos) << gpu->description();
  }
  std::vector<float> p0(size_t(emu->table().total), 0.0f);
  vit::init_params(p0.data(), emu->table(), c, 3);
  const ThreeSteps a = train_three_steps(*emu, p0, c, B), g = train_three_steps(*gpu, p0, c, B);
  EXPECT_LE(vit::test::tensor_rel_err(g.logits, a.logits, 0, Index(a.logits.size())), 1.6e-2)
      << "logits";
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
  EXPECT_LE(worst, 3 * 2 * 3.2 * kThreeStepsLr) << "largest weight difference after three updates";
}

TEST_P(CudaModel, Bf16MatchesTheEmulation) {
  expect_bf16_matches_emulation(config_of(GetParam()));
}

TEST_P(CudaModel, Bf16MatchesTheEmulationUnfusedAttention) {
  expect_bf16_matches_emulation(config_of(GetParam()), false, "attention=unfused");
}

TEST_P(CudaModel, Bf16Fp32ResidualMatchesTheEmulation) {
  expect_bf16_matches_emulation(config_of(GetParam()), true);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModel, ::testing::ValuesIn(vit::test::kComparisonCases),
                         [](const auto& info) { return std::string(info.param.name); });

// A ViT-S/16-shaped model (two blocks) trains on the device: finite losses and grad norms, and
// the engine reports its device memory.
// What --fp32-residual is for, on the device (as Fp32ResidualModel.KeepsTheBlocksShareOfThe
// StreamGradient on the emulation): with layer scale 1e-4 the CUDA bf16 stream drops the blocks'
// share of d(pos_embed) (below half a bf16 spacing of dres), the fp32 stream keeps it within
// the bf16 rounding of the branches (1.2% on the emulation). The tolerances above would also
// pass kernels that ignored the fp32 stream; this would not.
TEST(CudaFp32Residual, KeepsTheBlocksShareOfTheStreamGradient) {
  vit::register_cuda_backend();
  VIT_GPU_TEST_PRECONDITION();
  const vit::ModelConfig c = vit::test::layer_scale_config(1e-4);
  const Index B = 4;
  const vit::ParamTable table = vit::build_param_table(c);
  std::vector<float> p0(size_t(table.total));
  vit::init_params(p0.data(), table, c, 7);
  const Batch batch = batch_of(c, B, 3);
  using vit::test::blocks_share_of_dpos;
  const auto ref = blocks_share_of_dpos<vit::CpuBackend<float>>(c, p0, batch, B);
  const auto g16 = blocks_share_of_dpos<vit::CudaBackend<vit::cuda::bf16>>(c, p0, batch, B);
  const auto g32 = blocks_share_of_dpos<vit::CudaBackend<vit::cuda::bf16, float>>(c, p0, batch, B);
  const double d16 = vit::test::relative_distance(g16, ref);
  const double d32 = vit::test::relative_distance(g32, ref);
  EXPECT_LT(d32, 0.05) << "fp32 stream; bf16 stream: " << d16;
  EXPECT_GT(d16, 0.5) << "bf16 stream; fp32 stream: " << d32;
}

// --cuda-graph: a replayed pass runs the eager pass's kernels with the same arguments on the
// same buffers, so training gives the same bits. Six updates of two micro-batches (the two
// input slots: two graphs), stochastic depth drawn per pass where the model has it (its
// scales are uploaded outside the graph), and a partial batch in the fifth update (a key of
// its own: eager, once). The counts check that the graphs ran: captured at each key's second
// pass, replayed after.
void expect_graphs_replay_the_eager_pass(const vit::ModelConfig& c, const std::string& precision,
                                         const char* kernels = "") {
  const Index B = 8;
  vit::EngineOptions o = vit::test::engine_options("cuda", precision, c, B);
  o.kernels = vit::parse_kernel_options(kernels);
  auto eager = vit::make_engine(o);
  o.cuda_graph = true;
  auto graphed = vit::make_engine(o);
  EXPECT_NE(graphed->description().find("CUDA graphs"), std::string::npos);
  std::vector<float> p0(size_t(eager->table().total));
  vit::init_params(p0.data(), eager->table(), c, 3);
  const Batch batches[2] = {batch_of(c, B, 1), batch_of(c, B, 2)};
  std::vector<double> losses[2];
  for (int run = 0; run < 2; ++run) {
    vit::Engine& e = run == 0 ? *eager : *graphed;
    e.write_params(p0);
    for (int step = 0; step < 6; ++step) {
      e.zero_grad();
      for (int a = 0; a < 2; ++a) {
        const Index b = step == 4 && a == 1 ? 5 : B;
        e.forward_backward(batches[a].images.data(), batches[a].targets.data(), b,
                           1.0f / float(2 * B), uint64_t(10 * step + a));
      }
      e.step(1e-3);
      const vit::TrainStats ts = e.read_stats();
      losses[run].push_back(ts.last_loss);
      losses[run].push_back(ts.grad_norm);
    }
  }
  EXPECT_EQ(losses[0], losses[1]) << "update losses and grad norms";
  vit::test::expect_same_bits("weights", graphed->read_params(), eager->read_params());
  std::vector<float> m[2], v[2];
  eager->read_moments(m[0], v[0]);
  graphed->read_moments(m[1], v[1]);
  vit::test::expect_same_bits("first moments", m[1], m[0]);
  vit::test::expect_same_bits("second moments", v[1], v[0]);
  const vit::GraphStats gs = graphed->graph_stats();
  EXPECT_TRUE(gs.on) << gs.off_reason;
  EXPECT_EQ(gs.captures, 2);
  EXPECT_EQ(gs.replays, 7);  // updates 3-6: 8 passes, less the partial batch's eager one
  EXPECT_EQ(eager->graph_stats().captures, 0);
}

// Every comparison model (locality FFN, pooled classifier, conv stem, drop path), bf16 with the
// fused attention and with the unfused one.
TEST_P(CudaModel, Bf16GraphsReplayTheEagerPassBitwise) {
  expect_graphs_replay_the_eager_pass(config_of(GetParam()), "bf16");
}

TEST_P(CudaModel, Bf16GraphsReplayTheEagerPassBitwiseUnfusedAttention) {
  expect_graphs_replay_the_eager_pass(config_of(GetParam()), "bf16", "attention=unfused");
}

// A bit-changing option reaches the kernels the graphs capture: gelu=fast, graphed and eager,
// the same bits (expect_graphs_replay_the_eager_pass), and other bits than the exact GELU's.
TEST(CudaGraphs, AFastGeluPlanIsCapturedAndDiffersFromTheExactOne) {
  vit::register_cuda_backend();
  VIT_GPU_TEST_PRECONDITION();
  const vit::ModelConfig c = config_of(vit::test::kComparisonCases[0]);  // mlp: GELU
  expect_graphs_replay_the_eager_pass(c, "bf16", "gelu=fast");
  const Index B = 8;
  std::vector<float> after[2];
  for (const int fast : {0, 1}) {
    vit::EngineOptions o = vit::test::engine_options("cuda", "bf16", c, B);
    o.kernels = vit::parse_kernel_options(fast ? "gelu=fast" : "gelu=erf");
    auto e = vit::make_engine(o);
    std::vector<float> p0(size_t(e->table().total));
    vit::init_params(p0.data(), e->table(), c, 5);
    e->write_params(p0);
    const Batch b = batch_of(c, B, 6);
    e->zero_grad();
    e->forward_backward(b.images.data(), b.targets.data(), B, 1.0f / float(B), 0);
    e->step(1e-3);
    after[fast] = e->read_params();
  }
  EXPECT_NE(after[0], after[1]) << "gelu=fast ran the exact GELU";
}

TEST(CudaGraphs, Fp32ReplayTheEagerPassBitwise) {
  vit::register_cuda_backend();
  VIT_GPU_TEST_PRECONDITION();
  expect_graphs_replay_the_eager_pass(config_of(vit::test::kComparisonCases[2]), "fp32");
}

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
