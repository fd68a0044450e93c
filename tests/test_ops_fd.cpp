// Every CPU backward in float64 against central finite differences of L = sum(dout * out), plus
// checks that parameter gradients accumulate (+=) and input gradients overwrite as ops.h says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/cpu/ops.h"

namespace {

using vit::Index;
using Vec = std::vector<double>;
using namespace vit::cpu;

Vec randn(Index n, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  vit::Rng rng(seed);
  Vec v(n);
  for (auto& x : v) x = shift + scale * rng.normal();
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic gradient `grad` of the scalar `loss()` with respect to `x` (modified in place
// and restored) at up to ~60 evenly spread elements.
void check_grad(const std::string& what, Vec& x, const Vec& grad,
                const std::function<double()>& loss, double h = 1e-6) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  const size_t stride = std::max<size_t>(1, x.size() / 60);
  for (size_t i = 0; i < x.size(); i += stride) {
    const double saved = x[i];
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    const double numeric = (lp - lm) / (2 * h);
    EXPECT_NEAR(grad[i], numeric, 1e-6 + 1e-6 * std::fabs(numeric)) << what << "[" << i << "]";
  }
}

// Accumulating outputs start from `prefill`; returns grad = result - prefill.
Vec minus(const Vec& a, const Vec& b) {
  Vec r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

TEST(OpsFd, Matmul) {
  const Index M = 7, K = 5, N = 6;
  Vec inp = randn(M * K, 1), w = randn(N * K, 2), b = randn(N, 3), dout = randn(M * N, 4);
  Vec out(M * N);
  auto loss = [&] {
    matmul_forward(out.data(), inp.data(), w.data(), b.data(), M, K, N);
    return dot(out, dout);
  };
  loss();
  for (Index m = 0; m < M; ++m)  // forward against a naive triple loop
    for (Index n = 0; n < N; ++n) {
      double s = b[n];
      for (Index k = 0; k < K; ++k) s += inp[m * K + k] * w[n * K + k];
      EXPECT_NEAR(out[m * N + n], s, 1e-12);
    }
  const Vec pre_w = randn(N * K, 5), pre_b = randn(N, 6);
  Vec dinp(M * K, NAN), dw = pre_w, db = pre_b;
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), M, K, N);
  check_grad("matmul.dinp", inp, dinp, loss);
  check_grad("matmul.dw", w, minus(dw, pre_w), loss);
  check_grad("matmul.db", b, minus(db, pre_b), loss);
  // dinp may be skipped.
  Vec dw2(N * K, 0.0);
  matmul_backward<double>(nullptr, dw2.data(), nullptr, dout.data(), inp.data(), w.data(), M, K, N);
  for (Index i = 0; i < N * K; ++i) EXPECT_NEAR(dw2[i], dw[i] - pre_w[i], 1e-12);
}

TEST(OpsFd, LayerNorm) {
  const Index R = 5, C = 9;
  Vec x = randn(R * C, 1, 2.0, 0.3), w = randn(C, 2, 0.2, 1.0), b = randn(C, 3),
      dout = randn(R * C, 4);
  Vec out(R * C), mean(R), rstd(R);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C,
                      1e-6);
    return dot(out, dout);
  };
  loss();
  const Vec pre_x = randn(R * C, 5), pre_w = randn(C, 6), pre_b = randn(C, 7);
  Vec dx = pre_x, dw = pre_w, db = pre_b;  // all three accumulate
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), R, C);
  check_grad("layernorm.dinp", x, minus(dx, pre_x), loss);
  check_grad("layernorm.dw", w, minus(dw, pre_w), loss);
  check_grad("layernorm.db", b, minus(db, pre_b), loss);
}

