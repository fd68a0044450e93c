// The CPU bf16 emulation ops (src/ops/emu) on random inputs that are already bf16 values:
//  (a) rounding points. A bf16 output equals, bit for bit, the bf16 rounding of the fp32 CPU op
//      on the widened inputs, and an fp32 output (gradient, statistic, loss) equals the CPU op's
//      bits. Attention rounds intermediates the CPU op keeps in fp32, so it is checked against
//      an fp64 model of attention.cu written here instead.
//  (b) closeness to the fp32 CPU op within bf16 tolerances (stated at each check).
//  (c) accumulation: parameter gradients, LayerNorm's dinp and pooling's dx add up over calls.
// Overwritten bf16 outputs start as NaN, so an element an op forgets to write fails (a).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "emu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/emu/ops.h"

namespace vit {
namespace {

using namespace emu_test;  // helpers and the rounding-point model: emu_test_util.h

// ---------------------------------------------------------------------------------------------
// Conversion

TEST(EmuOps, ConvertRoundsToNearestEven) {
  // Ties go to the even neighbour (spacing 2^-7 at 1), above a tie rounds up, specials survive.
  const Floats in = {1.0f + 0x1p-8f,
                     1.0f + 3 * 0x1p-8f,
                     -(1.0f + 0x1p-8f),
                     1.0f + 0x1p-8f + 0x1p-20f,
                     std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::quiet_NaN()};
  const Floats want = {
      1.0f, 1.0f + 0x1p-6f, -1.0f, 1.0f + 0x1p-7f, std::numeric_limits<float>::infinity(), 0.0f};
  Bf16s out(in.size());
  emu::convert(out.data(), in.data(), Index(in.size()));
  for (size_t i = 0; i + 1 < in.size(); ++i) EXPECT_EQ(float(out[i]), want[i]) << "input " << i;
  EXPECT_TRUE(std::isnan(float(out.back())));
}

TEST(EmuOps, ConvertLargeBuffersBothWays) {
  // Large enough for the OpenMP path: every element as the scalar conversion gives it.
  const Index n = (Index(1) << 16) + 3;
  Gen g(1);
  const Floats x = g.floats(n, -1e3, 1e3);  // (n)
  Bf16s b(len(n));                          // (n)
  emu::convert(b.data(), x.data(), n);
  size_t bad = 0;
  for (Index i = 0; i < n; ++i) bad += b[i].bits != bf16(x[i]).bits;
  EXPECT_EQ(bad, 0u);
  Floats back(len(n));
  emu::convert(back.data(), b.data(), n);
  expect_same_bits(back, widen(b));
  for (Index i = 0; i < n; ++i) bad += back[i] != round_bf16(x[i]);
  EXPECT_EQ(bad, 0u);
}

// ---------------------------------------------------------------------------------------------
// Linear layers

struct MatmulShape {
  Index M, K, Nout;
};
const MatmulShape kMatmulShapes[] = {{3 * 17, 100, 60}, {3 * 50, 36, 100}};

TEST(EmuOps, MatmulForward) {
  for (const auto& s : kMatmulShapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE("M " + std::to_string(s.M) + " K " + std::to_string(s.K) + " bias " +
                   std::to_string(with_bias));
      Gen g(2);
      const Bf16s inp = g.bf16s(s.M * s.K, -1, 1);   // (M, K)
      const Bf16s w = g.bf16s(s.Nout * s.K, -1, 1);  // (Nout, K)
      const Bf16s bias = g.bf16s(s.Nout, -1, 1);     // (Nout)
      Bf16s out = nans(s.M * s.Nout);                // (M, Nout)
      emu::matmul_forward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, s.M,
                          s.K, s.Nout);
      // fp32 reference: GEMM + bias in fp32, so (a) also says the bias is added before the one
      // rounding (a separately rounded GEMM result would differ in the last bit often).
      Floats ref(len(s.M * s.Nout));  // (M, Nout)
      const Floats b32 = widen(bias);
      cpu::matmul_forward(ref.data(), widen(inp).data(), widen(w).data(),
                          with_bias ? b32.data() : nullptr, s.M, s.K, s.Nout);
      expect_rounded(out, ref);
      expect_close(out, ref, kRtol, 0.0);
    }
  }
}

