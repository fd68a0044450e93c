// The fused flash attention (src/ops/cuda/flash_attention.cu) against the CPU reference, in both
// storage modes, with the harness of test_cuda_ops.cpp (cuda_test_util.h): guard bytes around
// every device buffer, outputs starting as 0x7f garbage (~3.4e38, so an unwritten element
// fails), NaN/Inf checks, inputs rounded to bf16 first in the bf16 case.
// The reference is cpu::attention_forward/backward in fp64 (the backward fed with its own fp64
// probabilities) plus a fp64 log-sum-exp, so the tolerances measure the GPU's error alone.
// Tolerances (|gpu - ref| <= rtol |ref| + atol max|ref|):
//  * fp32: scores, statistics and products all fp32; the error is fp32 summation over D and N
//    terms and exp2f's ~2 ulp: out/lse 1e-4 relative, dqkv 2e-4 (as the unfused op's test).
//  * bf16 out and dqkv: the stored results are rounded to bf16 (2^-9 relative) and so are P and
//    dS where they feed the tensor cores, each an error of ~2^-9 of a term: out 2e-2 / 8e-3,
//    dqkv 3e-2 / 1.5e-2, the unfused attention test's values.
//  * bf16 lse: the scores are exact products of bf16 values summed in fp32, so lse is as
//    accurate as in fp32 mode: 1e-4.
// Shapes: ViT-S heads (N = 197: a ragged 5-row last tile), every supported head dim, N = 1 and
// 17 (one partial tile), N = 65 (a single-row last tile), odd B; one case with buffers offset by
// one element (no 16-byte accesses); D = 32, 48, 64 over several tiles, N a multiple of the
// tile. A second backward must give the same bits. The bf16 kernels also against the CPU
// emulation's rounding points (MatchesTheEmulation).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cuda_test_util.h"
#include "gpu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/flash_mma.cuh"
#include "ops/cuda/ops.h"
#include "ops/emu/ops.h"

namespace {

using vit::Index;
using bf16 = __nv_bfloat16;
using namespace vit::test;  // DevBuf, rnd, expect_close, CudaTest: cuda_test_util.h
namespace cpu = vit::cpu;
namespace gpu = vit::cuda;

template <typename T>
class FlashAttention : public CudaTest {};
TYPED_TEST_SUITE(FlashAttention, StorageTypes, TypeNames);

struct Shape {
  Index B, N, H, D;
  size_t offset = 0;  // element offset of the T buffers: 1 = no 16-byte alignment
};
const std::vector<Shape> kShapes = {
    {2, 197, 6, 64},     // ViT-S/16 heads
    {3, 50, 3, 32},      // odd B, D = 32
    {1, 17, 2, 48},      // one partial tile, D = 48
    {2, 65, 4, 96},      // a 1-row last tile, D = 96
    {5, 1, 1, 64},       // a single token
    {2, 50, 3, 32, 1},   // misaligned buffers: the scalar load/store path
    {1, 130, 2, 96, 1},  // misaligned, 3 tiles
    {2, 197, 3, 48},     // D = 48 over several tiles (online-softmax rescaling)
    {2, 130, 2, 32},     // D = 32 over several tiles
    {1, 128, 2, 64},     // N an exact multiple of the tile
};

std::string str(const Shape& s) {
  return "B=" + std::to_string(s.B) + " N=" + std::to_string(s.N) + " H=" + std::to_string(s.H) +
         " D=" + std::to_string(s.D) + " offset=" + std::to_string(s.offset);
}

struct Reference {
  Vec out, lse, dqkv;  // (B, N, C), (B, H, N), (B, N, 3C)
};

// fp64 attention on the (already storage-rounded) inputs: the CPU ops for out and dqkv, and
// lse[b, h, i] = log sum_j exp(q_i . k_j / sqrt(D)).
Reference reference(const Vec& qkv, const Vec& dout, const Shape& s) {
  const Index C = s.H * s.D, C3 = 3 * C;
  const std::vector<double> q(qkv.begin(), qkv.end()), g(dout.begin(), dout.end());
  std::vector<double> out(s.B * s.N * C), att(s.B * s.H * s.N * s.N), dq(q.size());
  cpu::attention_forward(out.data(), att.data(), q.data(), s.B, s.N, s.H, s.D);
  cpu::attention_backward(dq.data(), g.data(), q.data(), att.data(), s.B, s.N, s.H, s.D);
  Vec lse(s.B * s.H * s.N);
  const double scale = 1.0 / std::sqrt(double(s.D));
  std::vector<double> row(s.N);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.N; ++i) {
        const double* qi = q.data() + (b * s.N + i) * C3 + h * s.D;
        double mx = -INFINITY;
        for (Index j = 0; j < s.N; ++j) {
          const double* kj = q.data() + (b * s.N + j) * C3 + C + h * s.D;
          double dot = 0;
          for (Index d = 0; d < s.D; ++d) dot += qi[d] * kj[d];
          row[j] = dot * scale;
          mx = std::max(mx, row[j]);
        }
        double sum = 0;
        for (Index j = 0; j < s.N; ++j) sum += std::exp(row[j] - mx);
        lse[(b * s.H + h) * s.N + i] = float(mx + std::log(sum));
      }
  return {Vec(out.begin(), out.end()), lse, Vec(dq.begin(), dq.end())};
}

