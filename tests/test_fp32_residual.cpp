// --fp32-residual in the CPU bf16 emulation: the residual stream (block inputs and outputs, r1,
// and their gradient dres) stored in fp32 beside bf16 activations.
//  * The stream ops with an fp32 stream (src/ops/emu/ops.h): fp32 outputs are the fp32 CPU op's
//    bits on the same inputs (nothing of the stream is rounded), bf16 outputs are that op's
//    value rounded once; accumulating gradients add in fp32.
//  * Why it exists: a branch below half a bf16 spacing of the stream vanishes from a bf16
//    stream (residual add, and in the backward the blocks' share of the stream's gradient);
//    with layer scale 1e-4 (DeiT III's init) the fp32 stream keeps what the fp32 model computes.
//  * The model and engine over EmuBackendFp32Residual: its arena holds the stream (and the
//    pooled features) in fp32 and it trains close to the fp32 CPU engine.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/host.h"
#include "emu_test_util.h"
#include "engine_test_util.h"
#include "model/vit.h"
#include "ops/cpu/ops.h"
#include "ops/emu/ops.h"
#include "residual_share_util.h"
#include "train/engine.h"

namespace vit {
namespace {

using namespace emu_test;  // Gen, widen, expect_rounded, expect_same_bits: emu_test_util.h
using test::blocks_share_of_dpos;
using test::layer_scale_config;
using test::relative_distance;

struct Tokens {  // B samples of N tokens (prefix class-token rows first) of C channels
  Index B, N, prefix, C;
};
const Tokens kShapes[] = {{3, 17, 1, 36}, {2, 50, 0, 100}};

std::string trace(const Tokens& s) {
  return "B " + std::to_string(s.B) + " N " + std::to_string(s.N) + " prefix " +
         std::to_string(s.prefix) + " C " + std::to_string(s.C);
}

TEST(Fp32ResidualOps, LayernormReadsAndAccumulatesTheStreamInFp32) {
  for (const Tokens& s : kShapes) {
    SCOPED_TRACE(trace(s));
    const Index R = s.B * s.N, C = s.C;
    Gen g(21);
    const Floats x = g.floats(R * C, -1.5, 2.5);       // (R, C) the fp32 stream
    const Bf16s w = g.bf16s(C, 0.5, 1.5);              // (C)
    const Bf16s b = g.bf16s(C, -0.5, 0.5);             // (C)
    const Bf16s dout = g.bf16s(R * C, -1, 1);          // (R, C)
    const Floats dres0 = g.floats(R * C, -0.5, 0.5);   // (R, C) the stream's gradient so far
    const Floats dw0 = g.floats(C, -1, 1), db0 = dw0;  // (C)
    Bf16s y = nans(R * C);                             // (R, C)
    Floats mean(len(R)), rstd(len(R));                 // (R)
    emu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C,
                           1e-6f);
    Floats dres = dres0, dw = dw0, db = db0;
    emu::layernorm_backward(dres.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), R, C);

    const Floats w32 = widen(w);
    Floats ry(len(R * C)), rmean(len(R)), rrstd(len(R));  // (R, C), (R), (R)
    cpu::layernorm_forward(ry.data(), rmean.data(), rrstd.data(), x.data(), w32.data(),
                           widen(b).data(), R, C, 1e-6f);
    Floats rdres = dres0, rdw = dw0, rdb = db0;
    cpu::layernorm_backward(rdres.data(), rdw.data(), rdb.data(), widen(dout).data(), x.data(),
                            w32.data(), rmean.data(), rrstd.data(), R, C);
    expect_rounded(y, ry);  // the bf16 activation: rounded once
    expect_same_bits(mean, rmean);
    expect_same_bits(rstd, rrstd);
    expect_same_bits(dres, rdres);  // fp32 accumulation, no rounding
    expect_same_bits(dw, rdw);
    expect_same_bits(db, rdb);
  }
}

