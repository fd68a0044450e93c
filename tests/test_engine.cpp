// The engine over the host backends: the CPU engine computes exactly what the model and the
// optimizer did before the engine existed; the bf16 emulation keeps fp32 master weights, rounds
// the weight copy once per update, and trains close to fp32; state round trips and image-size
// switches keep every buffer in place.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "backend/host.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "engine_test_util.h"
#include "model/vit.h"
#include "ops/cpu/ema.h"
#include "train/engine.h"
#include "train/engine_impl.h"
#include "train/optimizer.h"
#include "train/resize_model.h"

namespace {

using vit::Index;

vit::ModelConfig small_config(vit::Ffn ffn, vit::Classifier cls) {
  vit::ModelConfig c = vit::model_preset("vit_fmnist_tiny");
  c.img_size = 16;
  c.patch_size = 4;
  c.in_chans = 1;
  c.num_classes = 5;
  c.ffn = ffn;
  c.classifier = cls;
  c.drop_path = 0.1;
  c.validate();
  return c;
}

using vit::test::Batch;

Batch make_batch(const vit::ModelConfig& c, Index B, uint64_t seed) {
  return vit::test::random_batch(c, B, seed);
}

vit::EngineOptions options(const std::string& device, const vit::ModelConfig& c, Index B) {
  return vit::test::engine_options(device, "bf16", c, B);
}

std::vector<float> initial_params(const vit::ParamTable& t, const vit::ModelConfig& c) {
  std::vector<float> p(size_t(t.total), 0.0f);
  vit::init_params(p.data(), t, c, 42);
  return p;
}

class EngineTest : public ::testing::TestWithParam<vit::Ffn> {};

// Three updates of two micro-batches each through the engine, against the model and AdamW
// driven by hand as the trainer did before: bitwise the same weights, moments and norms.
TEST_P(EngineTest, CpuEngineIsBitwiseTheDirectPath) {
  const auto c = small_config(GetParam(), vit::Classifier::Token);
  const Index B = 6;
  auto engine = vit::make_engine(options("cpu", c, B));
  vit::Vit<float> model(c, B);
  const auto p0 = initial_params(model.table(), c);
  engine->write_params(p0);
  std::copy(p0.begin(), p0.end(), model.params.begin());
  vit::AdamW<float> opt(model.table().total, model.table().num_decay, options("cpu", c, B).adamw);
  for (int step = 0; step < 3; ++step) {
    engine->zero_grad();
    model.zero_grad();
    double ref_loss = 0;
    for (int a = 0; a < 2; ++a) {
      const Batch b = make_batch(c, B, 10 * step + a);
      engine->forward_backward(b.images.data(), b.targets.data(), B, 1.0f / (2 * B), 7 + a);
      model.forward(b.images.data(), b.targets.data(), B, true, 7 + a);
      ref_loss += model.mean_loss();
      model.backward(1.0f / (2 * B));
    }
    engine->step(1e-3);
    const double ref_norm = opt.step(model.params.data(), model.grads.data(), 1e-3);
    const vit::TrainStats ts = engine->read_stats();
    EXPECT_EQ(ts.updates, 1);
    EXPECT_EQ(ts.grad_norm, ref_norm);
    EXPECT_DOUBLE_EQ(ts.last_loss, ref_loss / 2);
  }
  const std::vector<float> p = engine->read_params();
  std::vector<float> m, v;
  engine->read_moments(m, v);
  ASSERT_EQ(Index(p.size()), model.table().total);
  for (Index i = 0; i < model.table().total; ++i) {
    ASSERT_EQ(p[i], model.params[i]) << i;
    ASSERT_EQ(m[i], opt.m[i]) << i;
    ASSERT_EQ(v[i], opt.v[i]) << i;
  }
  EXPECT_EQ(engine->num_steps(), 3);
}

// The emulation trains like fp32 (engine_test_util.h says within what).
TEST_P(EngineTest, Bf16EmulationTrainsCloseToFp32) {
  const auto c = small_config(GetParam(), vit::Classifier::Avg);
  const Index B = 8;
  auto cpu = vit::make_engine(options("cpu", c, B));
  auto emu = vit::make_engine(options("emu", c, B));
  EXPECT_EQ(emu->description(), "cpu bf16 emulation");
  vit::test::expect_trains_close_to_fp32(*emu, *cpu, initial_params(cpu->table(), c), c, B);
}

// The emulation, like the CUDA backend, runs the fused attention for head dims the kernels
// support (here D = 32) unless its kernel plan says attention=unfused; other head dims run
// unfused. Fused and
// unfused are the same attention rounded at different points: three updates agree within the
// bf16 tolerance of the test above, and the fused arena holds no (B, H, N, N) probabilities.
TEST(Engine, EmulationFusedAttentionTrainsLikeUnfused) {
  const auto c = small_config(vit::Ffn::Local, vit::Classifier::Token);
  ASSERT_EQ(c.head_dim(), 32);
  const Index B = 6;
  vit::ModelEngine<vit::EmuBackend> fused(options("emu", c, B));
  vit::EngineOptions unfused_options = options("emu", c, B);
  unfused_options.kernels = vit::parse_kernel_options("attention=unfused");
  vit::ModelEngine<vit::EmuBackend> unfused(unfused_options);
  EXPECT_TRUE(fused.model().fused_attention());
  EXPECT_FALSE(unfused.model().fused_attention());
  const Index N = c.num_tokens(), H = c.num_heads;
  // Per layer the arena trades B H N N bf16 probabilities for B H N fp32 statistics (each slot
  // rounded up to 256 bytes).
  const double saved = double(unfused.model().arena_bytes()) - double(fused.model().arena_bytes());
  EXPECT_NEAR(saved, double(c.depth * B * H * (N * N * 2 - N * 4)), c.depth * 2 * 256.0);

  const auto p0 = initial_params(fused.table(), c);
  fused.write_params(p0);
  unfused.write_params(p0);
  for (int step = 0; step < 3; ++step) {
    const Batch b = make_batch(c, B, 200 + step);
    for (vit::Engine* e :
         {static_cast<vit::Engine*>(&fused), static_cast<vit::Engine*>(&unfused)}) {
      e->zero_grad();
      e->forward_backward(b.images.data(), b.targets.data(), B, 1.0f / B, 3);
      e->step(2e-3);
    }
    const vit::TrainStats f = fused.read_stats(), u = unfused.read_stats();
    EXPECT_NEAR(f.last_loss, u.last_loss, 1e-2 * std::fabs(u.last_loss)) << "update " << step;
    EXPECT_NEAR(f.grad_norm, u.grad_norm, 3e-2 * u.grad_norm) << "update " << step;
  }
  EXPECT_NE(fused.read_params(), unfused.read_params()) << "the two paths should round apart";

  vit::ModelConfig odd = c;  // D = 24: no fused kernel, so neither backend fuses
  odd.num_heads = 4;
  odd.validate();
  vit::ModelEngine<vit::EmuBackend> unsupported(options("emu", odd, B));
  EXPECT_FALSE(unsupported.model().fused_attention());
}

// The mixed-precision bookkeeping: the master weights stay fp32 (not bf16-representable after
// an update) while the weights the forward reads are exactly their bf16 rounding.
TEST(Engine, EmulationKeepsFp32MasterAndRoundedCopy) {
  const auto c = small_config(vit::Ffn::Local, vit::Classifier::Token);
  const Index B = 4;
  vit::ModelEngine<vit::EmuBackend> emu(options("emu", c, B));
  emu.write_params(initial_params(emu.table(), c));
  const Batch b = make_batch(c, B, 5);
  emu.zero_grad();
  emu.forward_backward(b.images.data(), b.targets.data(), B, 1.0f / B, 1);
  emu.step(1e-3);
  auto& model = emu.model();
  const vit::bf16* copy = model.weights();
  Index not_bf16 = 0;
  for (Index i = 0; i < emu.table().total; ++i) {
    const float master = model.params[i];
    ASSERT_EQ(copy[i].bits, vit::bf16(master).bits) << i;
    not_bf16 += vit::round_bf16(master) != master;
  }
  EXPECT_GT(not_bf16, emu.table().num_params / 2) << "master weights should be full fp32";
}

// The training state's memory by part, as the trainer's header reports it: fp32 master
// weights, gradients and both AdamW moments of every parameter slot; bf16 modes add the
// weights' bf16 copy; the EMA is counted only where it is kept.
TEST(Engine, StateMemoryCountsEachPart) {
  const auto c = small_config(vit::Ffn::Local, vit::Classifier::Avg);
  for (const char* device : {"cpu", "emu"}) {
    for (bool ema : {false, true}) {
      SCOPED_TRACE(std::string(device) + (ema ? " with EMA" : ""));
      vit::EngineOptions o = options(device, c, 2);
      o.ema = ema;
      auto e = vit::make_engine(o);
      const vit::StateMemory mem = e->state_memory();
      const double n = double(e->read_params().size());  // the table's parameters
      const bool bf16 = std::string(device) == "emu";
      EXPECT_GE(mem.grads, 4 * n);  // the buffers hold at least the table (capacity >= total)
      EXPECT_EQ(mem.weights, mem.grads * (bf16 ? 1.5 : 1.0));
      EXPECT_EQ(mem.optimizer, 2 * mem.grads);
      EXPECT_EQ(mem.ema, ema ? mem.grads : 0.0);
      EXPECT_EQ(mem.total(), mem.weights + mem.grads + mem.optimizer + mem.ema);
    }
  }
  const vit::StateMemory mem{4 << 20, 2 << 20, 2 << 20, 0};
  EXPECT_EQ(vit::format_state_memory(mem, true, 4),
            "Training state per rank: 8.0 MiB in device memory (weights 4.0, gradients 2.0, AdamW "
            "moments 2.0 (ZeRO-1: 1/4))");
}

// Switching the image size keeps every buffer (the arena and the parameter buffers are sized
// for the largest size), and the switched engine computes what a fresh engine at that size does.
TEST(Engine, ImageSizeSwitchKeepsBuffersAndMatchesAFreshEngine) {
  const auto c = small_config(vit::Ffn::Mlp, vit::Classifier::Token);
  const Index B = 4;
  vit::EngineOptions o = options("cpu", c, B);
  vit::ModelEngine<vit::CpuBackend<float>> big(o);
  const size_t arena = big.model().arena_bytes();
  const float* params_before = big.model().params.data();
  const auto p0 = initial_params(big.table(), c);
  big.write_params(p0);

  vit::ModelConfig small = c;
  small.img_size = 8;
  const auto r = vit::resize_model(c, big.table(), p0, {}, {}, 8);
  big.set_img_size(8);
  big.write_params(r.params);
  EXPECT_EQ(big.model().arena_bytes(), arena);
  EXPECT_EQ(big.model().params.data(), params_before);
  EXPECT_EQ(big.table().total, r.table.total);

  auto fresh = vit::make_engine(options("cpu", small, B));
  fresh->write_params(r.params);
  const Batch b = make_batch(small, B, 9);
  for (vit::Engine* e : {static_cast<vit::Engine*>(&big), fresh.get()}) {
    e->zero_grad();
    e->forward_backward(b.images.data(), b.targets.data(), B, 1.0f / B, 2);
    e->step(1e-3);
  }
  EXPECT_EQ(big.read_params(), fresh->read_params());
  EXPECT_EQ(big.read_stats().last_loss, fresh->read_stats().last_loss);
}

TEST(Engine, StateRoundTripsAndSizeChecks) {
  const auto c = small_config(vit::Ffn::Mlp, vit::Classifier::Avg);
  auto e = vit::make_engine(options("emu", c, 2));
  std::vector<float> p = initial_params(e->table(), c), m(p.size()), v(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    m[i] = 1e-3f * float(i % 17);
    v[i] = 1e-6f * float(i % 5);
  }
  e->write_params(p);
  e->write_moments(m, v, 12);
  EXPECT_EQ(e->read_params(), p);
  std::vector<float> m2, v2;
  e->read_moments(m2, v2);
  EXPECT_EQ(m2, m);
  EXPECT_EQ(v2, v);
  EXPECT_EQ(e->num_steps(), 12);
  p.pop_back();
  EXPECT_THROW(e->write_params(p), vit::Error);
  const std::vector<float> images(3 * 16 * 16), targets(3 * 5);
  EXPECT_THROW(e->infer(images.data(), targets.data(), 3, nullptr, nullptr), vit::Error);
}

// The input stage alone (bench-data --device): the same checks as training's upload, and no
// trace in training: an update after staged batches equals a fresh engine's, bitwise.
TEST(Engine, StagedInputChecksAndLeavesTrainingAlone) {
  const auto c = small_config(vit::Ffn::Mlp, vit::Classifier::Avg);
  const Index B = 2;
  for (const std::string device : {"cpu", "emu"}) {
    auto staged = vit::make_engine(options(device, c, B)),
         fresh = vit::make_engine(options(device, c, B));
    const std::vector<float> p = initial_params(staged->table(), c);
    staged->write_params(p);
    fresh->write_params(p);
    const Batch other = make_batch(c, B, 5), b = make_batch(c, B, 6);
    staged->stage_input(other.images.data(), other.targets.data(), B);
    staged->synchronize();
    EXPECT_THROW(staged->stage_input(other.images.data(), other.targets.data(), B + 1), vit::Error)
        << device;
    vit::data::PlannedBatch plan;
    plan.clear(c.in_chans, c.img_size / 2);  // images at half the model's side
    const std::vector<float> lut(size_t(c.in_chans) * 256, 0.0f);
    EXPECT_THROW(staged->stage_input_planned(plan, lut, other.targets.data()), vit::Error)
        << device;
    for (auto* e : {staged.get(), fresh.get()}) {
      e->zero_grad();
      e->forward_backward(b.images.data(), b.targets.data(), B, 0.5f, 3);
      e->step(1e-3);
    }
    EXPECT_EQ(staged->read_stats().last_loss, fresh->read_stats().last_loss) << device;
    EXPECT_EQ(staged->read_params(), fresh->read_params()) << device;
  }
}

// Time marks (bench's chunks): take_marks() gives each mark's seconds after the first, in
// order, a mark after a training step later than the one before it, and forgets them.
TEST(Engine, TimeMarksSpanTheWorkBetweenThem) {
  const auto c = small_config(vit::Ffn::Mlp, vit::Classifier::Token);
  const Index B = 2;
  for (const std::string device : {"cpu", "emu"}) {
    SCOPED_TRACE(device);
    auto e = vit::make_engine(options(device, c, B));
    e->write_params(initial_params(e->table(), c));
    const Batch b = make_batch(c, B, 8);
    e->mark_time();
    e->zero_grad();
    e->forward_backward(b.images.data(), b.targets.data(), B, 0.5f, 3);
    e->step(1e-3);
    e->mark_time();
    e->mark_time();  // nothing between: no earlier than the one before
    e->read_stats();
    const std::vector<double> s = e->take_marks();
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0], 0.0);
    EXPECT_GT(s[1], 0.0);
    EXPECT_GE(s[2], s[1]);
    EXPECT_TRUE(e->take_marks().empty());
  }
}

