// The mma.sync fused attention kernels (ops/cuda/flash_mma_kernels.cuh), their CUDA source run on
// the CPU (tests/cuda_host_sim.h, cuda_host_sim_mma.h: one host thread per CUDA thread, the
// warp's ldmatrix, mma.sync and shuffles as exchanges of the lanes' registers), against the bf16
// emulation (src/ops/emu/flash_attention.cpp) on the same inputs, as the GPU test
// FlashAttentionBf16.MatchesTheEmulationOnBothKernelSets judges the device: lse within 1e-5
// relative, out and dqkv within 2 bf16 spacings (plus one of the largest value). The device may
// differ in the bits of a tenth of the elements; here at most 1% may (the simulated mma sums in
// fp64, the emulation in fp32 in another order: when written, out had no element and dqkv 25 of
// 37,824 with other bits at N = 197, which a wrong fragment or mask turns into most). CI has no
// GPU: this is where a change to the kernels' fragment layouts, masks, tile streaming or
// padding skips is first checked. What the simulation cannot check (the device's arithmetic,
// memory model, timing) stays with the GPU tests.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bf16_ulps.h"
#include "cuda_host_sim.h"
#include "cuda_host_sim_mma.h"
#include "emu_test_util.h"
#include "ops/cuda/flash_mma_kernels.cuh"
#include "ops/emu/ops.h"

namespace {

using vit::Index;
namespace cu = vit::cuda;
namespace k = vit::cuda::flash_mma_kernels;
using vit::emu_test::Bf16s;
using vit::emu_test::Floats;
using vit::emu_test::Gen;
using vit::emu_test::nans;
using vit::emu_test::widen;
using vit::test::expect_within_bf16_ulps;

struct Shape {
  int B, N, H, D;
  int C() const { return H * D; }
  int tiles(int warps = k::kWarps) const { return (N + 16 * warps - 1) / (16 * warps); }
  std::string str() const {
    char buf[64];
    std::snprintf(buf, sizeof buf, "B%d N%d H%d D%d", B, N, H, D);
    return buf;
  }
};
// ViT-S/16's N = 197 (four tiles, the last with 5 rows: three idle warps, padded key columns),
// the curriculum's 17, 65 (a last tile of one row) and 50, and every head dim.
const Shape kShapes[] = {{1, 197, 1, 64}, {2, 17, 2, 32}, {1, 65, 1, 48}, {1, 50, 2, 96}};

// The launches of flash_attention_mma.cu: one block of `warps` warps per (b, h, tile of 16
// `warps` rows).
struct Launch {
  Shape s;
  bool vec = true;
  int warps = k::kWarps;  // --kernels flash_warps

  unsigned grid() const { return unsigned(s.B * s.H * s.tiles(warps)); }
  unsigned threads() const { return unsigned(32 * warps); }

  template <int D>
  void forward(vit::bf16* out, float* lse, const vit::bf16* qkv) const {
    const float scale_log2 = k::kLog2e / std::sqrt(float(D));
    const int tiles = s.tiles(warps);
    cu::launch({grid()}, {threads()}, k::forward_smem_bytes<D>(warps), [&] {
      k::flash_mma_forward_kernel<D>(out, lse, qkv, s.N, s.H, tiles, scale_log2, vec);
    });
  }
  template <int D>
  void backward(vit::bf16* dqkv, const vit::bf16* dout, const vit::bf16* qkv, const float* lse,
                const float* drow) const {
    const float scale = 1.0f / std::sqrt(float(D));
    const int tiles = s.tiles(warps);
    cu::launch({grid()}, {threads()}, k::dkv_smem_bytes<D>(warps), [&] {
      k::flash_mma_dkv_kernel<D>(dqkv, dout, qkv, lse, drow, s.N, s.H, tiles, scale, vec);
    });
    cu::launch({grid()}, {threads()}, k::dq_smem_bytes<D>(warps), [&] {
      k::flash_mma_dq_kernel<D>(dqkv, dout, qkv, lse, drow, s.N, s.H, tiles, scale, vec);
    });
  }
};

// Drow (B, H, N) = rowsum(dO * out) over the stored bf16 values (flash_drow's job on the device).
std::vector<float> drow_of(const Shape& s, const Bf16s& dout, const Bf16s& out) {
  std::vector<float> drow(size_t(s.B) * s.H * s.N);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.N; ++i) {
        double sum = 0;
        for (int d = 0; d < s.D; ++d) {
          const size_t at = (size_t(b) * s.N + i) * s.C() + size_t(h) * s.D + d;
          sum += double(float(dout[at])) * double(float(out[at]));
        }
        drow[(size_t(b) * s.H + h) * s.N + i] = float(sum);
      }
  return drow;
}