TEST(EmuOps, MatmulBackwardAccumulates) {
  for (const auto& s : kMatmulShapes) {
    SCOPED_TRACE("M " + std::to_string(s.M) + " K " + std::to_string(s.K));
    Gen g(3);
    const Bf16s inp = g.bf16s(s.M * s.K, -1, 1);       // (M, K)
    const Bf16s w = g.bf16s(s.Nout * s.K, -1, 1);      // (Nout, K)
    const Bf16s dout = g.bf16s(s.M * s.Nout, -1, 1);   // (M, Nout)
    const Floats dw0 = g.floats(s.Nout * s.K, -1, 1);  // (Nout, K) earlier micro-batches
    const Floats db0 = g.floats(s.Nout, -1, 1);        // (Nout)
    Bf16s dinp = nans(s.M * s.K);                      // (M, K)
    Floats dw = dw0, db = db0;
    emu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.M,
                         s.K, s.Nout);
    const Floats dw1 = dw, db1 = db;
    emu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.M,
                         s.K, s.Nout);

    Floats rdinp(len(s.M * s.K));  // (M, K)
    Floats rdw = dw0, rdb = db0;   // (Nout, K), (Nout)
    const Floats inp32 = widen(inp), w32 = widen(w), dout32 = widen(dout);
    cpu::matmul_backward(rdinp.data(), rdw.data(), rdb.data(), dout32.data(), inp32.data(),
                         w32.data(), s.M, s.K, s.Nout);
    expect_rounded(dinp, rdinp);
    expect_close(dinp, rdinp, kRtol, 0.0);
    expect_same_bits(dw1, rdw);
    expect_same_bits(db1, rdb);
    cpu::matmul_backward<float>(nullptr, rdw.data(), rdb.data(), dout32.data(), inp32.data(),
                                w32.data(), s.M, s.K, s.Nout);
    expect_same_bits(dw, rdw);
    expect_same_bits(db, rdb);
    expect_added_twice(dw0, dw1, dw, kRtolF32Sum);
    expect_added_twice(db0, db1, db, kRtolF32Sum);

    // Without dinp (the first layer) the parameter gradients are the same.
    Floats dw_only = dw0;
    emu::matmul_backward(nullptr, dw_only.data(), nullptr, dout.data(), inp.data(), w.data(), s.M,
                         s.K, s.Nout);
    expect_same_bits(dw_only, dw1);
  }
}