TEST(OpsFd, LayerNormHostileRowsInFloat) {
  // Mean 1e3, std 1e-2: the normalised fp32 output must still have mean 0 and variance 1.
  const Index R = 4, C = 64;
  vit::Rng rng(9);
  std::vector<float> x(R * C), out(R * C), mean(R), rstd(R), w(C, 1.0f), b(C, 0.0f);
  for (auto& v : x) v = float(1e3 + 1e-2 * rng.normal());
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C,
                    1e-6f);
  for (Index r = 0; r < R; ++r) {
    // Exact target from the fp32 inputs in double: the output variance is var / (var + eps),
    // about 0.99 here since eps 1e-6 is 1% of var 1e-4.
    double xm = 0, xv = 0;
    for (Index c = 0; c < C; ++c) xm += x[r * C + c];
    xm /= C;
    for (Index c = 0; c < C; ++c) xv += (x[r * C + c] - xm) * (x[r * C + c] - xm);
    xv /= C;
    double m = 0, v = 0;
    for (Index c = 0; c < C; ++c) m += out[r * C + c];
    m /= C;
    for (Index c = 0; c < C; ++c) v += (out[r * C + c] - m) * (out[r * C + c] - m);
    v /= C;
    EXPECT_NEAR(m, 0.0, 1e-4) << "row " << r;
    EXPECT_NEAR(v, xv / (xv + 1e-6), 1e-4) << "row " << r;
    EXPECT_GT(v, 0.95) << "row " << r;  // a fp32 mean would lose most of the spread
  }
}

void attention_fd(Index B, Index N, Index H, Index D) {
  const Index C = H * D;
  Vec qkv = randn(B * N * 3 * C, 11), dout = randn(B * N * C, 12);
  Vec out(B * N * C), att(B * H * N * N);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, N, H, D);
    return dot(out, dout);
  };
  loss();
  // Forward against a naive softmax(q k^T / sqrt(D)) v.
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < N; ++i) {
        std::vector<double> s(N);
        double mx = -1e300, sum = 0;
        for (Index j = 0; j < N; ++j) {
          double d = 0;
          for (Index k = 0; k < D; ++k)
            d += qkv[(b * N + i) * 3 * C + h * D + k] * qkv[(b * N + j) * 3 * C + C + h * D + k];
          s[j] = d / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (Index k = 0; k < D; ++k) {
          double o = 0;
          for (Index j = 0; j < N; ++j)
            o += s[j] / sum * qkv[(b * N + j) * 3 * C + 2 * C + h * D + k];
          EXPECT_NEAR(out[(b * N + i) * C + h * D + k], o, 1e-12);
        }
      }
  Vec dqkv(qkv.size(), NAN);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, N, H, D);
  check_grad("attention.dqkv", qkv, dqkv, loss);
}

TEST(OpsFd, Attention) {
  attention_fd(2, 5, 2, 4);
}
TEST(OpsFd, AttentionOddTokens) {
  attention_fd(1, 17, 3, 8);
}

TEST(OpsFd, Activations) {
  const Index n = 200;
  Vec x(n), dout = randn(n, 2);
  for (Index i = 0; i < n; ++i) x[i] = -5.0 + 10.0 * (i + 0.37) / n;  // avoids +-3 exactly
  Vec out(n);
  enum class Act { kGelu, kGeluTanh, kHswish };
  for (const Act act : {Act::kGelu, Act::kGeluTanh, Act::kHswish}) {
    auto loss = [&] {
      if (act == Act::kGelu)
        gelu_forward(out.data(), x.data(), n);
      else if (act == Act::kGeluTanh)
        gelu_tanh_forward(out.data(), x.data(), n);
      else
        hswish_forward(out.data(), x.data(), n);
      return dot(out, dout);
    };
    loss();
    for (Index i = 0; i < n; ++i) {
      const double v = x[i];
      const double want =
          act == Act::kGelu ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
          : act == Act::kGeluTanh
              ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
              : v * std::min(std::max(v + 3, 0.0), 6.0) / 6;
      EXPECT_NEAR(out[i], want, 1e-12);
    }
    Vec dx(n, NAN);
    if (act == Act::kGelu)
      gelu_backward(dx.data(), dout.data(), x.data(), n);
    else if (act == Act::kGeluTanh)
      gelu_tanh_backward(dx.data(), dout.data(), x.data(), n);
    else
      hswish_backward(dx.data(), dout.data(), x.data(), n);
    check_grad(act == Act::kGelu       ? "gelu"
               : act == Act::kGeluTanh ? "gelu_tanh"
                                       : "hswish",
               x, dx, loss);
  }
}

TEST(OpsFd, ActivationsFloatFastPathAccuracy) {
  // The float instantiation uses vectorised exp/erf approximations: stay within 2e-7 abs.
  const Index n = 4001;
  std::vector<float> x(n), out(n), dx(n), ones(n, 1.0f);
  for (Index i = 0; i < n; ++i) x[i] = float(-10.0 + 20.0 * i / (n - 1));
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dx.data(), ones.data(), x.data(), n);
  for (Index i = 0; i < n; ++i) {
    const double v = x[i];
    const double cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
    EXPECT_NEAR(out[i], v * cdf, 2e-6 * std::max(1.0, std::fabs(v))) << v;
    const double d = cdf + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    EXPECT_NEAR(dx[i], d, 2e-6) << v;
  }
}