TEST(Fp32ResidualOps, ResidualAddsInFp32AndRoundsTheBranchGradientOnce) {
  const Index B = 3, S = 17, C = 100, n = B * S * C;
  Gen g(22);
  const Floats x = g.floats(n, -1, 1);              // (B, S, C) the fp32 stream
  const Bf16s branch = g.bf16s(n, -1, 1);           // (B, S, C)
  const Floats dy = g.floats(n, -1, 1);             // (B, S, C) the fp32 stream's gradient
  const Bf16s gamma = g.bf16s(C, 0.05, 1);          // (C)
  const Floats scale = {0.0f, 1.0f / 0.9f, 1.25f};  // (B) drop path: dropped, kept, kept
  const Floats dg0 = g.floats(C, -1, 1);            // (C)
  Floats y(len(n), NAN), inplace = x, dg = dg0;     // (B, S, C), (B, S, C), (C)
  Bf16s db = nans(n);                               // (B, S, C)
  emu::residual_forward(y.data(), x.data(), branch.data(), gamma.data(), scale.data(), B, S, C);
  emu::residual_forward(inplace.data(), inplace.data(), branch.data(), gamma.data(), scale.data(),
                        B, S, C);
  emu::residual_backward(db.data(), dg.data(), dy.data(), branch.data(), gamma.data(), scale.data(),
                         B, S, C);

  const Floats gamma32 = widen(gamma), branch32 = widen(branch);
  Floats ry(len(n)), rdb(len(n)), rdg = dg0;  // (B, S, C), (B, S, C), (C)
  cpu::residual_forward(ry.data(), x.data(), branch32.data(), gamma32.data(), scale.data(), B, S,
                        C);
  cpu::residual_backward(rdb.data(), rdg.data(), dy.data(), branch32.data(), gamma32.data(),
                         scale.data(), B, S, C);
  expect_same_bits(y, ry);
  expect_same_bits(inplace, ry);
  expect_rounded(db, rdb);
  expect_same_bits(dg, rdg);
}

TEST(Fp32ResidualOps, EmbeddingAndPoolingKeepTheStreamInFp32) {
  for (const Tokens& s : kShapes) {
    for (bool avg : {true, false}) {
      SCOPED_TRACE(trace(s) + " avg " + std::to_string(avg));
      const Index B = s.B, N = s.N, C = s.C, np = N - s.prefix;
      Gen g(23);
      const Bf16s patch = g.bf16s(B * np * C, -1, 1);  // (B, N - prefix, C)
      const Bf16s cls = g.bf16s(C, -1, 1);             // (C)
      const Bf16s pos = g.bf16s(N * C, -1, 1);         // (N, C)
      const Floats dx = g.floats(B * N * C, -1, 1);    // (B, N, C) the fp32 stream's gradient
      const Floats dpool = g.floats(B * C, -1, 1);     // (B, C) the pooled features' gradient
      const Floats dx0 = g.floats(B * N * C, -0.1, 0.1);
      const Floats dcls0 = g.floats(C, -1, 1), dpos0 = g.floats(N * C, -1, 1);
      const bf16* cls_p = s.prefix > 0 ? cls.data() : nullptr;
      Floats x(len(B * N * C), NAN), dcls = dcls0, dpos = dpos0, dxp = dx0;
      Bf16s dpatch = nans(B * np * C);  // (B, N - prefix, C)
      Floats pooled(len(B * C), NAN);   // (B, C)
      emu::embed_tokens_forward(x.data(), patch.data(), cls_p, pos.data(), B, N, s.prefix, C);
      emu::embed_tokens_backward(dpatch.data(), dcls.data(), dpos.data(), dx.data(), B, N, s.prefix,
                                 C);
      emu::pool_forward(pooled.data(), x.data(), B, N, s.prefix, C, avg);
      emu::pool_backward(dxp.data(), dpool.data(), B, N, s.prefix, C, avg);

      const Floats cls32 = widen(cls);
      Floats rx(x.size()), rdpatch(dpatch.size()), rdcls = dcls0, rdpos = dpos0;
      Floats rpooled(len(B * C)), rdxp = dx0;  // (B, C), (B, N, C)
      cpu::embed_tokens_forward(rx.data(), widen(patch).data(),
                                s.prefix > 0 ? cls32.data() : nullptr, widen(pos).data(), B, N,
                                s.prefix, C);
      cpu::embed_tokens_backward(rdpatch.data(), rdcls.data(), rdpos.data(), dx.data(), B, N,
                                 s.prefix, C);
      cpu::pool_forward(rpooled.data(), rx.data(), B, N, s.prefix, C, avg);
      cpu::pool_backward(rdxp.data(), dpool.data(), B, N, s.prefix, C, avg);
      expect_same_bits(x, rx);          // summed in fp32 and stored as is
      expect_rounded(dpatch, rdpatch);  // no longer a copy: rounded once from the fp32 stream
      if (s.prefix > 0) expect_same_bits(dcls, rdcls);
      expect_same_bits(dpos, rdpos);
      expect_same_bits(pooled, rpooled);  // fp32 features for the final LayerNorm
      expect_same_bits(dxp, rdxp);
    }
  }
}