// The Linear + tanh GELU pair of the mlp_tanh FFN, as cuBLASLt's GELU epilogues round: (a) pre
// is the matmul's rounding and act the rounding of the GELU of the same fp32 value (not of the
// rounded pre); dpre rounds gelu_tanh'(pre) times the fp32 product; fc2's gradients have
// matmul_backward's bits; fc1's bias gradient adds the bf16 rounding of the fp32 column sums.
TEST(EmuOps, MatmulGeluTanhRoundsAsTheEpilogues) {
  for (const auto& s : kMatmulShapes) {
    SCOPED_TRACE("M " + std::to_string(s.M) + " K " + std::to_string(s.K));
    const Index M = s.M, K = s.K, Hid = s.Nout, Nout = s.K;  // fc1: K -> Hid; fc2: Hid -> Nout
    Gen g(21);
    const Bf16s inp = g.bf16s(M * K, -1, 1);         // (M, K)
    const Bf16s w1 = g.bf16s(Hid * K, -1, 1);        // (Hid, K)
    const Bf16s b1 = g.bf16s(Hid, -1, 1);            // (Hid)
    const Bf16s w2 = g.bf16s(Nout * Hid, -1, 1);     // (Nout, Hid)
    const Bf16s dout = g.bf16s(M * Nout, -1, 1);     // (M, Nout)
    Bf16s act = nans(M * Hid), pre = nans(M * Hid);  // (M, Hid)
    emu::matmul_gelu_tanh_forward(act.data(), pre.data(), inp.data(), w1.data(), b1.data(), M, K,
                                  Hid);
    Floats pre32(len(M * Hid)), act32(len(M * Hid));  // (M, Hid)
    const Floats b1_32 = widen(b1);
    cpu::matmul_forward(pre32.data(), widen(inp).data(), widen(w1).data(), b1_32.data(), M, K, Hid);
    cpu::gelu_tanh_forward(act32.data(), pre32.data(), M * Hid);
    expect_rounded(pre, pre32);
    expect_rounded(act, act32);

    const Floats dw0 = g.floats(Nout * Hid, -1, 1), db0 = g.floats(Nout, -1, 1);
    const Floats db1_0 = g.floats(Hid, -1, 1);
    Floats dw = dw0, db = db0, db1 = db1_0;
    Bf16s dpre = nans(M * Hid);  // (M, Hid)
    emu::matmul_gelu_tanh_backward(dpre.data(), db1.data(), dw.data(), db.data(), nullptr,
                                   dout.data(), act.data(), pre.data(), w2.data(), M, Hid, Nout);
    // fc2's weight and bias gradients: matmul_backward's.
    Floats rdw = dw0, rdb = db0;
    emu::matmul_backward(nullptr, rdw.data(), rdb.data(), dout.data(), act.data(), w2.data(), M,
                         Hid, Nout);
    expect_same_bits(dw, rdw);
    expect_same_bits(db, rdb);
    // dpre from the fp32 product, and the bias gradient's bf16 sums.
    Floats prod(len(M * Hid)), rdpre(len(M * Hid));
    cpu::matmul_backward<float>(prod.data(), nullptr, nullptr, widen(dout).data(), nullptr,
                                widen(w2).data(), M, Hid, Nout);
    cpu::gelu_tanh_backward(rdpre.data(), prod.data(), widen(pre).data(), M * Hid);
    expect_rounded(dpre, rdpre);
    Floats sums(len(Hid), 0.0f), rdb1 = db1_0;
    for (Index m = 0; m < M; ++m)
      for (Index h = 0; h < Hid; ++h) sums[size_t(h)] += rdpre[size_t(m * Hid + h)];
    for (Index h = 0; h < Hid; ++h) rdb1[size_t(h)] += float(bf16(sums[size_t(h)]));
    expect_same_bits(db1, rdb1);
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

struct RowsShape {
  Index R, C;
};
const RowsShape kLayernormShapes[] = {{3 * 17, 100}, {3 * 50, 36}};

TEST(EmuOps, LayernormForward) {
  for (const auto& s : kLayernormShapes) {
    SCOPED_TRACE("R " + std::to_string(s.R) + " C " + std::to_string(s.C));
    Gen g(4);
    const Bf16s inp = g.bf16s(s.R * s.C, -1.5, 2.5);  // (R, C)
    const Bf16s w = g.bf16s(s.C, 0.5, 1.5);           // (C)
    const Bf16s b = g.bf16s(s.C, -0.5, 0.5);          // (C)
    Bf16s out = nans(s.R * s.C);                      // (R, C)
    Floats mean(len(s.R)), rstd(len(s.R));            // (R)
    emu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                           s.R, s.C, 1e-6f);
    Floats ref(len(s.R * s.C)), rmean(len(s.R)), rrstd(len(s.R));  // (R, C), (R), (R)
    cpu::layernorm_forward(ref.data(), rmean.data(), rrstd.data(), widen(inp).data(),
                           widen(w).data(), widen(b).data(), s.R, s.C, 1e-6f);
    expect_rounded(out, ref);
    expect_close(out, ref, kRtol, 0.0);
    expect_same_bits(mean, rmean);
    expect_same_bits(rstd, rrstd);
  }
}

TEST(EmuOps, LayernormBackwardAccumulates) {
  for (const auto& s : kLayernormShapes) {
    SCOPED_TRACE("R " + std::to_string(s.R) + " C " + std::to_string(s.C));
    Gen g(5);
    const Bf16s inp = g.bf16s(s.R * s.C, -1.5, 2.5);    // (R, C)
    const Bf16s w = g.bf16s(s.C, 0.5, 1.5);             // (C)
    const Bf16s b = g.bf16s(s.C, -0.5, 0.5);            // (C)
    const Bf16s dout = g.bf16s(s.R * s.C, -1, 1);       // (R, C)
    const Bf16s dinp0 = g.bf16s(s.R * s.C, -0.5, 0.5);  // (R, C) the residual-stream gradient
    const Floats dw0 = g.floats(s.C, -1, 1), db0 = g.floats(s.C, -1, 1);  // (C)
    Bf16s y(len(s.R * s.C));                                              // (R, C)
    Floats mean(len(s.R)), rstd(len(s.R));                                // (R)
    emu::layernorm_forward(y.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), s.R,
                           s.C, 1e-6f);
    const Floats inp32 = widen(inp), w32 = widen(w), dout32 = widen(dout);
    // The CPU op adding into dx (R, C), dw, db (C) in fp32.
    auto cpu_backward = [&](Floats& dx, Floats& dw, Floats& db) {
      cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dout32.data(), inp32.data(),
                              w32.data(), mean.data(), rstd.data(), s.R, s.C);
    };

    Bf16s dinp = dinp0;
    Floats dw = dw0, db = db0;
    emu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                            mean.data(), rstd.data(), s.R, s.C);
    const Bf16s dinp1 = dinp;
    const Floats dw1 = dw, db1 = db;
    // (a) round(old bf16 value + fp32 share), rounded once; (b) against the fp32 sum.
    Floats rdx = widen(dinp0), rdw = dw0, rdb = db0;  // (R, C), (C), (C)
    cpu_backward(rdx, rdw, rdb);
    expect_rounded(dinp1, rdx);
    expect_close(dinp1, rdx, kRtol, 0.0);
    expect_same_bits(dw1, rdw);
    expect_same_bits(db1, rdb);

    // (c) a second call adds onto the rounded first result.
    emu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                            mean.data(), rstd.data(), s.R, s.C);
    Floats rdx2 = widen(dinp1);  // (R, C)
    cpu_backward(rdx2, rdw, rdb);
    expect_rounded(dinp, rdx2);
    expect_same_bits(dw, rdw);
    expect_same_bits(db, rdb);
    expect_added_twice(widen(dinp0), widen(dinp1), widen(dinp), 0x1p-8);
    expect_added_twice(dw0, dw1, dw, kRtolF32Sum);
    expect_added_twice(db0, db1, db, kRtolF32Sum);

    // Without dinp only the parameter gradients are produced, the same ones.
    Floats dw_only = dw0, db_only = db0;
    emu::layernorm_backward(nullptr, dw_only.data(), db_only.data(), dout.data(), inp.data(),
                            w.data(), mean.data(), rstd.data(), s.R, s.C);
    expect_same_bits(dw_only, dw1);
    expect_same_bits(db_only, db1);
  }
}

// ---------------------------------------------------------------------------------------------
// Attention: an fp64 model of attention.cu's bf16 path, independent of src/ops/emu.

struct AttentionShape {
  Index B, N, H, D;
};
const AttentionShape kAttentionShapes[] = {{3, 17, 3, 12}, {3, 50, 4, 25}};

double attention_scale(Index D) {
  return double(1.0f / std::sqrt(float(D)));  // the kernels' fp32 scale
}

struct AttentionForwardModel {
  Expect att, out;
};