struct Result {
  Bf16s out, dqkv;
  std::vector<float> lse;
};

// The kernels' forward, and (unless forward_only) their backward from the emulation's out and lse
// (so the backward is judged on its own inputs, as the model's would be).
Result run_kernels(const Launch& run, const Bf16s& qkv, const Bf16s& dout, const Bf16s& e_out,
                   const std::vector<float>& e_lse, bool forward_only = false) {
  const Shape& s = run.s;
  Result r{nans(Index(s.B) * s.N * s.C()), nans(Index(s.B) * s.N * 3 * s.C()),
           std::vector<float>(size_t(s.B) * s.H * s.N, -1.0f)};
  const std::vector<float> drow = drow_of(s, dout, e_out);
  k::with_head_dim(s.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    run.forward<D>(r.out.data(), r.lse.data(), qkv.data());
    if (!forward_only)
      run.backward<D>(r.dqkv.data(), dout.data(), qkv.data(), e_lse.data(), drow.data());
  });
  return r;
}

void expect_lse_close(const std::vector<float>& got, const std::vector<float>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - ref[i]) <= 1e-5 * std::fabs(ref[i]) + 1e-6)) ++bad;
  EXPECT_EQ(bad, 0u) << "lse: " << bad << " of " << got.size() << " beyond 1e-5 relative";
}

// Every output of `got` has the bits of `want`'s.
void expect_same_results(const Result& got, const Result& want) {
  vit::emu_test::expect_same_bits(widen(got.out), widen(want.out));
  vit::emu_test::expect_same_bits(got.lse, want.lse);
  vit::emu_test::expect_same_bits(widen(got.dqkv), widen(want.dqkv));
}

struct Case {
  Bf16s qkv, dout, e_out, e_dqkv;
  std::vector<float> e_lse;
};
Case make_case(const Shape& s, uint64_t seed) {
  Gen g(seed);
  Case c{g.bf16s(Index(s.B) * s.N * 3 * s.C(), -2, 2), g.bf16s(Index(s.B) * s.N * s.C(), -1, 1),
         Bf16s(size_t(s.B) * s.N * s.C()), Bf16s(size_t(s.B) * s.N * 3 * s.C()),
         std::vector<float>(size_t(s.B) * s.H * s.N)};
  vit::emu::flash_attention_forward(c.e_out.data(), c.e_lse.data(), c.qkv.data(), s.B, s.N, s.H,
                                    s.D);
  vit::emu::flash_attention_backward(c.e_dqkv.data(), c.dout.data(), c.qkv.data(), c.e_out.data(),
                                     c.e_lse.data(), s.B, s.N, s.H, s.D);
  return c;
}

TEST(FlashKernelsOnHost, MatchTheEmulation) {
  uint64_t seed = 500;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const Case c = make_case(s, ++seed);
    const Result r = run_kernels(Launch{s}, c.qkv, c.dout, c.e_out, c.e_lse);
    expect_lse_close(r.lse, c.e_lse);
    expect_within_bf16_ulps("out", widen(r.out), widen(c.e_out), 2, 0.01);
    expect_within_bf16_ulps("dqkv", widen(r.dqkv), widen(c.e_dqkv), 2, 0.01);
  }
}