void dwconv_fd(Index B, Index prefix, Index gh, Index gw, Index C) {
  const Index N = prefix + gh * gw;
  Vec x = randn(B * N * C, 21), w = randn(C * 9, 22, 0.5), dout = randn(B * N * C, 23);
  Vec out(B * N * C);
  auto loss = [&] {
    dwconv3x3_forward(out.data(), x.data(), w.data(), B, N, prefix, gh, gw, C);
    return dot(out, dout);
  };
  loss();
  for (Index b = 0; b < B; ++b)  // naive zero-padded conv; prefix rows are 0
    for (Index n = 0; n < N; ++n)
      for (Index c = 0; c < C; ++c) {
        double s = 0;
        if (n >= prefix) {
          const Index y = (n - prefix) / gw, xx = (n - prefix) % gw;
          for (int ky = 0; ky < 3; ++ky)
            for (int kx = 0; kx < 3; ++kx) {
              const Index sy = y + ky - 1, sx = xx + kx - 1;
              if (sy < 0 || sy >= gh || sx < 0 || sx >= gw) continue;
              s += w[c * 9 + ky * 3 + kx] * x[(b * N + prefix + sy * gw + sx) * C + c];
            }
        }
        EXPECT_NEAR(out[(b * N + n) * C + c], s, 1e-12);
      }
  const Vec pre_w = randn(C * 9, 24);
  Vec dx(x.size(), NAN), dw = pre_w;
  dwconv3x3_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), B, N, prefix, gh, gw,
                     C);
  check_grad("dwconv.dinp", x, dx, loss);
  check_grad("dwconv.dw", w, minus(dw, pre_w), loss);
}

TEST(OpsFd, DwConvClassToken) {
  dwconv_fd(2, 1, 4, 4, 5);
}
TEST(OpsFd, DwConvRectangular) {
  dwconv_fd(1, 0, 3, 5, 7);
}

// The conv stem's 3x3 stride-2 padding-1 conv as the model runs it (im2col + GEMM forward,
// GEMM backward + col2im), against a naive conv and finite differences of the input (channels-
// last) and the weight (Co, Ci, 3, 3).
void conv3x3s2_fd(Index B, Index H, Index W, Index Ci, Index Co) {
  const Index Ho = (H + 1) / 2, Wo = (W + 1) / 2, R = B * Ho * Wo, F = Ci * 9;
  Vec x = randn(B * H * W * Ci, 41), w = randn(Co * F, 42, 0.3), dout = randn(R * Co, 43);
  Vec cols(R * F), out(R * Co);
  auto loss = [&] {
    im2col3x3s2(cols.data(), x.data(), B, H, W, Ci, false);
    matmul_forward<double>(out.data(), cols.data(), w.data(), nullptr, R, F, Co);
    return dot(out, dout);
  };
  loss();
  for (Index b = 0; b < B; ++b)  // naive zero-padded stride-2 conv, channels-last
    for (Index ho = 0; ho < Ho; ++ho)
      for (Index wo = 0; wo < Wo; ++wo)
        for (Index co = 0; co < Co; ++co) {
          double s = 0;
          for (Index ci = 0; ci < Ci; ++ci)
            for (Index kh = 0; kh < 3; ++kh)
              for (Index kw = 0; kw < 3; ++kw) {
                const Index h = 2 * ho - 1 + kh, ww = 2 * wo - 1 + kw;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                s += w[((co * Ci + ci) * 3 + kh) * 3 + kw] * x[((b * H + h) * W + ww) * Ci + ci];
              }
          EXPECT_NEAR(out[((b * Ho + ho) * Wo + wo) * Co + co], s, 1e-12);
        }
  const Vec pre_w = randn(Co * F, 44);
  Vec dcols(R * F), dx(x.size(), NAN), dw = pre_w;
  matmul_backward<double>(dcols.data(), dw.data(), nullptr, dout.data(), cols.data(), w.data(), R,
                          F, Co);
  col2im3x3s2(dx.data(), dcols.data(), B, H, W, Ci);
  check_grad("conv3x3s2.dinp", x, dx, loss);
  check_grad("conv3x3s2.dw", w, minus(dw, pre_w), loss);
}