// The non-finite guard: an update whose loss (NaN input) or gradient (NaN loss scale) is not
// finite is skipped, weights, moments and the bf16 copy bitwise untouched, and counted; the
// run of consecutive skips survives a read and ends at the next applied update.
TEST(Engine, NonFiniteUpdatesAreSkippedAndCounted) {
  for (const std::string device : {"cpu", "emu"}) {
    SCOPED_TRACE(device);
    const auto c = small_config(vit::Ffn::Local, vit::Classifier::Avg);
    const Index B = 4, K = c.num_classes;
    auto e = vit::make_engine(options(device, c, B));
    e->write_params(initial_params(e->table(), c));
    auto update = [&](const Batch& b, float scale) {
      e->zero_grad();
      e->forward_backward(b.images.data(), b.targets.data(), B, scale, 5);
      e->step(1e-3);
    };
    const Batch good = make_batch(c, B, 1);
    Batch nan_input = make_batch(c, B, 2);
    nan_input.images[3] = std::nanf("");
    update(good, 1.0f / B);
    const vit::TrainStats first = e->read_stats();
    EXPECT_EQ(first.skipped, 0);
    EXPECT_TRUE(std::isfinite(first.loss_sum));

    const std::vector<float> p = e->read_params();
    std::vector<float> m, v;
    e->read_moments(m, v);
    std::vector<float> logits(B * K), logits2(B * K);
    e->infer(good.images.data(), nullptr, B, logits.data(), nullptr);

    update(nan_input, 1.0f / B);  // NaN loss
    vit::TrainStats ts = e->read_stats();
    EXPECT_EQ(ts.updates, 1);
    EXPECT_EQ(ts.skipped, 1);
    EXPECT_EQ(ts.applied(), 0);
    EXPECT_EQ(ts.loss_sum, 0.0);
    EXPECT_TRUE(std::isnan(ts.last_loss));
    EXPECT_EQ(ts.bad_run, 1);
    EXPECT_EQ(ts.bad_run_max, 1);
    update(good, std::nanf(""));  // finite loss, NaN gradients
    update(good, 1.0f / B);       // applied again
    ts = e->read_stats();
    EXPECT_EQ(ts.updates, 2);
    EXPECT_EQ(ts.skipped, 1);
    EXPECT_EQ(ts.bad_run, 0);
    EXPECT_EQ(ts.bad_run_max, 2);  // the run begun before the previous read
    EXPECT_TRUE(std::isfinite(ts.loss_sum) && ts.loss_sum > 0);
    EXPECT_EQ(e->num_steps(), 4);  // the schedule counts every update

    EXPECT_NE(e->read_params(), p);  // the last update was applied
    // The skipped updates wrote nothing: the engine's state after them was exactly p, m, v.
    auto g = vit::make_engine(options(device, c, B));
    g->write_params(initial_params(g->table(), c));
    g->zero_grad();
    g->forward_backward(good.images.data(), good.targets.data(), B, 1.0f / B, 5);
    g->step(1e-3);
    g->zero_grad();
    g->forward_backward(good.images.data(), good.targets.data(), B, std::nanf(""), 5);
    g->step(1e-3);
    EXPECT_EQ(g->read_params(), p);
    std::vector<float> mg, vg;
    g->read_moments(mg, vg);
    EXPECT_EQ(mg, m);
    EXPECT_EQ(vg, v);
    g->infer(good.images.data(), nullptr, B, logits2.data(), nullptr);
    EXPECT_EQ(logits2, logits);  // the bf16 copy (emu) was not rewritten either
  }
}