// att (B, H, N, N) and out (B, N, C) from qkv (B, N, 3C); the probabilities rounded to bf16
// before P @ V when round_p (the CUDA path), kept exact otherwise (a control).
AttentionForwardModel attention_forward_model(const Floats& qkv, const AttentionShape& s,
                                              bool round_p) {
  const Index N = s.N, D = s.D, C = s.H * D, C3 = 3 * C;
  const double scale = attention_scale(D);
  AttentionForwardModel m{Expect(s.B * s.H * N * N), Expect(s.B * N * C)};
  std::vector<double> sc(len(N)), sc_abs(len(N)), pr(len(N)), gap(len(N));  // (N)
  for (Index b = 0; b < s.B; ++b) {
    for (Index h = 0; h < s.H; ++h) {
      const float* q = qkv.data() + b * N * C3 + h * D;  // (N, D), row stride 3C
      const float* k = q + C;
      const float* v = q + 2 * C;
      for (Index i = 0; i < N; ++i) {
        for (Index j = 0; j < N; ++j) {
          double dot = 0, dot_abs = 0;
          for (Index d = 0; d < D; ++d) {
            dot += double(q[i * C3 + d]) * k[j * C3 + d];
            dot_abs += std::abs(double(q[i * C3 + d]) * k[j * C3 + d]);
          }
          sc[j] = scale * dot;
          sc_abs[j] = scale * dot_abs;
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        const double sabs = *std::max_element(sc_abs.begin(), sc_abs.end());
        double sum = 0;
        for (Index j = 0; j < N; ++j) sum += std::exp(sc[j] - mx);
        for (Index j = 0; j < N; ++j) {
          const Index a = ((b * s.H + h) * N + i) * N + j;
          const double p = std::exp(sc[j] - mx) / sum;
          // Score errors (<= kNoise * sabs each) move p by at most twice that, relative.
          m.att.value[a] = p;
          m.att.abs[a] = p;
          m.att.noise[a] = kNoise * p * (1.0 + 2.0 * sabs);
          pr[j] = round_p ? rounded(p) : p;
          gap[j] = round_p ? ambiguity(p, m.att.noise[a]) : 0.0;
        }
        for (Index d = 0; d < D; ++d) {
          double o = 0, o_abs = 0, o_amb = 0;
          for (Index j = 0; j < N; ++j) {
            o += pr[j] * v[j * C3 + d];
            o_abs += std::abs(pr[j] * v[j * C3 + d]);
            o_amb += gap[j] * std::abs(v[j * C3 + d]);
          }
          const Index e = (b * N + i) * C + h * D + d;
          m.out.value[e] = o;
          m.out.abs[e] = o_abs;
          m.out.noise[e] = kNoise * o_abs + o_amb;
        }
      }
    }
  }
  return m;
}

// dqkv (B, N, 3C) from qkv (B, N, 3C), dout (B, N, C) and the stored att (B, H, N, N); dS
// rounded to bf16 before the dQ / dK products when round_ds (the CUDA path).
Expect attention_backward_model(const Floats& qkv, const Floats& dout, const Floats& att,
                                const AttentionShape& s, bool round_ds) {
  const Index N = s.N, D = s.D, C = s.H * D, C3 = 3 * C;
  const double scale = attention_scale(D);
  Expect m(s.B * N * C3);
  std::vector<double> ds(len(N * N)),
      gap(len(N * N));             // (N, N) one head
  std::vector<double> dp(len(N));  // (N) one row
  auto put = [&](Index e, double value, double abs, double amb) {
    m.value[size_t(e)] = value;
    m.abs[size_t(e)] = abs;
    m.noise[size_t(e)] = kNoise * abs + amb;
  };
  for (Index b = 0; b < s.B; ++b) {
    for (Index h = 0; h < s.H; ++h) {
      const float* q = qkv.data() + b * N * C3 + h * D;  // (N, D), row stride 3C
      const float* k = q + C;
      const float* v = q + 2 * C;
      const float* dO = dout.data() + b * N * C + h * D;    // (N, D), row stride C
      const float* P = att.data() + (b * s.H + h) * N * N;  // (N, N)
      for (Index i = 0; i < N; ++i) {
        double amax = 0, dot = 0;  // amax: the largest sum of |terms| of a dP in the row
        for (Index j = 0; j < N; ++j) {
          double acc = 0, acc_abs = 0;
          for (Index d = 0; d < D; ++d) {
            acc += double(dO[i * C + d]) * v[j * C3 + d];
            acc_abs += std::abs(double(dO[i * C + d]) * v[j * C3 + d]);
          }
          dp[j] = acc;
          amax = std::max(amax, acc_abs);
          dot += P[i * N + j] * acc;
        }
        for (Index j = 0; j < N; ++j) {
          const double p = P[i * N + j], x = p * (dp[j] - dot) * scale;
          // dP and the row dot carry at most (D + N) 2^-24 amax < kNoise * amax.
          const double noise = kNoise * (p * scale * amax + std::abs(x));
          ds[i * N + j] = round_ds ? rounded(x) : x;
          gap[i * N + j] = round_ds ? ambiguity(x, noise) : 0.0;
        }
      }
      for (Index r = 0; r < N; ++r) {
        for (Index d = 0; d < D; ++d) {
          double dq = 0, dq_abs = 0, dq_amb = 0, dk = 0, dk_abs = 0, dk_amb = 0, dv = 0, dv_abs = 0;
          for (Index t = 0; t < N; ++t) {
            const double kd = k[t * C3 + d], qd = q[t * C3 + d];
            dq += ds[r * N + t] * kd;  // dQ = dS K
            dq_abs += std::abs(ds[r * N + t] * kd);
            dq_amb += gap[r * N + t] * std::abs(kd);
            dk += ds[t * N + r] * qd;  // dK = dS^T Q
            dk_abs += std::abs(ds[t * N + r] * qd);
            dk_amb += gap[t * N + r] * std::abs(qd);
            dv += double(P[t * N + r]) * dO[t * C + d];  // dV = P^T dO
            dv_abs += std::abs(double(P[t * N + r]) * dO[t * C + d]);
          }
          const Index e = (b * N + r) * C3 + h * D + d;
          put(e, dq, dq_abs, dq_amb);
          put(e + C, dk, dk_abs, dk_amb);
          put(e + 2 * C, dv, dv_abs, 0.0);
        }
      }
    }
  }
  return m;
}

TEST(EmuOps, AttentionForwardRoundsProbabilities) {
  for (const auto& s : kAttentionShapes) {
    SCOPED_TRACE("B " + std::to_string(s.B) + " N " + std::to_string(s.N) + " H " +
                 std::to_string(s.H) + " D " + std::to_string(s.D));
    const Index C = s.H * s.D;
    Gen g(6);
    const Bf16s qkv = g.bf16s(s.B * s.N * 3 * C, -2, 2);  // (B, N, 3C): scores of a few units
    Bf16s out = nans(s.B * s.N * C);                      // (B, N, C)
    Bf16s att = nans(s.B * s.H * s.N * s.N);              // (B, H, N, N)
    emu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.N, s.H, s.D);

    // (a) att is the rounded softmax, out the rounded product of the ROUNDED probabilities.
    const Floats qkv32 = widen(qkv);
    const AttentionForwardModel m = attention_forward_model(qkv32, s, true);
    expect_rounds_from(att, m.att);
    expect_rounds_from(out, m.out);
    // The check tells the rounding points apart: P @ V with exact probabilities fails it.
    EXPECT_GT(count_not_rounding_from(out, attention_forward_model(qkv32, s, false).out), 0u);

    // (b) against the fp32 CPU op. att: one rounding of a value <= 1 (atol 1e-7: fp32 noise
    // of the softmax, for the tiny probabilities); out: see expect_close_to_terms.
    Floats ref_out(out.size()), ref_att(att.size());  // (B, N, C), (B, H, N, N)
    cpu::attention_forward(ref_out.data(), ref_att.data(), qkv32.data(), s.B, s.N, s.H, s.D);
    expect_close(att, ref_att, kRtol, 1e-7);
    expect_close_to_terms(out, ref_out, m.out);
  }
}