TEST(OpsFd, Conv3x3Stride2) {
  conv3x3s2_fd(2, 6, 8, 3, 4);
}
TEST(OpsFd, Conv3x3Stride2OddSides) {
  conv3x3s2_fd(1, 7, 5, 2, 3);
}

// col2im is im2col's adjoint: <im2col(x), c> == <x, col2im(c)> for any x, c; and the NCHW
// im2col of an image equals the channels-last im2col of the same image transposed.
TEST(OpsFd, Col2ImIsTheAdjointOfIm2Col) {
  const Index B = 2, H = 9, W = 6, C = 5, n_cols = B * 5 * 3 * C * 9;
  const Vec x = randn(B * H * W * C, 51), c = randn(n_cols, 52);
  Vec cols(n_cols), xt(B * C * H * W), cols_t(n_cols), back(x.size(), NAN);
  im2col3x3s2(cols.data(), x.data(), B, H, W, C, false);
  col2im3x3s2(back.data(), c.data(), B, H, W, C);
  EXPECT_NEAR(dot(cols, c), dot(x, back), 1e-10 * std::sqrt(double(n_cols)));
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index w = 0; w < W; ++w)
        for (Index ch = 0; ch < C; ++ch)
          xt[((b * C + ch) * H + h) * W + w] = x[((b * H + h) * W + w) * C + ch];
  im2col3x3s2(cols_t.data(), xt.data(), B, H, W, C, true);
  EXPECT_EQ(cols_t, cols);
}

TEST(OpsFd, Relu) {
  const Index n = 101;
  Vec x(n), dout = randn(n, 61), out(n);
  for (Index i = 0; i < n; ++i) x[i] = -2.0 + 4.0 * (i + 0.31) / n;  // no exact zero
  auto loss = [&] {
    relu_forward(out.data(), x.data(), n);
    return dot(out, dout);
  };
  loss();
  for (Index i = 0; i < n; ++i) EXPECT_EQ(out[i], std::max(x[i], 0.0));
  Vec dx(n, NAN);
  relu_backward(dx.data(), dout.data(), x.data(), n);
  check_grad("relu", x, dx, loss);
  // In place, masking by the output: the same gradient.
  Vec y = x, dy = dout;
  relu_forward(y.data(), y.data(), n);
  relu_backward(dy.data(), dy.data(), y.data(), n);
  EXPECT_EQ(dy, dx);
}

TEST(OpsFd, Im2Patches) {
  const Index B = 2, Cin = 3, S = 8, P = 4, g = S / P;
  Vec img = randn(B * Cin * S * S, 31), patches(B * g * g * Cin * P * P);
  im2patches(patches.data(), img.data(), B, Cin, S, S, P);
  for (Index b = 0; b < B; ++b)
    for (Index py = 0; py < g; ++py)
      for (Index px = 0; px < g; ++px)
        for (Index c = 0; c < Cin; ++c)
          for (Index i = 0; i < P; ++i)
            for (Index j = 0; j < P; ++j)
              EXPECT_EQ(patches[((b * g + py) * g + px) * Cin * P * P + (c * P + i) * P + j],
                        img[((b * Cin + c) * S + py * P + i) * S + px * P + j]);
}

TEST(OpsFd, EmbedTokens) {
  for (const Index prefix : {Index(0), Index(1)}) {
    const Index B = 2, N = prefix + 4, C = 3;
    Vec patch = randn(B * (N - prefix) * C, 41), cls = randn(C, 42), pos = randn(N * C, 43),
        dout = randn(B * N * C, 44), x(B * N * C);
    auto loss = [&] {
      embed_tokens_forward(x.data(), patch.data(), prefix ? cls.data() : nullptr, pos.data(), B, N,
                           prefix, C);
      return dot(x, dout);
    };
    loss();
    const Vec pre_cls = randn(C, 45), pre_pos = randn(N * C, 46);
    Vec dpatch(patch.size(), NAN), dcls = pre_cls, dpos = pre_pos;
    embed_tokens_backward(dpatch.data(), prefix ? dcls.data() : nullptr, dpos.data(), dout.data(),
                          B, N, prefix, C);
    check_grad("embed.dpatch", patch, dpatch, loss);
    check_grad("embed.dpos", pos, minus(dpos, pre_pos), loss);
    if (prefix) check_grad("embed.dcls", cls, minus(dcls, pre_cls), loss);
  }
}