// A branch below half a bf16 spacing of the stream: the bf16 stream drops it, the fp32 stream
// keeps it, as the fp32 model does.
TEST(Fp32ResidualOps, ATinyBranchSurvivesOnlyInTheFp32Stream) {
  const Index B = 1, S = 4, C = 8, n = B * S * C;
  const Bf16s branch(len(n), bf16(1.0f));  // (B, S, C)
  const Bf16s gamma(len(C), bf16(1e-4f));  // (C) layer scale
  Bf16s x16(len(n), bf16(1.0f));           // (B, S, C): spacing 2^-7 above 1
  Floats x32(len(n), 1.0f);
  emu::residual_forward(x16.data(), x16.data(), branch.data(), gamma.data(), nullptr, B, S, C);
  emu::residual_forward(x32.data(), x32.data(), branch.data(), gamma.data(), nullptr, B, S, C);
  for (Index i = 0; i < n; ++i) {
    EXPECT_EQ(float(x16[i]), 1.0f) << i;
    EXPECT_NEAR(x32[i], 1.0f + float(bf16(1e-4f)), 1e-7) << i;
  }
}

// ---------------------------------------------------------------------------------------------
// The model

// With layer scale 1e-4 the blocks add ~1e-4 of the stream's gradient: below half a bf16
// spacing (2^-9), so a bf16 dres loses most of it, and the fp32 stream keeps it to within the
// bf16 rounding of the branches themselves.
TEST(Fp32ResidualModel, KeepsTheBlocksShareOfTheStreamGradient) {
  const ModelConfig c = layer_scale_config(1e-4);
  const Index B = 4;
  std::vector<float> p0(size_t(build_param_table(c).total));
  init_params(p0.data(), build_param_table(c), c, 7);
  const test::Batch batch = test::random_batch(c, B, 3);
  const auto ref = blocks_share_of_dpos<CpuBackend<float>>(c, p0, batch, B);
  const auto emu16 = blocks_share_of_dpos<EmuBackend>(c, p0, batch, B);
  const auto emu32 = blocks_share_of_dpos<EmuBackendFp32Residual>(c, p0, batch, B);
  double ref_norm = 0;
  for (double v : ref) ref_norm += v * v;
  ASSERT_GT(ref_norm, 0) << "the blocks must contribute";
  const double d16 = relative_distance(emu16, ref), d32 = relative_distance(emu32, ref);
  EXPECT_LT(d32, 0.05) << "fp32 stream; bf16 stream: " << d16;
  EXPECT_GT(d16, 0.5) << "bf16 stream; fp32 stream: " << d32;
}

TEST(Fp32ResidualModel, ArenaHoldsTheStreamInFp32) {
  const ModelConfig c = layer_scale_config(0);
  const Index B = 4, BNC = B * c.num_tokens() * c.embed_dim, BC = B * c.embed_dim;
  VitModel<EmuBackend> bf16_stream(c, B);
  VitModel<EmuBackendFp32Residual> fp32_stream(c, B);
  // Each slot starts at a multiple of the arena's alignment. The stream's slots grow from 2 to
  // 4 bytes an element: res (L + 1), r1 (L) and dres of (B, N, C), pooled and dpooled of (B, C).
  // And the fp32 stream needs the branch-gradient slot, (B, N, C) in bf16, which the bf16 stream
  // without layer scale and drop path does without (its branches read dres in place).
  auto padded = [](Index bytes) {
    const Index a = Index(kArenaAlign);
    return (bytes + a - 1) / a * a;
  };
  const Index grown = (2 * c.depth + 2) * (padded(4 * BNC) - padded(2 * BNC)) +
                      2 * (padded(4 * BC) - padded(2 * BC)) + padded(2 * BNC);
  EXPECT_EQ(Index(fp32_stream.arena_bytes()) - Index(bf16_stream.arena_bytes()), grown);
}

// As the bf16 emulation (test_engine.cpp): three updates within bf16 tolerances of fp32.
TEST(Fp32ResidualModel, EngineTrainsCloseToFp32) {
  ModelConfig c = layer_scale_config(0);
  c.drop_path = 0.1;
  const Index B = 8;
  EngineOptions o = test::engine_options("cpu", "bf16", c, B);
  auto cpu = make_engine(o);
  o.device = "emu";
  o.fp32_residual = true;
  auto emu = make_engine(o);
  EXPECT_EQ(emu->description(), "cpu bf16 emulation, fp32 residual");
  std::vector<float> p0(size_t(cpu->table().total));
  init_params(p0.data(), cpu->table(), c, 42);
  test::expect_trains_close_to_fp32(*emu, *cpu, p0, c, B);
}

}  // namespace
}  // namespace vit
