// The sm_90a wgmma GEMM (dev/cuda/gemm_sm90.h) on the device: every output against the fp64
// sum of the same bf16 operands (within one bf16 step plus 2^-18 of sum |a b|, and at most 2%
// not the nearest bf16: fp32 accumulation in another order), the GELU epilogue's activation
// against the exact GELU of its own stored pre-activation (plus the fp32 formula's absolute
// error, phi_slack), row padding and guard bytes untouched. Skips on a GPU that is not a Hopper
// (compute capability 9.0); the operand checks run without a device. Its CPU twin,
// test_gemm_sm90_on_host.cpp, runs the same kernel source in CI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bf16_ulps.h"
#include "cuda_test_util.h"
#include "gemm_sm90.h"
#include "ops/cuda/ops.h"

namespace {

using vit::Index;
using vit::test::bf16_steps;
using vit::test::DevBuf;
using vit::test::rnd;
using vit::test::Vec;
using bf = __nv_bfloat16;
namespace cu = vit::cuda;

double gelu_exact(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
// The epilogue's GELU and its gradient are the separate GELU kernels' fp32 formulas, whose
// Phi(x) = (1 + erff(x / sqrt 2)) / 2 keeps only an absolute accuracy (erff's 2 ulps of ~1,
// 2^-24 of Phi) where erff is near -1: at x = -4.9 (Phi 5e-7) that is 10% of the GELU, 2 bf16
// steps (the first device run, 2026-11-28). Twice that, times what multiplies Phi.
double phi_slack(double factor) {
  return std::ldexp(std::fabs(factor), -23);
}

enum class Epi { kBias, kGelu, kGeluGrad };

struct Shape {
  Index M, N, K, ldc;
  bool bias;
  Epi epi;
  bool trans_b;  // B stored (K, N): the data-gradient GEMM
};

// A shape as its test's name (and as gtest prints it): M x N x K, the epilogue, B's layout.
std::string shape_name(const Shape& s) {
  const char* epi = s.epi == Epi::kBias   ? (s.bias ? "bias" : "plain")
                    : s.epi == Epi::kGelu ? "gelu"
                                          : "gelugrad";
  return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + "_ldc" +
         std::to_string(s.ldc) + "_" + epi + (s.trans_b ? "_bKN" : "_bNK");
}
void PrintTo(const Shape& s, std::ostream* os) {
  *os << shape_name(s);
}

class CudaSm90Gemm : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    VIT_GPU_TEST_PRECONDITION();
    if (!cu::sm90::gemm_available()) GTEST_SKIP() << "not a Hopper GPU (compute capability 9.0)";
  }
};

// Below the GEMM: one TMA box as it lands in shared memory, its bytes against the 128-byte
// swizzle the kernel's descriptors (and the CPU simulation) assume: the 16-byte chunk j of row
// r at chunk j ^ (r % 8), zeros outside the matrix. A box straddling the matrix's last rows and
// columns. Should the GEMM fail on a device, this says whether the layout or the descriptors
// are wrong.
TEST(CudaSm90GemmProbe, TmaBoxLandsSwizzledWithZerosOutside) {
  VIT_GPU_TEST_PRECONDITION();
  if (!cu::sm90::gemm_available()) GTEST_SKIP() << "not a Hopper GPU (compute capability 9.0)";
  const Index rows = 200, cols = 100, ld = 104;
  const int box_rows = 64, c0 = 64, c1 = 150;  // rows 150..213, columns 64..127
  const Vec src = rnd<bf>(rows * ld, 31);
  DevBuf<bf> dsrc(src, "src");
  DevBuf<unsigned char> out(box_rows * 128, "box");
  ASSERT_TRUE(cu::sm90::probe_tma_box(out.get(), dsrc.get(), rows, cols, ld, box_rows, c0, c1,
                                      cu::stream()));
  vit::test::cuda_ok(cudaGetLastError(), "launch");
  vit::test::cuda_ok(cudaDeviceSynchronize(), "sync");
  std::vector<unsigned char> got(box_rows * 128);
  vit::test::cuda_ok(cudaMemcpy(got.data(), out.get(), got.size(), cudaMemcpyDeviceToHost),
                     "download");
  Index wrong = 0;
  for (int r = 0; r < box_rows; ++r)
    for (int c = 0; c < 64; ++c) {
      const Index gr = c1 + r, gc = c0 + c;
      const bf want = gr < rows && gc < cols ? __float2bfloat16_rn(src[gr * ld + gc])
                                             : __float2bfloat16_rn(0.0f);
      const int at = r * 128 + ((c / 8) ^ (r % 8)) * 16 + (c % 8) * 2;
      bf have;
      std::memcpy(&have, &got[at], 2);
      if (std::memcmp(&have, &want, 2) != 0 && wrong++ < 5)
        ADD_FAILURE() << "box (" << r << ", " << c << ") not at the swizzled byte " << at;
    }
  EXPECT_EQ(wrong, 0) << "of " << box_rows * 64 << " elements";
}