TEST(OpsFd, Residual) {
  const Index B = 3, S = 4, C = 5;
  Vec x = randn(B * S * C, 51), br = randn(B * S * C, 52), g = randn(C, 53),
      dout = randn(B * S * C, 54), out(B * S * C);
  const Vec scale = {0.0, 1.25, 1.25};
  for (const bool with_gamma : {false, true}) {
    auto loss = [&] {
      residual_forward(out.data(), x.data(), br.data(), with_gamma ? g.data() : nullptr,
                       scale.data(), B, S, C);
      return dot(out, dout);
    };
    loss();
    for (Index i = 0; i < B * S * C; ++i)
      EXPECT_NEAR(out[i], x[i] + scale[i / (S * C)] * (with_gamma ? g[i % C] : 1.0) * br[i], 1e-12);
    const Vec pre_g = randn(C, 55);
    Vec dbr(br.size(), NAN), dg = pre_g;
    residual_backward(dbr.data(), with_gamma ? dg.data() : nullptr, dout.data(), br.data(),
                      with_gamma ? g.data() : nullptr, scale.data(), B, S, C);
    check_grad("residual.dbranch", br, dbr, loss);
    if (with_gamma) check_grad("residual.dgamma", g, minus(dg, pre_g), loss);
  }
}

TEST(OpsFd, Pool) {
  const Index B = 2, N = 5, C = 3;
  for (const Index prefix : {Index(0), Index(1)})
    for (const bool avg : {false, true}) {
      if (!avg && prefix == 0) continue;  // token pooling needs a class token
      Vec x = randn(B * N * C, 61), dout = randn(B * C, 62), out(B * C);
      auto loss = [&] {
        pool_forward(out.data(), x.data(), B, N, prefix, C, avg);
        return dot(out, dout);
      };
      loss();
      const Vec pre = randn(B * N * C, 63);
      Vec dx = pre;  // accumulates
      pool_backward(dx.data(), dout.data(), B, N, prefix, C, avg);
      check_grad(avg ? "pool.avg" : "pool.token", x, minus(dx, pre), loss);
    }
}

TEST(OpsFd, CrossEntropy) {
  const Index B = 4, K = 6;
  Vec z = randn(B * K, 71, 3.0), t(B * K), losses(B), probs(B * K);
  vit::Rng rng(72);
  for (Index b = 0; b < B; ++b) {  // soft targets summing to 1
    double s = 0;
    for (Index k = 0; k < K; ++k) s += (t[b * K + k] = rng.uniform());
    for (Index k = 0; k < K; ++k) t[b * K + k] /= s;
  }
  auto loss = [&] {
    cross_entropy_forward(losses.data(), probs.data(), z.data(), t.data(), B, K);
    double s = 0;
    for (double l : losses) s += l;
    return s / B;
  };
  loss();
  for (Index b = 0; b < B; ++b) {
    double lse = 0, l = 0;
    for (Index k = 0; k < K; ++k) lse += std::exp(z[b * K + k]);
    for (Index k = 0; k < K; ++k) l -= t[b * K + k] * (z[b * K + k] - std::log(lse));
    EXPECT_NEAR(losses[b], l, 1e-12);
  }
  Vec dz(B * K, NAN);
  cross_entropy_backward(dz.data(), probs.data(), t.data(), 1.0 / B, B, K);
  check_grad("cross_entropy", z, dz, loss);
}

TEST(OpsFd, CrossEntropyLogitsNear80InFloat) {
  const Index B = 2, K = 4;
  std::vector<float> z = {80.0f, -80.0f, 79.5f, 0.0f, -80.0f, -79.0f, 80.0f, 80.0f};
  std::vector<float> t = {0, 0, 1, 0, 0.5f, 0.5f, 0, 0}, losses(B), probs(B * K), dz(B * K);
  cross_entropy_forward(losses.data(), probs.data(), z.data(), t.data(), B, K);
  cross_entropy_backward(dz.data(), probs.data(), t.data(), 1.0f, B, K);
  for (float v : losses) EXPECT_TRUE(std::isfinite(v));
  for (float v : dz) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(losses[0], 0.5 + std::log1p(std::exp(-0.5)), 1e-5);  // -log softmax at 79.5
  EXPECT_NEAR(losses[1], 0.5 * (160 + 159) + std::log(2.0), 1e-3);
}

}  // namespace
