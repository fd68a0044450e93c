// Every CPU op (fp32) against PyTorch (fp64 from the same fp32 inputs), forward and backward,
// on random and hostile inputs: tests/reference/torch_ref.py writes ops.safetensors (the ctest
// fixture `torch_reference` runs it first).
//
// Error metric per tensor: max |ours - torch| / max(max |torch|, 1e-30), i.e. the worst error at
// the tensor's own scale. Tolerances, per op:
//   1e-5  ops with reductions (matmul/BLAS, LayerNorm incl. the hostile rows, attention,
//         depthwise conv, the stem's 3x3 stride-2 conv as im2col + GEMM): fp32 sums of up to a
//         few hundred terms; measured errors are ~1e-7.
//   1e-6  elementwise ops and short sums (GELU, tanh GELU, h-swish, residual, token assembly,
//         average pooling, cross-entropy): a few fp32 roundings plus the exp/erf approximations.
//   0     pure data movement (im2patches, im2col3x3s2, ReLU, class-token pooling, dpatch of the
//         token assembly).
// The whole conv stem (several ops in a row) is tests/test_conv_stem_torch.cpp.
// Every output is checked for NaN/Inf. Outputs the op overwrites start as NaN, so an element it
// fails to write is caught; outputs it accumulates into (parameter gradients, LayerNorm and
// pooling dinp) start from a known nonzero pattern that is subtracted before the comparison, so
// "accumulate" versus "overwrite" is checked too.
//
// A missing reference file fails the tests, unless VIT_ALLOW_MISSING_REFERENCE is set, which
// skips them instead (for builds without PyTorch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "ops/cpu/ops.h"

namespace {

using vit::Index;
using Vec = std::vector<float>;

const std::string kRefPath = std::string(VIT_REFERENCE_DIR) + "/ops.safetensors";

const vit::io::SafeTensors& ref() {
  static const vit::io::SafeTensors st = vit::io::read_safetensors(kRefPath);
  return st;
}
Vec get(const std::string& name) {
  return ref().at(name).to_f32();
}
// The integer sizes of a case, stored as F32 in <case>.dims.
std::vector<Index> dims(const std::string& c) {
  std::vector<Index> d;
  for (const float v : get(c + ".dims")) d.push_back(static_cast<Index>(v));
  return d;
}

class OpsTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::filesystem::exists(kRefPath)) return;
    if (std::getenv("VIT_ALLOW_MISSING_REFERENCE") != nullptr)
      GTEST_SKIP() << "no PyTorch reference at " << kRefPath
                   << " (VIT_ALLOW_MISSING_REFERENCE is set; run tests/reference/torch_ref.py)";
    FAIL() << "missing PyTorch reference " << kRefPath
           << ": run `/usr/bin/python3 tests/reference/torch_ref.py --out " << VIT_REFERENCE_DIR
           << "` (ctest runs it as the torch_reference fixture), or set "
              "VIT_ALLOW_MISSING_REFERENCE=1 to skip";
  }
};

// An output the op overwrites: starts as NaN.
Vec overwritten(size_t n) {
  return Vec(n, std::numeric_limits<float>::quiet_NaN());
}

// An output the op accumulates into: starts from a nonzero pattern at the scale of the expected
// values; value() subtracts it again.
struct Accum {
  Vec buf;
  std::vector<double> base;
  explicit Accum(const std::string& ref_name) {
    const std::vector<double> want = ref().at(ref_name).to_f64();
    double scale = 0;
    for (const double w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i) {
      buf.push_back(static_cast<float>(0.25 * scale * std::sin(1.0 + 0.7 * double(i))));
      base.push_back(buf.back());
    }
  }
  float* data() { return buf.data(); }
  std::vector<double> value() const {
    std::vector<double> v(buf.size());
    for (size_t i = 0; i < buf.size(); ++i) v[i] = double(buf[i]) - base[i];
    return v;
  }
};