// The scalar path for operands that are not 16-byte aligned (`vec` false: synchronous loads)
// computes the same as the cp.async path: the same bits.
TEST(FlashKernelsOnHost, TileLoadPathsGiveTheSameBits) {
  const Shape s{1, 65, 2, 32};
  const Case c = make_case(s, 900);
  const Result with = run_kernels(Launch{s}, c.qkv, c.dout, c.e_out, c.e_lse);
  expect_same_results(run_kernels(Launch{s, false}, c.qkv, c.dout, c.e_out, c.e_lse), with);
}

// flash_warps: blocks of 1, 2 or 3 warps instead of 4. Each warp computes its 16 rows over
// the same streamed tiles whatever the block's height, so every output must have the 4-warp
// blocks' bits: N = 197 in 5 blocks of 3 warps (the last with 5 rows), 65 in 3 of 2 and 5 of 1,
// 17 and 50 in blocks that end past N.
TEST(FlashKernelsOnHost, BlockHeightsGiveTheSameBits) {
  const struct {
    Shape s;
    int warps;
  } cases[] = {{kShapes[0], 3}, {kShapes[1], 3}, {kShapes[2], 2}, {kShapes[2], 1}, {kShapes[3], 3}};
  uint64_t seed = 800;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.s.str() + " warps " + std::to_string(c.warps));
    const Case in = make_case(c.s, ++seed);
    Launch four{c.s}, other{c.s};
    other.warps = c.warps;
    expect_same_results(run_kernels(other, in.qkv, in.dout, in.e_out, in.e_lse),
                        run_kernels(four, in.qkv, in.dout, in.e_out, in.e_lse));
  }
}

// The launchers' block height ("auto"): the fewest waves, ties to fewer blocks, then to fewer
// warp slots. resident(w) stands in for the occupancy calculator.
TEST(FlashBlockHeight, FewestWavesThenFewestBlocks) {
  // Registers bound at 16 warps an SM (the forward at D = 64, 128 a thread) and shared memory
  // at 5 blocks: N = 65 (5 warp rows) fills 2 blocks of 3 warps, 5 of them an SM (0.4 of an SM's
  // turn a head) where 4 warps take 2 blocks, 4 an SM (0.5).
  auto forward = [](int w) { return std::min<Index>(16 / w, 5); };
  EXPECT_EQ(k::choose_block_warps(65, forward), 3);
  // N = 197 (13 warp rows): 4 blocks of 4 (4 an SM) and 5 of 3 (5 an SM) tie; fewer blocks win.
  EXPECT_EQ(k::choose_block_warps(197, forward), 4);
  EXPECT_EQ(k::choose_block_warps(17, forward), 2);  // one block of 2: 5 an SM beat 4
  EXPECT_EQ(k::choose_block_warps(50, forward), 4);  // one block of 4
  EXPECT_EQ(k::choose_block_warps(1, forward), 1);
  // The dK/dV kernel's 226 registers: 2 blocks of 4 or 3 warps an SM, 4 of 2 (shared memory):
  // N = 197 takes 7 blocks of 2 (1.75 turns) over 4 of 4 (2.0) and 5 of 3 (2.5).
  auto dkv = [](int w) -> Index { return w >= 3 ? 2 : 4; };
  EXPECT_EQ(k::choose_block_warps(197, dkv), 2);
  // Heights that cannot run (0 blocks an SM) are never chosen.
  auto only_two = [](int w) -> Index { return w == 2 ? 1 : 0; };
  EXPECT_EQ(k::choose_block_warps(197, only_two), 2);
  EXPECT_THROW(k::choose_block_warps(197, [](int) -> Index { return 0; }), std::exception);
}

}  // namespace