// Model EMA in the engine: the fused update over the parameter buffer after an applied update,
// none after a skipped one, and an exact exchange with the weights (twice restores, the bf16
// copy included).
TEST(Engine, ModelEmaFollowsAppliedUpdatesAndSwapsExactly) {
  for (const std::string device : {"cpu", "emu"}) {
    SCOPED_TRACE(device);
    const auto c = small_config(vit::Ffn::Mlp, vit::Classifier::Token);
    const Index B = 4, K = c.num_classes;
    auto plain = vit::make_engine(options(device, c, B));
    EXPECT_FALSE(plain->has_ema());
    EXPECT_THROW(plain->update_ema(0.9), vit::Error);
    vit::EngineOptions o = options(device, c, B);
    o.ema = true;
    auto e = vit::make_engine(o);
    ASSERT_TRUE(e->has_ema());
    const auto p0 = initial_params(e->table(), c);
    e->write_params(p0);
    e->write_ema(p0);
    const Batch b = make_batch(c, B, 3);
    auto update = [&](float scale, double decay) {
      e->zero_grad();
      e->forward_backward(b.images.data(), b.targets.data(), B, scale, 1);
      e->step(1e-2);
      e->update_ema(decay);
    };
    update(1.0f / B, 0.75);
    const std::vector<float> p1 = e->read_params();
    std::vector<float> want = p0;
    vit::cpu::ema_update(want.data(), p1.data(), Index(want.size()), 0.75);
    EXPECT_EQ(e->read_ema(), want);
    EXPECT_NE(want, p1);

    update(std::nanf(""), 0.75);  // skipped: neither the weights nor their EMA move
    EXPECT_EQ(e->read_params(), p1);
    EXPECT_EQ(e->read_ema(), want);

    std::vector<float> logits(B * K), again(B * K);
    e->infer(b.images.data(), nullptr, B, logits.data(), nullptr);
    e->swap_ema();
    EXPECT_EQ(e->read_params(), want);
    EXPECT_EQ(e->read_ema(), p1);
    e->swap_ema();
    EXPECT_EQ(e->read_params(), p1);
    EXPECT_EQ(e->read_ema(), want);
    e->infer(b.images.data(), nullptr, B, again.data(), nullptr);
    EXPECT_EQ(again, logits);
  }
}