// Compares ours with torch's tensor `name` (NaN/Inf first), prints the error.
void expect_close(const std::vector<double>& ours, const std::string& name, double tol) {
  const std::vector<double> want = ref().at(name).to_f64();
  ASSERT_EQ(ours.size(), want.size()) << name;
  double max_ref = 0, max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_TRUE(std::isfinite(ours[i])) << name << "[" << i << "] = " << ours[i];
    max_ref = std::max(max_ref, std::fabs(want[i]));
    const double e = std::fabs(ours[i] - want[i]);
    if (e > max_err) max_err = e, worst = i;
  }
  const double rel = max_err / std::max(max_ref, 1e-30);
  EXPECT_LE(rel, tol) << name << ": max abs err " << max_err << " at [" << worst << "] (ours "
                      << ours[worst] << ", torch " << want[worst] << "), scale " << max_ref;
  std::printf("  %-32s rel err %.2e (tol %.0e)\n", name.c_str(), rel, tol);
}
void expect_close(const Vec& ours, const std::string& name, double tol) {
  expect_close(std::vector<double>(ours.begin(), ours.end()), name, tol);
}
void expect_close(const Accum& ours, const std::string& name, double tol) {
  expect_close(ours.value(), name, tol);
}

constexpr double kReduce = 1e-5, kElem = 1e-6, kExact = 0.0;

TEST_F(OpsTorch, Matmul) {
  const Vec inp = get("matmul.inp"), w = get("matmul.w"), b = get("matmul.b"),
            dout = get("matmul.dout");
  const auto d = dims("matmul");
  const Index M = d[0], K = d[1], N = d[2];
  Vec out = overwritten(M * N), dinp = overwritten(M * K);
  Accum dw("matmul.dw"), db("matmul.db");
  vit::cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), M, K, N);
  vit::cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), M,
                            K, N);
  expect_close(out, "matmul.out", kReduce);
  expect_close(dinp, "matmul.dinp", kReduce);
  expect_close(dw, "matmul.dw", kReduce);
  expect_close(db, "matmul.db", kReduce);

  // nullptr gradient outputs are skipped (the patch embedding needs no dinp); no bias.
  Accum dw2("matmul.dw");
  vit::cpu::matmul_backward<float>(nullptr, dw2.data(), nullptr, dout.data(), inp.data(), w.data(),
                                   M, K, N);
  expect_close(dw2, "matmul.dw", kReduce);
  Vec out_nb = overwritten(M * N);
  vit::cpu::matmul_forward<float>(out_nb.data(), inp.data(), w.data(), nullptr, M, K, N);
  std::vector<double> with_bias(out.begin(), out.end());
  double max_diff = 0;
  for (Index i = 0; i < M * N; ++i)
    max_diff = std::max(max_diff, std::fabs(double(out_nb[i]) + b[i % N] - with_bias[i]));
  EXPECT_LE(max_diff, 1e-5) << "matmul_forward without bias";
}

void layernorm_case(const std::string& c, double tol) {
  const Vec x = get(c + ".inp"), w = get(c + ".w"), b = get(c + ".b"), dout = get(c + ".dout");
  const auto d = dims(c);
  const Index R = d[0], C = d[1];
  Vec out = overwritten(R * C), mean = overwritten(R), rstd = overwritten(R);
  Accum dinp(c + ".dinp"), dw(c + ".dw"), db(c + ".db");
  vit::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R,
                              C, 1e-6f);
  vit::cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                               mean.data(), rstd.data(), R, C);
  expect_close(out, c + ".out", tol);
  expect_close(mean, c + ".mean", tol);
  expect_close(rstd, c + ".rstd", tol);
  expect_close(dinp, c + ".dinp", tol);
  expect_close(dw, c + ".dw", tol);
  expect_close(db, c + ".db", tol);
}

TEST_F(OpsTorch, LayerNorm) {
  layernorm_case("layernorm", kReduce);
}
// Rows with mean 1e3 and std 1e-2 (both sides see the same fp32 inputs). A one-pass fp32
// E[x^2] - E[x]^2, or an fp32 mean, would be off by ~1e-3 here; the same 1e-5 still holds.
TEST_F(OpsTorch, LayerNormHostile) {
  layernorm_case("layernorm_hostile", kReduce);
}

void attention_case(const std::string& c) {
  const Vec qkv = get(c + ".qkv"), dout = get(c + ".dout");
  const auto d = dims(c);
  const Index B = d[0], N = d[1], H = d[2], D = d[3];
  Vec out = overwritten(B * N * H * D), att = overwritten(B * H * N * N),
      dqkv = overwritten(qkv.size());
  vit::cpu::attention_forward(out.data(), att.data(), qkv.data(), B, N, H, D);
  vit::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, N, H, D);
  expect_close(out, c + ".out", kReduce);
  expect_close(att, c + ".att", kReduce);
  expect_close(dqkv, c + ".dqkv", kReduce);
}

