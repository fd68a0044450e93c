// Every CPU op (fp32) against PyTorch (fp64 from the same fp32 inputs), forward and backward,
// on random and hostile inputs: tests/reference/torch_ref.py writes ops.safetensors.
// Error metric per tensor: max |ours - torch| / max |torch| (a relative error at the tensor's
// scale), with a tolerance stated per op below.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "io/safetensors.h"
#include "ops/cpu/ops.h"

namespace {

using vit::Index;
using Vec = std::vector<float>;

const vit::io::SafeTensors& ref() {
  static const vit::io::SafeTensors st =
      vit::io::read_safetensors(std::string(VIT_REFERENCE_DIR) + "/ops.safetensors");
  return st;
}
Vec get(const std::string& name) { return ref().at(name).to_f32(); }
std::vector<Index> shape(const std::string& name) { return ref().at(name).shape; }

// Compares ours with torch's tensor `name`; checks NaN/Inf first.
void expect_close(const Vec& ours, const std::string& name, double tol) {
  const std::vector<double> want = ref().at(name).to_f64();
  ASSERT_EQ(ours.size(), want.size()) << name;
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_TRUE(std::isfinite(ours[i])) << name << "[" << i << "] = " << ours[i];
    max_ref = std::max(max_ref, std::fabs(want[i]));
    max_err = std::max(max_err, std::fabs(ours[i] - want[i]));
  }
  const double rel = max_err / std::max(max_ref, 1e-30);
  EXPECT_LE(rel, tol) << name << ": max abs err " << max_err << " at scale " << max_ref;
  std::printf("  %-32s rel err %.2e (tol %.0e)\n", name.c_str(), rel, tol);
}

TEST(OpsTorch, Matmul) {
  const Vec inp = get("matmul.inp"), w = get("matmul.w"), b = get("matmul.b"),
            dout = get("matmul.dout");
  const Index M = shape("matmul.inp")[0], K = shape("matmul.inp")[1], N = shape("matmul.w")[0];
  Vec out(M * N), dinp(M * K), dw(N * K, 0.0f), db(N, 0.0f);
  vit::cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), M, K, N);
  vit::cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                            M, K, N);
  expect_close(out, "matmul.out", 1e-6);
  expect_close(dinp, "matmul.dinp", 1e-6);
  expect_close(dw, "matmul.dw", 1e-6);
  expect_close(db, "matmul.db", 1e-6);
}

void layernorm_case(const std::string& c, double tol) {
  const Vec x = get(c + ".inp"), w = get(c + ".w"), b = get(c + ".b"), dout = get(c + ".dout");
  const Index R = shape(c + ".inp")[0], C = shape(c + ".inp")[1];
  Vec out(R * C), mean(R), rstd(R), dinp(R * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  vit::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                              R, C, 1e-6f);
  vit::cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                               mean.data(), rstd.data(), R, C);
  expect_close(out, c + ".out", tol);
  expect_close(dinp, c + ".dinp", tol);
  expect_close(dw, c + ".dw", tol);
  expect_close(db, c + ".db", tol);
}

TEST(OpsTorch, LayerNorm) { layernorm_case("layernorm", 2e-6); }
// Rows with mean 1e3 and std 1e-2: fp32 inputs carry only ~4 significant digits of the spread,
// which both sides see identically; the remaining error is ours.
TEST(OpsTorch, LayerNormHostile) { layernorm_case("layernorm_hostile", 1e-5); }

void attention_case(const std::string& c) {
  const Vec qkv = get(c + ".qkv"), dout = get(c + ".dout"), dims = get(c + ".dims");
  const Index B = Index(dims[0]), N = Index(dims[1]), H = Index(dims[2]), D = Index(dims[3]);
  Vec out(B * N * H * D), att(B * H * N * N), dqkv(qkv.size());
  vit::cpu::attention_forward(out.data(), att.data(), qkv.data(), B, N, H, D);
  vit::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, N, H, D);
  expect_close(out, c + ".out", 2e-6);
  expect_close(dqkv, c + ".dqkv", 2e-6);
}

TEST(OpsTorch, AttentionN197) { attention_case("attention"); }
TEST(OpsTorch, AttentionOddSizes) { attention_case("attention_odd"); }

TEST(OpsTorch, Gelu) {
  const Vec x = get("gelu.inp"), dout = get("gelu.dout");
  Vec out(x.size()), dinp(x.size());
  vit::cpu::gelu_forward(out.data(), x.data(), Index(x.size()));
  vit::cpu::gelu_backward(dinp.data(), dout.data(), x.data(), Index(x.size()));
  expect_close(out, "gelu.out", 1e-6);
  expect_close(dinp, "gelu.dinp", 1e-6);
}