TEST(Engine, ResolveDeviceWithoutACudaBackend) {
  // The CPU test binary does not link the CUDA backend.
  EXPECT_FALSE(vit::cuda_engine_linked());
  EXPECT_EQ(vit::resolve_device("auto"), "cpu");
  EXPECT_EQ(vit::resolve_device("cpu"), "cpu");
  EXPECT_EQ(vit::resolve_device("emu"), "emu");
  try {
    vit::resolve_device("cuda");
    FAIL() << "cuda without a backend must throw";
  } catch (const vit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
  }
  EXPECT_THROW(vit::resolve_device("tpu"), vit::Error);
}

INSTANTIATE_TEST_SUITE_P(Ffn, EngineTest,
                         ::testing::Values(vit::Ffn::Mlp, vit::Ffn::MlpTanh, vit::Ffn::Local),
                         [](const auto& info) { return std::string(vit::to_string(info.param)); });

// The tolerances of the CUDA fp32 model test (test_cuda_model.cpp) are reachable: CPU fp32
// against CPU fp64, which differ only in rounding as CUDA and CPU fp32 do, meets them.
class EngineFp64 : public ::testing::TestWithParam<vit::test::Case> {};

TEST_P(EngineFp64, Fp32MatchesFp64WithinTheGpuTolerances) {
  const vit::ModelConfig c = vit::test::config_of(GetParam());
  const Index B = 5;
  vit::EngineOptions o = vit::test::engine_options("cpu", "fp32", c, B);
  o.adamw.eps = vit::test::kComparisonAdamEps;
  vit::ModelEngine<vit::CpuBackend<float>> f32(o);
  vit::ModelEngine<vit::CpuBackend<double>> f64(o);
  std::vector<float> p0(size_t(f32.table().total), 0.0f);
  vit::init_params(p0.data(), f32.table(), c, 3);
  const auto a = vit::test::train_three_steps(f64, p0, c, B);
  const auto b = vit::test::train_three_steps(f32, p0, c, B);
  vit::test::expect_three_steps_match(b, a, f32.table(), c);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineFp64, ::testing::ValuesIn(vit::test::kComparisonCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
