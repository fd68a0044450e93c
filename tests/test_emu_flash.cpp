// The bf16 emulation of the fused attention (src/ops/emu/flash_attention.cpp) on bf16 inputs:
//  (a) rounding points, against an fp64 model of flash_attention.cu written here: the forward
//      rounds the UNNORMALISED probabilities exp2(s - running max) of each key tile for P @ V
//      (the running sum adds them unrounded) and rounds out once; the backward recomputes P
//      from lse, rounds it for dV and rounds dS for dQ and dK, with Drow = rowsum(dO * out)
//      over the stored out. Controls show the check tells these points apart: exact P, one
//      tile over all keys, exact dS each fail it.
//  (b) closeness to the fp32 CPU reference (the unfused op) within bf16 tolerances.
// Helpers and the Expect bookkeeping: emu_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "emu_test_util.h"
#include "ops/attention_choice.h"
#include "ops/cpu/ops.h"
#include "ops/emu/ops.h"

namespace vit {
namespace {

using namespace emu_test;

struct Shape {
  Index B, N, H, D;
};
// One tile (any head dim: the emulation has no kernel restrictions), three tiles with a ragged
// 2-row last one, and a 1-row last tile.
const Shape kShapes[] = {{2, 17, 3, 12}, {2, 130, 2, 32}, {1, 65, 2, 48}};

std::string str(const Shape& s) {
  return "B " + std::to_string(s.B) + " N " + std::to_string(s.N) + " H " + std::to_string(s.H) +
         " D " + std::to_string(s.D);
}

constexpr float kLog2e = 1.4426950408889634f;
// The kernels' fp32 constants: log2(e) / sqrt(D) in the forward, 1 / sqrt(D) in the backward.
double forward_scale_log2(Index D) {
  return double(kLog2e / std::sqrt(float(D)));
}
double backward_scale(Index D) {
  return double(1.0f / std::sqrt(float(D)));
}

// Raw scores of one (b, h): s (N, N) = q k^T and sabs the sums of |terms|, in fp64.
void head_scores(std::vector<double>& s, std::vector<double>& sabs, const float* q, const float* k,
                 Index ld, Index N, Index D) {
  s.assign(len(N * N), 0.0);
  sabs.assign(len(N * N), 0.0);
  for (Index i = 0; i < N; ++i)
    for (Index j = 0; j < N; ++j)
      for (Index d = 0; d < D; ++d) {
        const double t = double(q[i * ld + d]) * k[j * ld + d];
        s[i * N + j] += t;
        sabs[i * N + j] += std::abs(t);
      }
}

struct ForwardModel {
  Expect out;
  std::vector<double> lse, lse_tol;  // (B, H, N)
};

// out (B, N, C) and lse (B, H, N) from qkv (B, N, 3C). Keys in tiles of `tile`; P rounded
// before P @ V when round_p (the kernels: tile = kFlashTile, round_p).
ForwardModel forward_model(const Floats& qkv, const Shape& sh, Index tile, bool round_p) {
  const Index N = sh.N, D = sh.D, C = sh.H * D, C3 = 3 * C;
  const double sl2 = forward_scale_log2(D);
  ForwardModel m{Expect(sh.B * N * C), std::vector<double>(len(sh.B * sh.H * N)),
                 std::vector<double>(len(sh.B * sh.H * N))};
  std::vector<double> s, sabs, pr(len(N)), gap(len(N)), w(len(N));  // w: rescale of key j
  for (Index b = 0; b < sh.B; ++b) {
    for (Index h = 0; h < sh.H; ++h) {
      const float* q = qkv.data() + b * N * C3 + h * D;  // q, k, v (N, D), row stride 3C
      const float* v = q + 2 * C;
      head_scores(s, sabs, q, q + C, C3, N, D);
      for (Index i = 0; i < N; ++i) {
        const double* si = s.data() + i * N;
        double mrun = -INFINITY, smax_abs = 0;
        std::vector<double> tile_max(len(N));  // running max after key j's tile
        for (Index j0 = 0; j0 < N; j0 += tile) {
          const Index j1 = std::min(N, j0 + tile);
          for (Index j = j0; j < j1; ++j) mrun = std::max(mrun, sl2 * si[j]);
          for (Index j = j0; j < j1; ++j) tile_max[j] = mrun;
        }
        for (Index j = 0; j < N; ++j) smax_abs = std::max(smax_abs, sl2 * sabs[i * N + j]);
        double l = 0;
        for (Index j = 0; j < N; ++j) {
          const double p = std::exp2(sl2 * si[j] - tile_max[j]);
          // Score and max errors (<= kNoise * smax_abs each) move p by at most twice that.
          const double noise = kNoise * p * (1.0 + 2.0 * smax_abs);
          pr[j] = round_p ? rounded(p) : p;
          gap[j] = round_p ? ambiguity(p, noise) : 0.0;
          w[j] = std::exp2(tile_max[j] - mrun);  // the later tiles' alpha factors
          l += p * w[j];
        }
        const Index r = (b * sh.H + h) * N + i;
        m.lse[r] = (mrun + std::log2(l)) * std::log(2.0);
        m.lse_tol[r] = kNoise * (1.0 + 2.0 * smax_abs);
        for (Index d = 0; d < D; ++d) {
          double o = 0, o_abs = 0, o_amb = 0;
          for (Index j = 0; j < N; ++j) {
            const double vd = v[j * C3 + d];
            o += pr[j] * w[j] * vd;
            o_abs += std::abs(pr[j] * w[j] * vd);
            o_amb += gap[j] * w[j] * std::abs(vd);
          }
          const Index e = (b * N + i) * C + h * D + d;
          m.out.value[e] = o / l;
          m.out.abs[e] = o_abs / l;
          m.out.noise[e] = kNoise * o_abs / l + o_amb / l;
        }
      }
    }
  }
  return m;
}

// dqkv (B, N, 3C) from qkv, dout, the stored out (B, N, C) and lse (B, H, N); dS rounded
// before dQ, dK when round_ds (the kernels). abs also counts what an error of Drow (from the
// rounded out) moves each term by, for the comparison with the unfused reference.
Expect backward_model(const Floats& qkv, const Floats& dout, const Floats& out, const Floats& lse,
                      const Shape& sh, bool round_ds) {
  const Index N = sh.N, D = sh.D, C = sh.H * D, C3 = 3 * C;
  const double scale = backward_scale(D), sl2 = double(float(scale) * kLog2e);
  Expect m(sh.B * N * C3);
  std::vector<double> s, sabs;
  std::vector<double> pr(len(N * N)), pgap(len(N * N)), ds(len(N * N)), dgap(len(N * N)),
      dext(len(N * N));  // (N, N) one head: P rounded, its ambiguity, dS, its ambiguity, Drow's
  for (Index b = 0; b < sh.B; ++b) {
    for (Index h = 0; h < sh.H; ++h) {
      const float* q = qkv.data() + b * N * C3 + h * D;  // q, k, v (N, D), row stride 3C
      const float* k = q + C;
      const float* v = q + 2 * C;
      const float* dO = dout.data() + b * N * C + h * D;  // dO, out (N, D), row stride C
      const float* o = out.data() + b * N * C + h * D;
      head_scores(s, sabs, q, k, C3, N, D);
      for (Index i = 0; i < N; ++i) {
        double drow = 0, drow_abs = 0, smax_abs = 0;
        for (Index d = 0; d < D; ++d) {
          drow += double(dO[i * C + d]) * o[i * C + d];
          drow_abs += std::abs(double(dO[i * C + d]) * o[i * C + d]);
        }
        for (Index j = 0; j < N; ++j) smax_abs = std::max(smax_abs, sl2 * sabs[i * N + j]);
        const double lse2 = double(float(lse[(b * sh.H + h) * N + i] * kLog2e));
        for (Index j = 0; j < N; ++j) {
          double dp = 0, dp_abs = 0;
          for (Index d = 0; d < D; ++d) {
            dp += double(dO[i * C + d]) * v[j * C3 + d];
            dp_abs += std::abs(double(dO[i * C + d]) * v[j * C3 + d]);
          }
          const Index e = i * N + j;
          const double p = std::exp2(sl2 * s[e] - lse2);
          const double pnoise = kNoise * p * (1.0 + 2.0 * smax_abs);
          pr[e] = rounded(p);
          pgap[e] = ambiguity(p, pnoise);
          const double x = p * (dp - drow) * scale;
          const double xnoise = kNoise * (p * scale * (dp_abs + drow_abs) + std::abs(x)) +
                                pnoise * std::abs(dp - drow) * scale;
          ds[e] = round_ds ? rounded(x) : x;
          dgap[e] = round_ds ? ambiguity(x, xnoise) : 0.0;
          dext[e] = p * scale * drow_abs;
        }
      }
      for (Index r = 0; r < N; ++r) {
        for (Index d = 0; d < D; ++d) {
          double dq = 0, dq_abs = 0, dq_amb = 0, dk = 0, dk_abs = 0, dk_amb = 0;
          double dv = 0, dv_abs = 0, dv_amb = 0;
          for (Index t = 0; t < N; ++t) {
            const double kd = k[t * C3 + d], qd = q[t * C3 + d], gd = dO[t * C + d];
            dq += ds[r * N + t] * kd;  // dQ = dS K
            dq_abs += (std::abs(ds[r * N + t]) + dext[r * N + t]) * std::abs(kd);
            dq_amb += dgap[r * N + t] * std::abs(kd);
            dk += ds[t * N + r] * qd;  // dK = dS^T Q
            dk_abs += (std::abs(ds[t * N + r]) + dext[t * N + r]) * std::abs(qd);
            dk_amb += dgap[t * N + r] * std::abs(qd);
            dv += pr[t * N + r] * gd;  // dV = P^T dO
            dv_abs += std::abs(pr[t * N + r] * gd);
            dv_amb += pgap[t * N + r] * std::abs(gd);
          }
          const Index e = (b * N + r) * C3 + h * D + d;
          const double vals[3] = {dq, dk, dv}, abss[3] = {dq_abs, dk_abs, dv_abs},
                       ambs[3] = {dq_amb, dk_amb, dv_amb};
          for (int part = 0; part < 3; ++part) {
            m.value[e + part * C] = vals[part];
            m.abs[e + part * C] = abss[part];
            m.noise[e + part * C] = kNoise * abss[part] + ambs[part];
          }
        }
      }
    }
  }
  return m;
}

struct FlashRun {
  Bf16s qkv, out;
  Floats lse;
};

FlashRun run_forward(const Shape& s, uint64_t seed) {
  const Index C = s.H * s.D;
  Gen g(seed);
  FlashRun r{g.bf16s(s.B * s.N * 3 * C, -2, 2), nans(s.B * s.N * C),
             Floats(len(s.B * s.H * s.N), std::nanf(""))};  // (B, N, 3C), (B, N, C), (B, H, N)
  emu::flash_attention_forward(r.out.data(), r.lse.data(), r.qkv.data(), s.B, s.N, s.H, s.D);
  return r;
}

TEST(EmuFlash, ForwardRoundsUnnormalisedTileProbabilities) {
  size_t one_tile_misses = 0;  // the one-tile control, over the shapes with several tiles
  for (const auto& s : kShapes) {
    SCOPED_TRACE(str(s));
    const FlashRun r = run_forward(s, 11);
    const Floats qkv32 = widen(r.qkv);

    // (a) out from P rounded per tile; lse the exact log-sum-exp up to fp32 noise.
    const ForwardModel m = forward_model(qkv32, s, kFlashTile, true);
    expect_rounds_from(r.out, m.out);
    for (size_t i = 0; i < m.lse.size(); ++i)
      ASSERT_NEAR(r.lse[i], m.lse[i], m.lse_tol[i]) << "lse " << i;
    // Controls: exact probabilities fail it, and so (with several tiles) does one tile.
    EXPECT_GT(count_not_rounding_from(r.out, forward_model(qkv32, s, kFlashTile, false).out), 0u);
    if (s.N > kFlashTile)
      one_tile_misses += count_not_rounding_from(r.out, forward_model(qkv32, s, s.N, true).out);

    // (b) against the fp32 CPU op (unfused): each rounded P moves its term by 2^-9 of it.
    Floats ref(r.out.size()), att(len(s.B * s.H * s.N * s.N));  // (B, N, C), (B, H, N, N)
    cpu::attention_forward(ref.data(), att.data(), qkv32.data(), s.B, s.N, s.H, s.D);
    expect_close_to_terms(r.out, ref, m.out);
  }
  EXPECT_GT(one_tile_misses, 0u) << "the per-tile rescaling is not what the check sees";
}

TEST(EmuFlash, BackwardRecomputesPAndRoundsDs) {
  for (const auto& s : kShapes) {
    SCOPED_TRACE(str(s));
    const Index C = s.H * s.D;
    const FlashRun r = run_forward(s, 12);
    Gen g(13);
    const Bf16s dout = g.bf16s(s.B * s.N * C, -1, 1);  // (B, N, C)
    Bf16s dqkv = nans(s.B * s.N * 3 * C);              // (B, N, 3C)
    emu::flash_attention_backward(dqkv.data(), dout.data(), r.qkv.data(), r.out.data(),
                                  r.lse.data(), s.B, s.N, s.H, s.D);

    // (a) dV from the rounded recomputed P, dQ and dK from the rounded dS, each rounded once.
    const Floats qkv32 = widen(r.qkv), dout32 = widen(dout), out32 = widen(r.out);
    const Expect m = backward_model(qkv32, dout32, out32, r.lse, s, true);
    expect_rounds_from(dqkv, m);
    EXPECT_GT(count_not_rounding_from(dqkv, backward_model(qkv32, dout32, out32, r.lse, s, false)),
              0u);

    // (b) against the fp32 CPU op with its own fp32 probabilities: the rounded P and dS move
    // each term by 2^-9 of it, the rounded out moves Drow by 2^-9 of its |terms| (in abs).
    Floats ref_out(out32.size()), att(len(s.B * s.H * s.N * s.N)), ref(dqkv.size());
    cpu::attention_forward(ref_out.data(), att.data(), qkv32.data(), s.B, s.N, s.H, s.D);
    cpu::attention_backward(ref.data(), dout32.data(), qkv32.data(), att.data(), s.B, s.N, s.H,
                            s.D);
    expect_close_to_terms(dqkv, ref, m);
  }
}

// The fused path is the unfused one in exact arithmetic: fed the same bf16 inputs the two
// emulations agree within the bf16 tolerance (and are not identical: they round differently).
TEST(EmuFlash, AgreesWithTheUnfusedEmulation) {
  const Shape s{2, 130, 2, 32};
  const FlashRun r = run_forward(s, 14);
  Bf16s out(r.out.size()), att(len(s.B * s.H * s.N * s.N));  // (B, N, C), (B, H, N, N)
  emu::attention_forward(out.data(), att.data(), r.qkv.data(), s.B, s.N, s.H, s.D);
  const ForwardModel m = forward_model(widen(r.qkv), s, kFlashTile, true);
  expect_close_to_terms(r.out, widen(out), m.out);
  EXPECT_NE(count_not_rounding_from(out, m.out), 0u) << "unfused rounds elsewhere";
}

}  // namespace
}  // namespace vit