TEST(OpsTorch, HSwish) {
  const Vec x = get("hswish.inp"), dout = get("hswish.dout");
  Vec out(x.size()), dinp(x.size());
  vit::cpu::hswish_forward(out.data(), x.data(), Index(x.size()));
  vit::cpu::hswish_backward(dinp.data(), dout.data(), x.data(), Index(x.size()));
  expect_close(out, "hswish.out", 1e-6);
  expect_close(dinp, "hswish.dinp", 1e-6);
}

void dwconv_case(const std::string& c) {
  const Vec x = get(c + ".inp"), w = get(c + ".w"), dout = get(c + ".dout"), d = get(c + ".dims");
  const Index B = Index(d[0]), prefix = Index(d[1]), gh = Index(d[2]), gw = Index(d[3]),
              C = Index(d[4]), N = prefix + gh * gw;
  Vec out(x.size()), dinp(x.size()), dw(w.size(), 0.0f);
  vit::cpu::dwconv3x3_forward(out.data(), x.data(), w.data(), B, N, prefix, gh, gw, C);
  vit::cpu::dwconv3x3_backward(dinp.data(), dw.data(), dout.data(), x.data(), w.data(), B, N,
                               prefix, gh, gw, C);
  expect_close(out, c + ".out", 1e-6);
  expect_close(dinp, c + ".dinp", 1e-6);
  expect_close(dw, c + ".dw", 1e-6);
}

TEST(OpsTorch, DwConvWithClassToken) { dwconv_case("dwconv"); }
TEST(OpsTorch, DwConvRectangularGrid) { dwconv_case("dwconv_rect"); }

TEST(OpsTorch, Im2Patches) {
  const Vec img = get("im2patches.img");
  Vec out(img.size());
  vit::cpu::im2patches(out.data(), img.data(), 2, 3, 32, 32, 4);
  expect_close(out, "im2patches.out", 0.0);
}

TEST(OpsTorch, EmbedTokens) {
  const Vec patch = get("embed.patch"), cls = get("embed.cls"), pos = get("embed.pos"),
            dout = get("embed.dout");
  const Index B = 2, N = 17, C = 8;
  Vec x(B * N * C), dpatch(patch.size()), dcls(C, 0.0f), dpos(pos.size(), 0.0f);
  vit::cpu::embed_tokens_forward(x.data(), patch.data(), cls.data(), pos.data(), B, N, 1, C);
  vit::cpu::embed_tokens_backward(dpatch.data(), dcls.data(), dpos.data(), dout.data(), B, N, 1,
                                  C);
  expect_close(x, "embed.out", 1e-7);
  expect_close(dpatch, "embed.dpatch", 1e-7);
  expect_close(dcls, "embed.dcls", 1e-6);
  expect_close(dpos, "embed.dpos", 1e-6);
}

TEST(OpsTorch, ResidualWithLayerScaleAndDropPath) {
  const Vec x = get("residual.x"), br = get("residual.br"), g = get("residual.g"),
            s = get("residual.scale"), dout = get("residual.dout");
  Vec out(x.size()), dbr(x.size()), dg(8, 0.0f);
  vit::cpu::residual_forward(out.data(), x.data(), br.data(), g.data(), s.data(), 2, 5, 8);
  vit::cpu::residual_backward(dbr.data(), dg.data(), dout.data(), br.data(), g.data(), s.data(),
                              2, 5, 8);
  expect_close(out, "residual.out", 1e-6);
  expect_close(dbr, "residual.dbr", 1e-6);
  expect_close(dg, "residual.dg", 1e-6);
}

TEST(OpsTorch, Pooling) {
  for (const bool avg : {false, true}) {
    const std::string c = avg ? "pool_avg" : "pool_token";
    const Vec x = get(c + ".x"), dout = get(c + ".dout");
    Vec out(2 * 8), dx(x.size(), 0.0f);
    vit::cpu::pool_forward(out.data(), x.data(), 2, 17, 1, 8, avg);
    vit::cpu::pool_backward(dx.data(), dout.data(), 2, 17, 1, 8, avg);
    expect_close(out, c + ".out", 1e-6);
    expect_close(dx, c + ".dx", 1e-6);
  }
}

TEST(OpsTorch, CrossEntropySoftTargets) {
  for (const std::string c : {"cross_entropy", "cross_entropy_hostile"}) {
    const Vec z = get(c + ".logits"), t = get(c + ".targets");
    const Index B = 6, K = 10;
    Vec losses(B), probs(B * K), dz(B * K);
    vit::cpu::cross_entropy_forward(losses.data(), probs.data(), z.data(), t.data(), B, K);
    vit::cpu::cross_entropy_backward(dz.data(), probs.data(), t.data(), 1.0f / B, B, K);
    expect_close(losses, c + ".losses", 1e-6);
    expect_close(dz, c + ".dlogits", 1e-6);
  }
}

}  // namespace