TYPED_TEST(FlashAttention, MatchesCpuReference) {
  using T = TypeParam;
  const Tol t_out = pick<T>({1e-4, 1e-5}, {2e-2, 8e-3});
  const Tol t_lse = pick<T>({1e-4, 1e-5}, {1e-4, 1e-5});
  const Tol t_dqkv = pick<T>({2e-4, 2e-5}, {3e-2, 1.5e-2});
  uint64_t seed = 700;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(str(s));
    const Index C = s.H * s.D;
    const Vec qkv = rnd<T>(s.B * s.N * 3 * C, ++seed), dout = rnd<T>(s.B * s.N * C, ++seed);
    const Reference ref = reference(qkv, dout, s);
    DevBuf<T> d_qkv(qkv, "qkv", s.offset), d_dout(dout, "dout", s.offset);
    DevBuf<T> d_out(s.B * s.N * C, "out", s.offset), d_dqkv(qkv.size(), "dqkv", s.offset);
    DevBuf<float> d_lse(s.B * s.H * s.N, "lse");
    gpu::flash_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), s.B, s.N, s.H, s.D);
    gpu::flash_attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                  s.B, s.N, s.H, s.D);
    gpu::synchronize();
    expect_close("out", d_out.download(), ref.out, t_out);
    expect_close("lse", d_lse.download(), ref.lse, t_lse);
    expect_close("dqkv", d_dqkv.download(), ref.dqkv, t_dqkv);
  }
}

TYPED_TEST(FlashAttention, BackwardIsBitwiseReproducible) {
  using T = TypeParam;
  const Shape s = {3, 197, 6, 64};
  const Index C = s.H * s.D;
  DevBuf<T> d_qkv(rnd<T>(s.B * s.N * 3 * C, 801), "qkv"),
      d_dout(rnd<T>(s.B * s.N * C, 802), "dout");
  DevBuf<T> d_out(s.B * s.N * C, "out"), d_a(s.B * s.N * 3 * C, "dqkv 1"),
      d_b(s.B * s.N * 3 * C, "dqkv 2");
  DevBuf<float> d_lse(s.B * s.H * s.N, "lse");
  gpu::flash_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), s.B, s.N, s.H, s.D);
  for (DevBuf<T>* d : {&d_a, &d_b})
    gpu::flash_attention_backward(d->get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                  s.B, s.N, s.H, s.D);
  gpu::synchronize();
  const Vec a = d_a.download(), b = d_b.download();  // exact: bf16 -> fp32 is injective
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << "two backward runs gave different dqkv bits";
}

TYPED_TEST(FlashAttention, RejectsUnsupportedHeadDim) {
  using T = TypeParam;
  T* none = nullptr;
  EXPECT_THROW(gpu::flash_attention_forward(none, nullptr, none, 1, 8, 1, 40), vit::Error);
  EXPECT_THROW(gpu::flash_attention_backward(none, none, none, none, nullptr, 1, 8, 1, 128),
               vit::Error);
}

// The bf16 kernels against the CPU emulation of their rounding points (src/ops/emu/
// flash_attention.cpp) on the same bf16 inputs (the mma.sync kernels). They differ only in fp32
// summation order and exp2f's last bits, so the stored bf16 results may differ where a value sits
// near a rounding boundary: lse within 1e-5 relative; out and dqkv within 2 bf16 ulps of the larger
// value plus 1 ulp of the largest, and most elements
// (>= 90%) the same bits. The fp64 test above judges the size of the error; this one, where
// the rounding happens (a rounding point moved costs ~1 ulp on many elements).
class FlashAttentionBf16 : public CudaTest {};