TEST_P(CudaSm90Gemm, MatchesTheExactSum) {
  const Shape s = GetParam();
  const bool gelu = s.epi == Epi::kGelu, grad = s.epi == Epi::kGeluGrad;
  // padded row strides on A, and on B when it is (K, N)
  const Index lda = s.K + 8, ldb = s.trans_b ? s.N + 8 : s.K;
  const Vec a = rnd<bf>(s.M * lda, 11), b = rnd<bf>((s.trans_b ? s.K : s.N) * ldb, 12, 0.05),
            bias = rnd<bf>(s.N, 13, 0.5), gelu_in = rnd<bf>(s.M * s.ldc, 14, 1.5);
  DevBuf<bf> da(a, "A"), db(b, "B"), dbias_in(bias, "bias"), daux(gelu_in, "aux");
  DevBuf<bf> out(s.M * s.ldc, "out"), pre(s.M * s.ldc, "pre");  // 0x7f7f: poison
  // with the GELU's gradient, fc1's bias gradient too: onto ones (a gradient accumulates)
  const Vec ones(s.N, 1.0f);
  DevBuf<float> dbias(ones, "dbias"), work((s.M + 127) / 128 * s.N, "workspace");
  cu::sm90::GemmOperands g{da.get(),
                           lda,
                           db.get(),
                           ldb,
                           s.trans_b,
                           out.get(),
                           s.ldc,
                           s.bias ? dbias_in.get() : nullptr,
                           gelu ? pre.get() : nullptr,
                           grad ? daux.get() : nullptr,
                           grad ? dbias.get() : nullptr,
                           grad ? work.get() : nullptr,
                           s.M,
                           s.N,
                           s.K};
  EXPECT_EQ(cu::sm90::gemm_workspace_floats(g), grad ? (s.M + 127) / 128 * s.N : 0);
  ASSERT_TRUE(cu::sm90::gemm(g, cu::stream()));
  vit::test::cuda_ok(cudaGetLastError(), "launch");
  vit::test::cuda_ok(cudaDeviceSynchronize(), "sync");
  const Vec y = gelu ? pre.download() : out.download(), result = out.download();
  const Vec untouched = DevBuf<bf>(1, "poison").download();

  Index far = 0, second_off = 0;
  double worst = 0;
  for (Index i = 0; i < s.M; ++i)
    for (Index j = 0; j < s.ldc; ++j) {
      const Index at = i * s.ldc + j;
      if (j >= s.N) {
        ASSERT_EQ(result[at], untouched[0]) << "row padding (" << i << ", " << j << ") written";
        continue;
      }
      double sum = s.bias ? double(bias[j]) : 0.0, magnitude = 0.0;
      for (Index k = 0; k < s.K; ++k) {
        const double t =
            double(a[i * lda + k]) * double(s.trans_b ? b[k * ldb + j] : b[j * ldb + k]);
        sum += t;
        magnitude += std::fabs(t);
      }
      // fp32 sums in the tensor cores' order lose up to a few 2^-24 of sum |a b| (the first
      // device run's worst: 2^-23.8), many bf16 steps of a result that cancels to near zero;
      // 2^-18 of it is allowed on top of the steps (a missing product is ~2^-8 of it).
      const double slack = std::ldexp(magnitude, -18);
      if (grad) {  // d(pre) = gelu'(x) * d(act), within 2 steps of the exact product's
        const double x = gelu_in[at], cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
        const double dgelu = cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
        const double want = sum * dgelu;
        const double st = bf16_steps(result[at], want);
        ASSERT_LE(st, 2.0 + (std::fabs(dgelu) * slack + phi_slack(sum)) / vit::test::bf16_ulp(want))
            << "d(pre) (" << i << ", " << j << "): " << result[at] << " vs " << want;
        second_off += st > 0.5;
        continue;
      }
      const double steps = bf16_steps(y[at], sum);
      worst = std::max(worst, steps);
      far += steps > 0.5;
      ASSERT_LE(steps, 1.0 + slack / vit::test::bf16_ulp(sum))
          << "(" << i << ", " << j << "): " << y[at] << " vs " << sum << " (sum |a b| " << magnitude
          << ")";
      if (gelu) {
        const double want = gelu_exact(y[at]);
        const double st = bf16_steps(result[at], want);
        ASSERT_LE(st, 1.0 + phi_slack(y[at]) / vit::test::bf16_ulp(want))
            << "act (" << i << ", " << j << "): " << result[at] << " vs " << want;
        second_off += st > 0.5;
      }
    }
  EXPECT_LE(far, s.M * s.N / 50) << "worst " << worst << " steps";
  EXPECT_LE(second_off, s.M * s.N / (grad ? 10 : 100));
  if (grad) {  // 1 + the column sums of d(pre) as stored
    const Vec sums = dbias.download();
    for (Index j = 0; j < s.N; ++j) {
      double want = 1.0, scale = 1.0;
      for (Index i = 0; i < s.M; ++i) {
        want += result[i * s.ldc + j];
        scale += std::fabs(result[i * s.ldc + j]);
      }
      ASSERT_NEAR(sums[j], want, 1e-5 * scale) << "fc1's bias gradient [" << j << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaSm90Gemm,
    ::testing::Values(Shape{128, 128, 64, 128, false, Epi::kBias, false},    // one tile
                      Shape{200, 136, 200, 142, true, Epi::kBias, false},    // edges of M, N, K
                      Shape{394, 1152, 384, 1152, true, Epi::kBias, false},  // ViT-S qkv, 2 images
                      Shape{394, 384, 1536, 384, true, Epi::kBias, false},   // ViT-S fc2
                      Shape{300, 1536, 384, 1536, true, Epi::kGelu, false},  // ViT-S fc1 + GELU
                      Shape{130, 250, 456, 252, true, Epi::kGelu, false},    // GELU at the edges
                      Shape{128, 128, 64, 128, false, Epi::kBias, true},     // B (K, N), one tile
                      Shape{394, 384, 1152, 384, false, Epi::kBias, true},   // ViT-S qkv's d(ln1)
                      Shape{394, 1536, 384, 1536, false, Epi::kGeluGrad, true},  // fc2's d(fc1)
                      Shape{150, 180, 328, 186, false, Epi::kGeluGrad, true},
                      // 24 x 12 = 288 tiles, more than an H100's or H200's resident blocks (two
                      // an SM): blocks of the persistent grid take a second tile, through the
                      // stage ring and the column sums' buffer their first left
                      Shape{3000, 1536, 128, 1536, false, Epi::kGeluGrad, true}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      return shape_name(info.param);
    });  // at the edges

// The weight gradient dweight (Nout, K) += dout (R, Nout)^T @ inp (R, K) against fp64 sums of
// the same bf16 operands, over splits of the tokens (the last split short, R not a multiple of
// 64, Nout and K past whole tiles) and onto a gradient that was not zero.
TEST(CudaSm90Wgrad, MatchesTheExactSum) {
  VIT_GPU_TEST_PRECONDITION();
  if (!cu::sm90::gemm_available()) GTEST_SKIP() << "not a Hopper GPU (compute capability 9.0)";
  struct Case {
    Index R, Nout, K;
  };
  // 2500 x 768 x 768: 36 tiles x 8 splits (of 40 slices) = 288 units, more than an H100's or
  // H200's resident blocks, so the persistent grid's blocks take units of two splits
  for (const Case c :
       {Case{4096, 384, 384}, Case{300, 136, 200}, Case{394, 1152, 384}, Case{2500, 768, 768}}) {
    const Index ld_dout = c.Nout + 8, ld_inp = c.K + 8, ldw = c.K + 4;
    const Vec dout = rnd<bf>(c.R * ld_dout, 41), inp = rnd<bf>(c.R * ld_inp, 42);
    const Vec start = rnd<float>(c.Nout * ldw, 43);
    DevBuf<bf> ddout(dout, "dout"), dinp(inp, "inp");
    DevBuf<float> dweight(start, "dweight");
    cu::sm90::WgradOperands w{ddout.get(), ld_dout, dinp.get(), ld_inp, dweight.get(),
                              ldw,         c.R,     c.Nout,     c.K,    nullptr};
    DevBuf<float> work(cu::sm90::wgrad_workspace_floats(w), "workspace");
    w.workspace = work.get();
    ASSERT_TRUE(cu::sm90::wgrad(w, cu::stream())) << c.R << " x " << c.Nout << " x " << c.K;
    vit::test::cuda_ok(cudaGetLastError(), "launch");
    vit::test::cuda_ok(cudaDeviceSynchronize(), "sync");
    const Vec got = dweight.download();
    for (Index n = 0; n < c.Nout; ++n)
      for (Index k = 0; k < ldw; ++k) {
        const Index at = n * ldw + k;
        if (k >= c.K) {  // the row padding: untouched
          ASSERT_EQ(got[at], start[at]) << "padding (" << n << ", " << k << ")";
          continue;
        }
        double want = start[at], scale = std::fabs(start[at]);
        for (Index r = 0; r < c.R; ++r) {
          const double t = double(dout[r * ld_dout + n]) * double(inp[r * ld_inp + k]);
          want += t;
          scale += std::fabs(t);
        }
        ASSERT_NEAR(got[at], want, 2e-6 * scale + 1e-6)
            << c.R << " x " << c.Nout << " x " << c.K << ": (" << n << ", " << k << ")";
      }
  }
}

// The operand checks (host only): a stride that is not a multiple of 8 elements, or a
// misaligned operand, is declined, so the caller runs cuBLASLt.
TEST(CudaSm90GemmOperands, DeclinesWhatTheTensorMapsCannotDescribe) {
  alignas(16) static bf storage[64];
  alignas(16) static float sums[64];
  const cu::sm90::GemmOperands ok{storage, 64,      storage, 64,      false, storage, 64, nullptr,
                                  nullptr, nullptr, nullptr, nullptr, 100,   64,      64};
  EXPECT_TRUE(cu::sm90::gemm_fits(ok));
  auto with = [&](auto change) {
    cu::sm90::GemmOperands g = ok;
    change(g);
    return cu::sm90::gemm_fits(g);
  };
  EXPECT_FALSE(with([](auto& g) { g.lda = 60, g.K = 60, g.ldb = 64; }));  // 120-byte rows
  EXPECT_FALSE(with([](auto& g) { g.a = storage + 1; }));                 // 2-byte aligned A
  EXPECT_FALSE(with([](auto& g) { g.b = storage + 4; }));                 // 8-byte aligned B
  EXPECT_FALSE(with([](auto& g) { g.out = storage + 1; }));               // odd output
  EXPECT_FALSE(with([](auto& g) { g.ldc = 65; }));                        // odd ldc
  EXPECT_FALSE(with([](auto& g) { g.K = 0; }));
  EXPECT_TRUE(with([](auto& g) { g.M = Index(65535) * 128 + 1; }));  // 1-D grid: no y limit
  // 2^23 x 2^9 tiles: the work units' count past an int
  EXPECT_FALSE(with([](auto& g) { g.M = Index(1) << 30, g.N = g.ldc = Index(1) << 16; }));
  EXPECT_FALSE(with([](auto& g) { g.trans_b = true, g.N = 72; }));          // ldb < N for B (K, N)
  EXPECT_FALSE(with([](auto& g) { g.pre = storage, g.aux = storage; }));    // one epilogue
  EXPECT_TRUE(with([](auto& g) { g.K = 8, g.M = 1, g.N = 1; }));            // tiny, still fine
  EXPECT_TRUE(with([](auto& g) { g.trans_b = true, g.aux = storage; }));    // the GELU gradient
  EXPECT_FALSE(with([](auto& g) { g.aux = storage, g.dbias = sums; }));     // no workspace
  EXPECT_FALSE(with([](auto& g) { g.dbias = sums, g.workspace = sums; }));  // no GELU gradient
  EXPECT_TRUE(with([](auto& g) { g.aux = storage, g.dbias = sums, g.workspace = sums; }));

  const cu::sm90::WgradOperands w{storage, 64, storage, 64, sums, 64, 1000, 64, 64, sums};
  EXPECT_TRUE(cu::sm90::wgrad_fits(w));
  auto wwith = [&](auto change) {
    cu::sm90::WgradOperands v = w;
    change(v);
    return cu::sm90::wgrad_fits(v);
  };
  EXPECT_FALSE(wwith([](auto& v) { v.ld_dout = 68; }));           // 136-byte rows
  EXPECT_FALSE(wwith([](auto& v) { v.inp = storage + 2; }));      // 4-byte aligned
  EXPECT_FALSE(wwith([](auto& v) { v.K = 63, v.ld_inp = 64; }));  // odd K: fp32 pairs
  EXPECT_FALSE(wwith([](auto& v) { v.workspace = nullptr; }));
  EXPECT_FALSE(wwith([](auto& v) { v.ldw = 32; }));
}

}  // namespace