TEST_F(OpsTorch, AttentionN197) {
  attention_case("attention");
}
TEST_F(OpsTorch, AttentionOddSizes) {
  attention_case("attention_odd");
}

TEST_F(OpsTorch, Gelu) {
  const Vec x = get("gelu.inp"), dout = get("gelu.dout");
  Vec out = overwritten(x.size()), dinp = overwritten(x.size());
  vit::cpu::gelu_forward(out.data(), x.data(), Index(x.size()));
  vit::cpu::gelu_backward(dinp.data(), dout.data(), x.data(), Index(x.size()));
  expect_close(out, "gelu.out", kElem);
  expect_close(dinp, "gelu.dinp", kElem);
}

TEST_F(OpsTorch, GeluTanh) {
  const Vec x = get("gelu_tanh.inp"), dout = get("gelu_tanh.dout");
  Vec out = overwritten(x.size()), dinp = overwritten(x.size());
  vit::cpu::gelu_tanh_forward(out.data(), x.data(), Index(x.size()));
  vit::cpu::gelu_tanh_backward(dinp.data(), dout.data(), x.data(), Index(x.size()));
  expect_close(out, "gelu_tanh.out", kElem);
  expect_close(dinp, "gelu_tanh.dinp", kElem);
}

TEST_F(OpsTorch, HSwish) {
  const Vec x = get("hswish.inp"), dout = get("hswish.dout");
  Vec out = overwritten(x.size()), dinp = overwritten(x.size());
  vit::cpu::hswish_forward(out.data(), x.data(), Index(x.size()));
  vit::cpu::hswish_backward(dinp.data(), dout.data(), x.data(), Index(x.size()));
  expect_close(out, "hswish.out", kElem);
  expect_close(dinp, "hswish.dinp", kElem);
}

void dwconv_case(const std::string& c) {
  const Vec x = get(c + ".inp"), w = get(c + ".w"), dout = get(c + ".dout");
  const auto d = dims(c);
  const Index B = d[0], N = d[1], prefix = d[2], gh = d[3], gw = d[4], C = d[5];
  ASSERT_EQ(N, prefix + gh * gw);
  Vec out = overwritten(x.size()), dinp = overwritten(x.size());
  Accum dw(c + ".dw");
  vit::cpu::dwconv3x3_forward(out.data(), x.data(), w.data(), B, N, prefix, gh, gw, C);
  vit::cpu::dwconv3x3_backward(dinp.data(), dw.data(), dout.data(), x.data(), w.data(), B, N,
                               prefix, gh, gw, C);
  expect_close(out, c + ".out", kReduce);    // prefix rows must be written as 0
  expect_close(dinp, c + ".dinp", kReduce);  // prefix rows must be written as 0
  expect_close(dw, c + ".dw", kReduce);
}

TEST_F(OpsTorch, DwConvWithClassToken) {
  dwconv_case("dwconv");
}
TEST_F(OpsTorch, DwConvRectangularGrid) {
  dwconv_case("dwconv_rect");
}

TEST_F(OpsTorch, Im2Patches) {
  const Vec img = get("im2patches.img");
  const auto d = dims("im2patches");
  const Index B = d[0], Cin = d[1], H = d[2], W = d[3], P = d[4];
  Vec out = overwritten(img.size());
  vit::cpu::im2patches(out.data(), img.data(), B, Cin, H, W, P);
  expect_close(out, "im2patches.out", kExact);
}

void im2col_case(const std::string& c) {
  const auto d = dims(c);
  const Index B = d[0], H = d[1], W = d[2], C = d[3];
  const Index n = B * ((H + 1) / 2) * ((W + 1) / 2) * C * 9;
  Vec cols = overwritten(n), cols_nchw = overwritten(n);
  vit::cpu::im2col3x3s2(cols.data(), get(c + ".inp").data(), B, H, W, C, false);
  vit::cpu::im2col3x3s2(cols_nchw.data(), get(c + ".inp_nchw").data(), B, H, W, C, true);
  expect_close(cols, c + ".out", kExact);
  expect_close(cols_nchw, c + ".out", kExact);
}