void expect_within_ulps(const std::string& what, const Vec& got, const Vec& ref) {
  expect_within_bf16_ulps(what, got, ref, 2, 0.1);
}

// The bf16 op's forward and backward on the device for shape s (outputs at s.offset like the
// inputs): out (B, N, C), lse (B, H, N), dqkv (B, N, 3C), widened to fp32.
struct DeviceResult {
  Vec out, lse, dqkv;
};
DeviceResult run_bf16(const Shape& s, DevBuf<bf16>& d_qkv, DevBuf<bf16>& d_dout) {
  const Index C = s.H * s.D;
  DevBuf<bf16> d_out(s.B * s.N * C, "out", s.offset), d_dqkv(s.B * s.N * 3 * C, "dqkv", s.offset);
  DevBuf<float> d_lse(s.B * s.H * s.N, "lse");
  gpu::flash_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), s.B, s.N, s.H, s.D);
  gpu::flash_attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                s.B, s.N, s.H, s.D);
  gpu::synchronize();
  return {d_out.download(), d_lse.download(), d_dqkv.download()};
}

TEST_F(FlashAttentionBf16, MatchesTheEmulation) {
  using T = bf16;
  {
    uint64_t seed = 1000;
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(str(s));
      const Index C = s.H * s.D;
      const Vec qkv = rnd<T>(s.B * s.N * 3 * C, ++seed), dout = rnd<T>(s.B * s.N * C, ++seed);
      DevBuf<T> d_qkv(qkv, "qkv", s.offset), d_dout(dout, "dout", s.offset);
      const DeviceResult got = run_bf16(s, d_qkv, d_dout);
      // The emulation on the same bf16 values (exact: they are bf16 already); its backward
      // takes the emulated forward's out and lse, as the model's would.
      auto to_bf16 = [](const Vec& v) {
        std::vector<vit::bf16> b(v.size());
        for (size_t i = 0; i < v.size(); ++i) b[i] = vit::bf16(v[i]);
        return b;
      };
      auto widen = [](const std::vector<vit::bf16>& b) {
        Vec v(b.size());
        for (size_t i = 0; i < b.size(); ++i) v[i] = float(b[i]);
        return v;
      };
      const std::vector<vit::bf16> e_qkv = to_bf16(qkv), e_dout = to_bf16(dout);
      std::vector<vit::bf16> e_out(s.B * s.N * C), e_dqkv(qkv.size());
      Vec e_lse(s.B * s.H * s.N);
      vit::emu::flash_attention_forward(e_out.data(), e_lse.data(), e_qkv.data(), s.B, s.N, s.H,
                                        s.D);
      vit::emu::flash_attention_backward(e_dqkv.data(), e_dout.data(), e_qkv.data(), e_out.data(),
                                         e_lse.data(), s.B, s.N, s.H, s.D);
      expect_close("lse", got.lse, e_lse, {1e-5, 1e-6});
      expect_within_ulps("out", got.out, widen(e_out));
      const Vec &dqkv = got.dqkv, e_dqkv32 = widen(e_dqkv);
      if (s.N > 1) {
        expect_within_ulps("dqkv", dqkv, e_dqkv32);
        continue;
      }
      // One token: the softmax over one key is constant, so dq and dk are 0 in exact arithmetic
      // and both sides hold the rounding noise of dP - rowsum(dO o O), which no summation order
      // shares. Their size is judged against the whole (within the ulp bound, any bits), the
      // bits of dv alone (per token: q, k, v, each C wide).
      expect_within_bf16_ulps("dqkv (N = 1)", dqkv, e_dqkv32, 2, 1.0);
      Vec dv, e_dv;
      for (Index t = 0; t < s.B; ++t) {
        dv.insert(dv.end(), dqkv.begin() + (3 * t + 2) * C, dqkv.begin() + (3 * t + 3) * C);
        e_dv.insert(e_dv.end(), e_dqkv32.begin() + (3 * t + 2) * C,
                    e_dqkv32.begin() + (3 * t + 3) * C);
      }
      expect_within_ulps("dv (N = 1)", dv, e_dv);
    }
  }
}