TEST(EmuOps, AttentionBackwardRoundsDs) {
  for (const auto& s : kAttentionShapes) {
    SCOPED_TRACE("B " + std::to_string(s.B) + " N " + std::to_string(s.N) + " H " +
                 std::to_string(s.H) + " D " + std::to_string(s.D));
    const Index C = s.H * s.D;
    Gen g(7);
    const Bf16s qkv = g.bf16s(s.B * s.N * 3 * C, -2, 2);  // (B, N, 3C)
    const Bf16s dout = g.bf16s(s.B * s.N * C, -1, 1);     // (B, N, C)
    Bf16s out(len(s.B * s.N * C));                        // (B, N, C)
    Bf16s att(len(s.B * s.H * s.N * s.N));                // (B, H, N, N)
    emu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.N, s.H, s.D);
    Bf16s dqkv = nans(s.B * s.N * 3 * C);  // (B, N, 3C)
    emu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.N, s.H, s.D);

    // (a) dV from the stored P, dQ and dK from the ROUNDED dS, each rounded once.
    const Floats qkv32 = widen(qkv), dout32 = widen(dout), att32 = widen(att);
    const Expect m = attention_backward_model(qkv32, dout32, att32, s, true);
    expect_rounds_from(dqkv, m);
    // The check tells the rounding points apart: dQ, dK from the exact dS fail it.
    EXPECT_GT(
        count_not_rounding_from(dqkv, attention_backward_model(qkv32, dout32, att32, s, false)),
        0u);

    // (b) against the fp32 CPU op on the same inputs (the same bf16 probabilities).
    Floats ref(dqkv.size());  // (B, N, 3C)
    cpu::attention_backward(ref.data(), dout32.data(), qkv32.data(), att32.data(), s.B, s.N, s.H,
                            s.D);
    expect_close_to_terms(dqkv, ref, m);
  }
}

// ---------------------------------------------------------------------------------------------
// Elementwise activations

using EmuUnary = void (*)(bf16*, const bf16*, Index);
using EmuBinary = void (*)(bf16*, const bf16*, const bf16*, Index);
using CpuUnary = void (*)(float*, const float*, Index);
using CpuBinary = void (*)(float*, const float*, const float*, Index);

void check_activation(EmuUnary emu_fwd, CpuUnary cpu_fwd, EmuBinary emu_bwd, CpuBinary cpu_bwd) {
  const Index n = 3 * 17 * 36;  // (B, N, C)
  Gen g(8);
  const Bf16s x = g.bf16s(n, -5, 5);   // (n), beyond h-swish's kinks at +-3
  const Bf16s dy = g.bf16s(n, -1, 1);  // (n)
  Bf16s y = nans(n), dx = nans(n);     // (n)
  emu_fwd(y.data(), x.data(), n);
  emu_bwd(dx.data(), dy.data(), x.data(), n);
  Floats ry(len(n)), rdx(len(n));  // (n)
  cpu_fwd(ry.data(), widen(x).data(), n);
  cpu_bwd(rdx.data(), widen(dy).data(), widen(x).data(), n);
  expect_rounded(y, ry);
  expect_close(y, ry, kRtol, 0.0);
  expect_rounded(dx, rdx);
  expect_close(dx, rdx, kRtol, 0.0);
}