TEST_F(OpsTorch, Im2Col3x3Stride2) {
  im2col_case("im2col");
}
TEST_F(OpsTorch, Im2Col3x3Stride2OddSides) {
  im2col_case("im2col_odd");
}

// The stem's conv as the model runs it: im2col + GEMM forward; GEMM backward + col2im.
void conv3x3s2_case(const std::string& c) {
  const Vec x = get(c + ".inp"), w = get(c + ".w"), dout = get(c + ".dout");
  const auto d = dims(c);
  const Index B = d[0], H = d[1], W = d[2], Ci = d[3], Co = d[4];
  const Index R = B * ((H + 1) / 2) * ((W + 1) / 2), F = Ci * 9;
  Vec cols = overwritten(R * F), dcols = overwritten(R * F), out = overwritten(R * Co);
  Vec dinp = overwritten(x.size());
  Accum dw(c + ".dw");
  vit::cpu::im2col3x3s2(cols.data(), x.data(), B, H, W, Ci, false);
  vit::cpu::matmul_forward<float>(out.data(), cols.data(), w.data(), nullptr, R, F, Co);
  vit::cpu::matmul_backward<float>(dcols.data(), dw.data(), nullptr, dout.data(), cols.data(),
                                   w.data(), R, F, Co);
  vit::cpu::col2im3x3s2(dinp.data(), dcols.data(), B, H, W, Ci);
  expect_close(out, c + ".out", kReduce);
  expect_close(dinp, c + ".dinp", kReduce);
  expect_close(dw, c + ".dw", kReduce);
}

TEST_F(OpsTorch, Conv3x3Stride2ChannelsLast) {
  conv3x3s2_case("conv3x3s2");
}
TEST_F(OpsTorch, Conv3x3Stride2OddSides) {
  conv3x3s2_case("conv3x3s2_odd");
}

TEST_F(OpsTorch, Conv3x3Stride2FromNchwImage) {
  const Vec img = get("conv3x3s2_nchw.img"), w = get("conv3x3s2_nchw.w"),
            dout = get("conv3x3s2_nchw.dout");
  const auto d = dims("conv3x3s2_nchw");
  const Index B = d[0], H = d[1], W = d[2], Ci = d[3], Co = d[4];
  const Index R = B * (H / 2) * (W / 2), F = Ci * 9;
  Vec cols = overwritten(R * F), out = overwritten(R * Co);
  Accum dw("conv3x3s2_nchw.dw");
  vit::cpu::im2col3x3s2(cols.data(), img.data(), B, H, W, Ci, true);
  vit::cpu::matmul_forward<float>(out.data(), cols.data(), w.data(), nullptr, R, F, Co);
  vit::cpu::matmul_backward<float>(nullptr, dw.data(), nullptr, dout.data(), cols.data(), w.data(),
                                   R, F, Co);
  expect_close(out, "conv3x3s2_nchw.out", kReduce);
  expect_close(dw, "conv3x3s2_nchw.dw", kReduce);
}

TEST_F(OpsTorch, Relu) {
  const Vec x = get("relu.inp"), dout = get("relu.dout");
  Vec out = overwritten(x.size()), dinp = overwritten(x.size());
  vit::cpu::relu_forward(out.data(), x.data(), Index(x.size()));
  vit::cpu::relu_backward(dinp.data(), dout.data(), x.data(), Index(x.size()));
  expect_close(out, "relu.out", kExact);
  expect_close(dinp, "relu.dinp", kExact);
  // In place, the backward masking by the output, as the stem runs it.
  Vec y = x, dy = dout;
  vit::cpu::relu_forward(y.data(), y.data(), Index(y.size()));
  vit::cpu::relu_backward(dy.data(), dy.data(), y.data(), Index(y.size()));
  expect_close(y, "relu.out", kExact);
  expect_close(dy, "relu.dinp", kExact);
}