// Every output of `got` has the bits of `want`'s (a compare_plans check).
void expect_same_outputs(const DeviceResult& got, const DeviceResult& want) {
  expect_same_bits("out", got.out, want.out);
  expect_same_bits("lse", got.lse, want.lse);
  expect_same_bits("dqkv", got.dqkv, want.dqkv);
}

// For each shape, the mma.sync kernels on one set of random inputs under the kernel options `a`,
// then `b` (--kernels strings): check(result a, result b).
template <typename Check>
void compare_plans(const char* a, const char* b, uint64_t seed, Check&& check) {
  using T = bf16;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(str(s));
    const Index C = s.H * s.D;
    const Vec qkv = rnd<T>(s.B * s.N * 3 * C, ++seed), dout = rnd<T>(s.B * s.N * C, ++seed);
    DevBuf<T> d_qkv(qkv, "qkv", s.offset), d_dout(dout, "dout", s.offset);
    auto run = [&](const char* options) {
      const ScopedKernels plan(options);
      return run_bf16(s, d_qkv, d_dout);
    };
    const DeviceResult with_a = run(a), with_b = run(b);
    check(with_a, with_b);
  }
}

// flash_warps: blocks of 1, 2 or 3 warps, or the occupancy model's choice per kernel and N
// ("auto", the rule), instead of 4. Each warp computes its 16 rows over the same streamed
// tiles whatever the block's height, so every output must have the 4-warp blocks' bits (on the
// CPU simulation, FlashKernelsOnHost.BlockHeightsGiveTheSameBits).
TEST_F(FlashAttentionBf16, BlockHeightsGiveTheSameBits) {
  uint64_t seed = 4000;
  for (const char* warps : {"flash_warps=auto", "flash_warps=3", "flash_warps=2",
                            "flash_warps=1"}) {
    SCOPED_TRACE(warps);
    compare_plans("flash_warps=4", warps, seed += 100, expect_same_outputs);
  }
}

// ViT-S/16 batch 256: the fused op against the unfused GPU attention (same inputs, both within
// their tolerances of each other), and the time of each, printed for the record.
TYPED_TEST(FlashAttention, VitSmallBatch256AgainstUnfused) {
  using T = TypeParam;
  const Index B = 256, N = 197, H = 6, D = 64, C = H * D;
  DevBuf<T> d_qkv(rnd<T>(B * N * 3 * C, 901), "qkv"), d_dout(rnd<T>(B * N * C, 902), "dout");
  DevBuf<T> f_out(B * N * C, "flash out"), f_dqkv(B * N * 3 * C, "flash dqkv");
  DevBuf<T> u_out(B * N * C, "out"), u_att(B * H * N * N, "att"), u_dqkv(B * N * 3 * C, "dqkv");
  DevBuf<float> d_lse(B * H * N, "lse");
  auto flash = [&] {
    gpu::flash_attention_forward(f_out.get(), d_lse.get(), d_qkv.get(), B, N, H, D);
    gpu::flash_attention_backward(f_dqkv.get(), d_dout.get(), d_qkv.get(), f_out.get(), d_lse.get(),
                                  B, N, H, D);
  };
  auto unfused = [&] {
    gpu::attention_forward(u_out.get(), u_att.get(), d_qkv.get(), B, N, H, D);
    gpu::attention_backward(u_dqkv.get(), d_dout.get(), d_qkv.get(), u_att.get(), B, N, H, D);
  };
  auto ms = [](auto&& f) {
    f();  // warm-up
    gpu::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) f();
    gpu::synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
               .count() /
           5;
  };
  const double t_flash = ms(flash), t_unfused = ms(unfused);
  std::printf("ViT-S/16 b256 attention fwd+bwd: flash %.2f ms, unfused %.2f ms\n", t_flash,
              t_unfused);
  // Each is within its tolerance of the exact result, so of each other within the sum.
  const Tol t_out = pick<T>({2e-4, 2e-5}, {4e-2, 1.6e-2});
  const Tol t_dqkv = pick<T>({4e-4, 4e-5}, {6e-2, 3e-2});
  expect_close("out (flash vs unfused)", f_out.download(), u_out.download(), t_out);
  expect_close("dqkv (flash vs unfused)", f_dqkv.download(), u_dqkv.download(), t_dqkv);
}

}  // namespace