TEST(EmuOps, Gelu) {
  check_activation(&emu::gelu_forward, &cpu::gelu_forward<float>, &emu::gelu_backward,
                   &cpu::gelu_backward<float>);
}

TEST(EmuOps, GeluTanh) {
  check_activation(&emu::gelu_tanh_forward, &cpu::gelu_tanh_forward<float>,
                   &emu::gelu_tanh_backward, &cpu::gelu_tanh_backward<float>);
}

TEST(EmuOps, Hswish) {
  check_activation(&emu::hswish_forward, &cpu::hswish_forward<float>, &emu::hswish_backward,
                   &cpu::hswish_backward<float>);
}

TEST(EmuOps, Relu) {
  check_activation(&emu::relu_forward, &cpu::relu_forward<float>, &emu::relu_backward,
                   &cpu::relu_backward<float>);
}

// ---------------------------------------------------------------------------------------------
// Depthwise convolution

struct GridShape {
  Index N, prefix, gh, gw;
};
const GridShape kGridShapes[] = {{17, 1, 4, 4}, {50, 0, 5, 10}, {50, 1, 7, 7}};

std::string grid_trace(const GridShape& s) {
  return "N " + std::to_string(s.N) + " prefix " + std::to_string(s.prefix);
}

TEST(EmuOps, Dwconv) {
  const Index B = 3, C = 36;
  for (const auto& s : kGridShapes) {
    SCOPED_TRACE(grid_trace(s));
    const Index n = B * s.N * C;
    Gen g(9);
    const Bf16s x = g.bf16s(n, -1, 1);          // (B, N, C)
    const Bf16s w = g.bf16s(C * 9, -1, 1);      // (C, 1, 3, 3)
    const Bf16s dy = g.bf16s(n, -1, 1);         // (B, N, C)
    const Floats dw0 = g.floats(C * 9, -1, 1);  // (C, 1, 3, 3)
    Bf16s y = nans(n), dx = nans(n);            // (B, N, C)
    Floats dw = dw0;
    emu::dwconv3x3_forward(y.data(), x.data(), w.data(), B, s.N, s.prefix, s.gh, s.gw, C);
    emu::dwconv3x3_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), B, s.N, s.prefix,
                            s.gh, s.gw, C);
    const Floats dw1 = dw;
    emu::dwconv3x3_backward(nullptr, dw.data(), dy.data(), x.data(), w.data(), B, s.N, s.prefix,
                            s.gh, s.gw, C);

    const Floats x32 = widen(x), w32 = widen(w), dy32 = widen(dy);
    Floats ry(len(n)), rdx(len(n)), rdw = dw0;  // (B, N, C), (B, N, C), (C, 1, 3, 3)
    cpu::dwconv3x3_forward(ry.data(), x32.data(), w32.data(), B, s.N, s.prefix, s.gh, s.gw, C);
    cpu::dwconv3x3_backward(rdx.data(), rdw.data(), dy32.data(), x32.data(), w32.data(), B, s.N,
                            s.prefix, s.gh, s.gw, C);
    expect_rounded(y, ry);  // prefix rows included: 0 in the reference
    expect_close(y, ry, kRtol, 0.0);
    expect_rounded(dx, rdx);
    expect_close(dx, rdx, kRtol, 0.0);
    expect_same_bits(dw1, rdw);
    expect_added_twice(dw0, dw1, dw, kRtolF32Sum);
  }
  Bf16s y(len(3 * 17 * C)), x(y.size()), w(len(9 * C));  // (B, N, C) x2, (C, 1, 3, 3)
  EXPECT_THROW(emu::dwconv3x3_forward(y.data(), x.data(), w.data(), 3, 17, 0, 4, 4, C), Error);
}

// ---------------------------------------------------------------------------------------------
// Patch embedding and tokens

TEST(EmuOps, Im2patchesIsACopy) {
  const Index B = 3, Cin = 3, Himg = 16, Wimg = 20, P = 4;
  const Index np = B * (Himg / P) * (Wimg / P) * Cin * P * P;
  Gen g(10);
  const Bf16s img = g.bf16s(B * Cin * Himg * Wimg, -1, 1);  // (B, Cin, Himg, Wimg)
  Bf16s patches = nans(np);                                 // (B, gh*gw, Cin*P*P)
  emu::im2patches(patches.data(), img.data(), B, Cin, Himg, Wimg, P);
  Floats ref(len(np));  // (B, gh*gw, Cin*P*P)
  cpu::im2patches(ref.data(), widen(img).data(), B, Cin, Himg, Wimg, P);
  expect_rounded(patches, ref);  // (b) is exactness here: a copy rounds nothing
}