void embed_case(const std::string& c) {
  const auto d = dims(c);
  const Index B = d[0], N = d[1], prefix = d[2], C = d[3];
  const Vec patch = get(c + ".patch"), pos = get(c + ".pos"), dout = get(c + ".dout");
  const Vec cls = prefix ? get(c + ".cls") : Vec();
  Vec x = overwritten(B * N * C), dpatch = overwritten(patch.size());
  Accum dpos(c + ".dpos");
  std::unique_ptr<Accum> dcls;
  if (prefix) dcls = std::make_unique<Accum>(c + ".dcls");
  vit::cpu::embed_tokens_forward(x.data(), patch.data(), prefix ? cls.data() : nullptr, pos.data(),
                                 B, N, prefix, C);
  vit::cpu::embed_tokens_backward(dpatch.data(), dcls ? dcls->data() : nullptr, dpos.data(),
                                  dout.data(), B, N, prefix, C);
  expect_close(x, c + ".out", kElem);
  expect_close(dpatch, c + ".dpatch", kExact);
  if (dcls) expect_close(*dcls, c + ".dcls", kElem);
  expect_close(dpos, c + ".dpos", kElem);
}

TEST_F(OpsTorch, EmbedTokensWithClassToken) {
  embed_case("embed");
}
TEST_F(OpsTorch, EmbedTokensWithoutClassToken) {
  embed_case("embed_nocls");
}

TEST_F(OpsTorch, ResidualWithLayerScaleAndDropPath) {
  const Vec x = get("residual.x"), br = get("residual.br"), g = get("residual.g"),
            s = get("residual.scale"), dout = get("residual.dout");
  const auto d = dims("residual");
  const Index B = d[0], S = d[1], C = d[2];
  Vec out = overwritten(x.size()), dbr = overwritten(x.size());
  Accum dg("residual.dg");
  vit::cpu::residual_forward(out.data(), x.data(), br.data(), g.data(), s.data(), B, S, C);
  vit::cpu::residual_backward(dbr.data(), dg.data(), dout.data(), br.data(), g.data(), s.data(), B,
                              S, C);
  expect_close(out, "residual.out", kElem);
  expect_close(dbr, "residual.dbr", kElem);
  expect_close(dg, "residual.dg", kElem);

  // In place (out aliases x), as the model uses it.
  Vec inplace = x;
  vit::cpu::residual_forward(inplace.data(), inplace.data(), br.data(), g.data(), s.data(), B, S,
                             C);
  expect_close(inplace, "residual.out", kElem);
}

TEST_F(OpsTorch, ResidualPlain) {
  const Vec x = get("residual_plain.x"), br = get("residual_plain.br"),
            dout = get("residual_plain.dout");
  const auto d = dims("residual_plain");
  const Index B = d[0], S = d[1], C = d[2];
  Vec out = overwritten(x.size()), dbr = overwritten(x.size());
  vit::cpu::residual_forward<float>(out.data(), x.data(), br.data(), nullptr, nullptr, B, S, C);
  vit::cpu::residual_backward<float>(dbr.data(), nullptr, dout.data(), br.data(), nullptr, nullptr,
                                     B, S, C);
  expect_close(out, "residual_plain.out", kElem);
  expect_close(dbr, "residual_plain.dbr", kExact);
}

TEST_F(OpsTorch, Pooling) {
  for (const std::string c : {"pool_token", "pool_avg", "pool_avg_nocls"}) {
    const Vec x = get(c + ".x"), dout = get(c + ".dout");
    const auto d = dims(c);
    const Index B = d[0], N = d[1], prefix = d[2], C = d[3];
    const bool avg = d[4] != 0;
    Vec out = overwritten(B * C);
    Accum dx(c + ".dx");
    vit::cpu::pool_forward(out.data(), x.data(), B, N, prefix, C, avg);
    vit::cpu::pool_backward(dx.data(), dout.data(), B, N, prefix, C, avg);
    expect_close(out, c + ".out", avg ? kElem : kExact);
    expect_close(dx, c + ".dx", kElem);
  }
}

TEST_F(OpsTorch, CrossEntropySoftTargets) {
  for (const std::string c : {"cross_entropy", "cross_entropy_hostile"}) {
    const Vec z = get(c + ".logits"), t = get(c + ".targets");
    const auto d = dims(c);
    const Index B = d[0], K = d[1];
    Vec losses = overwritten(B), probs = overwritten(B * K), dz = overwritten(B * K);
    vit::cpu::cross_entropy_forward(losses.data(), probs.data(), z.data(), t.data(), B, K);
    vit::cpu::cross_entropy_backward(dz.data(), probs.data(), t.data(), 1.0f / float(B), B, K);
    expect_close(losses, c + ".losses", kElem);
    expect_close(probs, c + ".probs", kElem);
    expect_close(dz, c + ".dlogits", kElem);
  }
}

}  // namespace
