// The one-kernel flash backward (flash_mma_fused_kernels.cuh), an experiment outside vitrain
// (README.md): its CUDA source run on the CPU (tests/cuda_host_sim.h, cuda_host_sim_mma.h: one
// host thread per CUDA thread, the warp's ldmatrix, mma.sync and shuffles as exchanges of the
// lanes' registers) against vitrain's two-kernel backward (ops/cuda/flash_mma_kernels.cuh) run
// the same way, bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda_host_sim.h"
#include "cuda_host_sim_mma.h"
#include "emu_test_util.h"
#include "flash_mma_fused_kernels.cuh"
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
  int warps = k::kWarps;      // VIT_FLASH_WARPS
  bool fused = false;         // the one-kernel backward: one block of ceil(N / 16) warps a head
  bool fused_reload = false;  // its 13-warp build: key and value fragments reloaded per group

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
    if (fused) {
      if constexpr (D <= 64) {  // as flash_attention_mma.cu launches it
        const int fused_warps = (s.N + 15) / 16;
        ASSERT_LE(fused_warps, k::kFusedWarps);
        cu::launch({unsigned(s.B * s.H)}, {unsigned(32 * fused_warps)},
                   k::fused_backward_smem_bytes<D>(fused_warps), [&] {
                     if (fused_reload)
                       k::flash_mma_fused_backward_kernel<D, k::kFusedGroups,
                                                          k::kFusedNarrowRegisters, true>(
                           dqkv, dout, qkv, lse, drow, s.N, s.H, scale, vec);
                     else
                       k::flash_mma_fused_backward_kernel<D, k::kFusedGroups>(
                           dqkv, dout, qkv, lse, drow, s.N, s.H, scale, vec);
                   });
        return;
      }
      FAIL() << "the fused backward runs head dims up to 64";
    }
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

// The one-kernel backward: one block owns all of a head's keys and forms dQ from the dS^T tiles
// its warps leave in shared memory. dK and dV come from the dK/dV kernel's own helper and dQ
// sums the same dS values, 16 keys at a time in ascending order, as the dQ kernel does, so all
// of dqkv must have the two kernels' bits: N = 197 (13 warps, the last with 5 keys), 17 (2
// samples, 2 heads), 65 (a last query tile of one row), 208 (13 full warps, the most); D = 32,
// 48 (16-column dQ units) and 64; the scalar tile loads too; both builds (the key and value
// fragments held, and reloaded per query group as the 13-warp blocks run it).
TEST(FlashFusedBackwardOnHost, GivesTheTwoKernelsBits) {
  const struct {
    Shape s;
    bool vec;
  } cases[] = {{kShapes[0], true},
               {kShapes[1], true},
               {kShapes[2], true},
               {{1, 208, 1, 32}, true},
               {kShapes[2], false}};
  uint64_t seed = 1000;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.s.str() + (c.vec ? "" : " scalar"));
    const Case in = make_case(c.s, ++seed);
    Launch two{c.s, c.vec}, fused{c.s, c.vec};
    fused.fused = true;
    const Result want = run_kernels(two, in.qkv, in.dout, in.e_out, in.e_lse);
    for (const bool reload : {false, true}) {
      SCOPED_TRACE(reload ? "fragments reloaded per group" : "fragments held");
      fused.fused_reload = reload;
      const Result got = run_kernels(fused, in.qkv, in.dout, in.e_out, in.e_lse);
      vit::emu_test::expect_same_bits(widen(got.dqkv), widen(want.dqkv));
    }
  }
}

}  // namespace