// The conv stem's 3x3 stride-2 conv: im2col is a copy from either layout; col2im sums up to
// four taps in fp32 (the CPU op's order) and rounds once.
TEST(EmuOps, Im2colIsACopyAndCol2imRoundsOnce) {
  const Index B = 2, H = 9, W = 6, C = 5, n_in = B * H * W * C, n_cols = B * 5 * 3 * C * 9;
  Gen g(12);
  const Bf16s x = g.bf16s(n_in, -1, 1);        // (B, H, W, C) or (B, C, H, W)
  const Bf16s dcols = g.bf16s(n_cols, -1, 1);  // (B, Ho, Wo, C*9)
  for (const bool nchw : {false, true}) {
    Bf16s cols = nans(n_cols);  // (B, Ho, Wo, C*9)
    emu::im2col3x3s2(cols.data(), x.data(), B, H, W, C, nchw);
    Floats ref(len(n_cols));
    cpu::im2col3x3s2(ref.data(), widen(x).data(), B, H, W, C, nchw);
    expect_rounded(cols, ref);  // exact
  }
  Bf16s dx = nans(n_in);  // (B, H, W, C)
  emu::col2im3x3s2(dx.data(), dcols.data(), B, H, W, C);
  Floats rdx(len(n_in));
  cpu::col2im3x3s2(rdx.data(), widen(dcols).data(), B, H, W, C);
  expect_rounded(dx, rdx);
  expect_close(dx, rdx, kRtol, 0.0);
}

TEST(EmuOps, EmbedTokens) {
  const Index B = 3, C = 36;
  for (const auto& s : kGridShapes) {
    SCOPED_TRACE(grid_trace(s));
    const Index np = s.N - s.prefix;
    Gen g(11);
    const Bf16s patch = g.bf16s(B * np * C, -1, 1);  // (B, N - prefix, C)
    const Bf16s cls = g.bf16s(C, -1, 1);             // (C)
    const Bf16s pos = g.bf16s(s.N * C, -1, 1);       // (N, C)
    const Bf16s dx = g.bf16s(B * s.N * C, -1, 1);    // (B, N, C)
    const Floats dcls0 = g.floats(C, -1, 1), dpos0 = g.floats(s.N * C, -1, 1);
    const bf16* cls_p = s.prefix > 0 ? cls.data() : nullptr;
    Bf16s x = nans(B * s.N * C), dpatch = nans(B * np * C);  // (B, N, C), (B, N - prefix, C)
    Floats dcls = dcls0, dpos = dpos0;
    emu::embed_tokens_forward(x.data(), patch.data(), cls_p, pos.data(), B, s.N, s.prefix, C);
    emu::embed_tokens_backward(dpatch.data(), dcls.data(), dpos.data(), dx.data(), B, s.N, s.prefix,
                               C);
    const Floats dcls1 = dcls, dpos1 = dpos;
    emu::embed_tokens_backward(nullptr, dcls.data(), dpos.data(), dx.data(), B, s.N, s.prefix, C);

    const Floats patch32 = widen(patch), cls32 = widen(cls), dx32 = widen(dx);
    // (B, N, C), (B, N - prefix, C), (C), (N, C)
    Floats rx(x.size()), rdpatch(dpatch.size()), rdcls = dcls0, rdpos = dpos0;
    cpu::embed_tokens_forward(rx.data(), patch32.data(), s.prefix > 0 ? cls32.data() : nullptr,
                              widen(pos).data(), B, s.N, s.prefix, C);
    cpu::embed_tokens_backward(rdpatch.data(), rdcls.data(), rdpos.data(), dx32.data(), B, s.N,
                               s.prefix, C);
    expect_rounded(x, rx);
    expect_close(x, rx, kRtol, 0.0);
    expect_rounded(dpatch, rdpatch);  // a copy
    expect_same_bits(dcls1, rdcls);   // untouched without a class token
    expect_same_bits(dpos1, rdpos);
    if (s.prefix > 0) expect_added_twice(dcls0, dcls1, dcls, kRtolF32Sum);
    expect_added_twice(dpos0, dpos1, dpos, kRtolF32Sum);
  }
}

// ---------------------------------------------------------------------------------------------
// Residual

TEST(EmuOps, Residual) {
  const Index B = 3, S = 17, C = 100, n = B * S * C;
  for (bool use_gamma : {true, false}) {
    for (bool use_scale : {true, false}) {
      SCOPED_TRACE("gamma " + std::to_string(use_gamma) + " scale " + std::to_string(use_scale));
      Gen g(12);
      const Bf16s x = g.bf16s(n, -1, 1);                // (B, S, C)
      const Bf16s branch = g.bf16s(n, -1, 1);           // (B, S, C)
      const Bf16s dy = g.bf16s(n, -1, 1);               // (B, S, C)
      const Bf16s gamma = g.bf16s(C, 0.05, 1);          // (C)
      const Floats scale = {0.0f, 1.0f / 0.9f, 1.25f};  // (B) drop-path: dropped, kept, kept
      const Floats dg0 = g.floats(C, -1, 1);            // (C)
      const bf16* gp = use_gamma ? gamma.data() : nullptr;
      const float* sp = use_scale ? scale.data() : nullptr;
      Bf16s y = nans(n), db = nans(n);  // (B, S, C)
      Floats dg = dg0;
      emu::residual_forward(y.data(), x.data(), branch.data(), gp, sp, B, S, C);
      Bf16s inplace = x;  // out aliasing x, as the model calls it
      emu::residual_forward(inplace.data(), inplace.data(), branch.data(), gp, sp, B, S, C);
      emu::residual_backward(db.data(), dg.data(), dy.data(), branch.data(), gp, sp, B, S, C);
      const Floats dg1 = dg;
      emu::residual_backward(nullptr, dg.data(), dy.data(), branch.data(), gp, sp, B, S, C);

      const Floats gamma32 = widen(gamma), branch32 = widen(branch), dy32 = widen(dy);
      const float* gp32 = use_gamma ? gamma32.data() : nullptr;
      Floats ry(len(n)), rdb(len(n)), rdg = dg0;  // (B, S, C), (B, S, C), (C)
      cpu::residual_forward(ry.data(), widen(x).data(), branch32.data(), gp32, sp, B, S, C);
      cpu::residual_backward(rdb.data(), rdg.data(), dy32.data(), branch32.data(), gp32, sp, B, S,
                             C);
      expect_rounded(y, ry);
      expect_close(y, ry, kRtol, 0.0);
      expect_rounded(inplace, ry);
      expect_rounded(db, rdb);
      expect_close(db, rdb, kRtol, 0.0);
      expect_same_bits(dg1, rdg);
      expect_added_twice(dg0, dg1, dg, kRtolF32Sum);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pooling

TEST(EmuOps, PoolForward) {
  const Index B = 3, C = 36;
  for (const auto& s : kGridShapes) {
    for (bool avg : {true, false}) {
      SCOPED_TRACE(grid_trace(s) + " avg " + std::to_string(avg));
      Gen g(13);
      const Bf16s x = g.bf16s(B * s.N * C, -1, 1);  // (B, N, C)
      Bf16s out = nans(B * C);                      // (B, C)
      emu::pool_forward(out.data(), x.data(), B, s.N, s.prefix, C, avg);
      Floats ref(len(B * C));  // (B, C)
      cpu::pool_forward(ref.data(), widen(x).data(), B, s.N, s.prefix, C, avg);
      expect_rounded(out, ref);
      expect_close(out, ref, kRtol, 0.0);
    }
  }
}

TEST(EmuOps, PoolBackwardAccumulates) {
  const Index B = 3, C = 36;
  for (const auto& s : kGridShapes) {
    for (bool avg : {true, false}) {
      SCOPED_TRACE(grid_trace(s) + " avg " + std::to_string(avg));
      const Index n = B * s.N * C;
      Gen g(14);
      const Bf16s dout = g.bf16s(B * C, -1, 1);  // (B, C)
      const Bf16s dx0 = g.bf16s(n, -0.1, 0.1);   // (B, N, C) the residual-stream gradient
      Bf16s dx = dx0;
      emu::pool_backward(dx.data(), dout.data(), B, s.N, s.prefix, C, avg);
      const Bf16s dx1 = dx;
      emu::pool_backward(dx.data(), dout.data(), B, s.N, s.prefix, C, avg);
      // (a) each call: round(old bf16 value + fp32 share); (b) the first against the fp32 sum.
      const Floats dout32 = widen(dout);
      Floats r1 = widen(dx0), r2 = widen(dx1);  // (B, N, C)
      cpu::pool_backward(r1.data(), dout32.data(), B, s.N, s.prefix, C, avg);
      cpu::pool_backward(r2.data(), dout32.data(), B, s.N, s.prefix, C, avg);
      expect_rounded(dx1, r1);
      expect_close(dx1, r1, kRtol, 0.0);
      expect_rounded(dx, r2);
      expect_added_twice(widen(dx0), widen(dx1), widen(dx), 0x1p-8);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

TEST(EmuOps, CrossEntropy) {
  const Index B = 3, K = 37;
  Gen g(15);
  Bf16s logits = g.bf16s(B * K, -8, 8);  // (B, K)
  for (Index k = 0; k < K; ++k) logits[size_t(2 * K + k)] = bf16(float(k % 2 ? 80 : -80));
  Floats targets = g.floats(B * K, 0, 1);  // (B, K) soft targets, rows summing to 1
  for (Index b = 0; b < B; ++b) {
    float sum = 0;
    for (Index k = 0; k < K; ++k) sum += targets[size_t(b * K + k)];
    for (Index k = 0; k < K; ++k) targets[size_t(b * K + k)] /= sum;
  }
  Floats losses(len(B)), probs(len(B * K));  // (B), (B, K)
  emu::cross_entropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), B, K);
  const float dloss = 1.0f / 3.0f;
  Bf16s dlogits = nans(B * K);  // (B, K)
  emu::cross_entropy_backward(dlogits.data(), probs.data(), targets.data(), dloss, B, K);

  // fp32 outputs: the CPU op's bits, so (b) holds with no tolerance at all.
  // (B), (B, K), (B, K)
  Floats rlosses(len(B)), rprobs(len(B * K)), rdlogits(len(B * K));
  cpu::cross_entropy_forward(rlosses.data(), rprobs.data(), widen(logits).data(), targets.data(), B,
                             K);
  cpu::cross_entropy_backward(rdlogits.data(), rprobs.data(), targets.data(), dloss, B, K);
  expect_same_bits(losses, rlosses);
  expect_same_bits(probs, rprobs);
  expect_rounded(dlogits, rdlogits);
  expect_close(dlogits, rdlogits, kRtol, 0.0);
}

}  // namespace
}  // namespace vit
