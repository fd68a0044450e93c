// The sm_90a wgmma GEMM kernel (ops/cuda/gemm_sm90_kernels.cuh), its CUDA source run on the CPU
// (tests/cuda_host_sim.h with cuda_host_sim_sm90.h: one host thread per CUDA thread, the
// mbarrier pipeline, TMA boxes and wgmma descriptors simulated), against an fp64 product of the
// same bf16 operands. This is where the kernel's stage ring and barrier phases, its tile
// coordinates, edge handling and accumulator layout are checked in CI; the device's own
// reading of the descriptors and swizzle is for the GPU test (CudaSm90Gemm.* in
// test_cuda_ops.cpp), whose first run is the arbiter of what this simulation assumes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "bf16_ulps.h"
#include "cuda_host_sim.h"
#include "cuda_host_sim_sm90.h"
#include "gemm_sm90_kernels.cuh"

namespace {

using vit::bf16;
namespace cu = vit::cuda;
namespace k = vit::cuda::gemm_sm90;

struct Case {
  int M, N, K;
  int ldc;  // >= N: columns N .. ldc - 1 must stay untouched
  bool bias;
  k::Epilogue epi;
  bool trans_b;  // B stored (K, N) row-major, C = A B
};

std::vector<bf16> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<bf16> v(n);
  for (bf16& x : v) x = bf16(dist(rng));
  return v;
}

float widen(bf16 x) {
  return float(x);
}

// The persistent kernel over `blocks` blocks (0: one per work unit).
template <k::Epilogue kEpi, bool kTransA, bool kTransB>
void launch_kernel(const cu::sm90::TensorMap& map_a, const cu::sm90::TensorMap& map_b,
                   const k::Params& p, int blocks) {
  const int units = k::unit_count(p);
  const SimDim3 grid{unsigned(blocks > 0 ? std::min(blocks, units) : units), 1, 1};
  cu::launch(grid, {unsigned(k::kThreads), 1, 1}, size_t(k::kSharedBytes),
             [&] { k::gemm_kernel<kEpi, kTransA, kTransB>(map_a, map_b, p); });
}

template <bool kTransB>
void launch_any(const Case& c, const cu::sm90::TensorMap& map_a, const cu::sm90::TensorMap& map_b,
                const k::Params& p, int blocks) {
  switch (c.epi) {
    case k::Epilogue::kBias:
      return launch_kernel<k::Epilogue::kBias, false, kTransB>(map_a, map_b, p, blocks);
    case k::Epilogue::kBiasGelu:
      return launch_kernel<k::Epilogue::kBiasGelu, false, kTransB>(map_a, map_b, p, blocks);
    case k::Epilogue::kGeluGrad:
      return launch_kernel<k::Epilogue::kGeluGrad, false, kTransB>(map_a, map_b, p, blocks);
    case k::Epilogue::kPartial:
      FAIL() << "run_wgrad_case runs the partial sums";
  }
}

// blocks: the persistent grid's size (0: a block per tile), so that fewer blocks than tiles
// carry the stage ring and the column sums' shared buffer from one tile to the next.
void run_case(const Case& c, uint32_t seed, int blocks = 0) {
  std::mt19937 rng(seed);
  const bool gelu = c.epi == k::Epilogue::kBiasGelu, grad = c.epi == k::Epilogue::kGeluGrad;
  // A padded row stride on A, and on B when it is (K, N)
  const int lda = c.K + 8, ldb = c.trans_b ? c.N + 8 : c.K;
  std::vector<bf16> A = random_bf16(size_t(c.M) * lda, rng, 1.0f);
  std::vector<bf16> B = random_bf16(size_t(c.trans_b ? c.K : c.N) * ldb, rng, 0.05f);
  std::vector<bf16> bias = random_bf16(size_t(c.N), rng, 0.5f);
  std::vector<bf16> aux = random_bf16(size_t(c.M) * c.ldc, rng, 1.5f);
  bf16 poison;
  poison.bits = 0x7f7f;
  std::vector<bf16> out(size_t(c.M) * c.ldc, poison), pre(size_t(c.M) * c.ldc, poison);
  auto b_at = [&](int j, int kk) {  // op(B)(kk, j)
    return widen(c.trans_b ? B[size_t(kk) * ldb + j] : B[size_t(j) * ldb + kk]);
  };

  const cu::sm90::TensorMap map_a{A.data(),          uint64_t(c.K),    uint64_t(c.M),
                                  uint64_t(lda) * 2, uint32_t(k::kBK), uint32_t(k::kBM)};
  const cu::sm90::TensorMap map_b =
      c.trans_b ? cu::sm90::TensorMap{B.data(), uint64_t(c.N),   uint64_t(c.K), uint64_t(ldb) * 2,
                                      64,       uint32_t(k::kBK)}
                : cu::sm90::TensorMap{B.data(),          uint64_t(c.K),    uint64_t(c.N),
                                      uint64_t(ldb) * 2, uint32_t(k::kBK), uint32_t(k::kBN)};
  const int row_blocks = (c.M + k::kBM - 1) / k::kBM;
  std::vector<float> colsum(size_t(row_blocks) * c.N, std::nanf(""));
  const k::Params p{out.data(),
                    gelu ? pre.data() : nullptr,
                    grad ? aux.data() : nullptr,
                    c.bias ? bias.data() : nullptr,
                    grad ? colsum.data() : nullptr,
                    nullptr,
                    0,
                    c.M,
                    c.N,
                    c.K,
                    c.ldc};
  if (c.trans_b)
    launch_any<true>(c, map_a, map_b, p, blocks);
  else
    launch_any<false>(c, map_a, map_b, p, blocks);

  int far = 0, formula_off = 0;
  double worst = 0.0;
  for (int i = 0; i < c.M; ++i) {
    for (int j = 0; j < c.ldc; ++j) {
      const size_t at = size_t(i) * c.ldc + j;
      if (j >= c.N) {  // the padding of each row: never written
        ASSERT_EQ(out[at].bits, poison.bits) << "out (" << i << ", " << j << ") written";
        if (gelu) {
          ASSERT_EQ(pre[at].bits, poison.bits) << "pre (" << i << ", " << j << ") written";
        }
        continue;
      }
      double sum = c.bias ? double(widen(bias[j])) : 0.0;
      for (int kk = 0; kk < c.K; ++kk) sum += double(widen(A[size_t(i) * lda + kk])) * b_at(j, kk);
      ASSERT_NE(out[at].bits, poison.bits) << "(" << i << ", " << j << ") never written";
      if (grad) {
        // d(pre) of the product rounded to bf16, as the separate ops compute it
        const float x = widen(aux[at]);
        const bf16 want = bf16(vit::cuda::GeluBackward{}(widen(bf16(float(sum))), x));
        formula_off += out[at].bits != want.bits;
        const double exact = vit::cuda::GeluBackward{}(float(sum), x);
        ASSERT_LE(vit::test::bf16_steps(widen(out[at]), float(exact)), 2.0)
            << "d(pre) (" << i << ", " << j << "): " << widen(out[at]) << " vs " << exact;
        continue;
      }
      const bf16 y = gelu ? pre[at] : out[at];
      const double steps = vit::test::bf16_steps(widen(y), float(sum));
      worst = std::max(worst, steps);
      if (steps > 0.5) ++far;  // not the nearest bf16 of the exact sum
      ASSERT_LE(steps, 1.0) << "(" << i << ", " << j << "): " << widen(y) << " vs " << sum;
      if (gelu) {  // the activation of the stored pre-activation, bit for bit
        const bf16 act = bf16(vit::cuda::GeluForward{}(widen(y)));
        ASSERT_EQ(out[at].bits, act.bits) << "act (" << i << ", " << j << ")";
      }
    }
  }
  if (grad) {  // each row block's column sums of the stored d(pre), for the bias gradient
    for (int t = 0; t < row_blocks; ++t)
      for (int j = 0; j < c.N; ++j) {
        double want = 0.0, scale = 0.0;
        for (int i = t * k::kBM; i < std::min(c.M, (t + 1) * k::kBM); ++i) {
          want += widen(out[size_t(i) * c.ldc + j]);
          scale += std::fabs(widen(out[size_t(i) * c.ldc + j]));
        }
        const float got = colsum[size_t(t) * c.N + j];
        ASSERT_NEAR(got, want, 1e-6 * scale + 1e-30) << "column sum (" << t << ", " << j << ")";
      }
  }
  // fp32 accumulation in another order moves a few results to the neighbouring bf16; a wrong
  // tile, descriptor or fragment moves most of them far.
  EXPECT_LE(far, c.M * c.N / 50) << "worst " << worst << " steps";
  EXPECT_LE(formula_off, c.M * c.N / 50) << "d(pre) not the separate ops' formula";
}

using E = k::Epilogue;

TEST(Sm90GemmOnHost, OneTileNoBias) {
  run_case({128, 128, 64, 128, false, E::kBias, false}, 1);
}

TEST(Sm90GemmOnHost, EdgesOfMNAndKWithBias) {
  // 2 x 2 blocks, the last of each partial; K = 200: 4 slices, the last 8 wide (TMA's zeros)
  run_case({200, 136, 200, 142, true, E::kBias, false}, 2);
}

TEST(Sm90GemmOnHost, StageRingWrapsThriceWithGelu) {
  // K = 456: 8 slices through 3 stages, so every barrier passes through both parities twice
  run_case({130, 250, 456, 250, true, E::kBiasGelu, false}, 3);
}

TEST(Sm90GemmOnHost, TransposedBOneTile) {
  // B (K, N) read MN-major: the data-gradient GEMM's weight
  run_case({128, 128, 64, 128, false, E::kBias, true}, 4);
}

TEST(Sm90GemmOnHost, TransposedBAtTheEdgesWithTheGeluGradient) {
  // N = 180: the second block's first 64-column box straddles N, its second lies wholly past
  // it (TMA's zeros, counted in the stage's bytes all the same)
  run_case({150, 180, 328, 186, false, E::kGeluGrad, true}, 5);
}

// The weight gradient's form: C (Nout, K) = dout (R, Nout)^T @ inp (R, K), both operands read
// MN-major, fp32 partial sums per split of the R tokens (the work unit's z).
void run_wgrad_case(int R, int Nout, int K, int per, uint32_t seed, int blocks = 0) {
  std::mt19937 rng(seed);
  const int ld_dout = Nout + 8, ld_inp = K + 8;
  const std::vector<bf16> dout = random_bf16(size_t(R) * ld_dout, rng, 1.0f);
  const std::vector<bf16> inp = random_bf16(size_t(R) * ld_inp, rng, 1.0f);
  const int all = (R + k::kBK - 1) / k::kBK, slices = per > 0 ? per : all;
  const int splits = (all + slices - 1) / slices;
  std::vector<float> part(size_t(splits) * Nout * K, std::nanf(""));
  const cu::sm90::TensorMap map_a{dout.data(), uint64_t(Nout),  uint64_t(R), uint64_t(ld_dout) * 2,
                                  64,          uint32_t(k::kBK)};
  const cu::sm90::TensorMap map_b{inp.data(),           uint64_t(K), uint64_t(R),
                                  uint64_t(ld_inp) * 2, 64,          uint32_t(k::kBK)};
  const k::Params p{nullptr, nullptr, nullptr, nullptr, nullptr, part.data(), per, Nout, K, R, K};
  ASSERT_EQ(k::unit_count(p),
            splits * ((Nout + k::kBM - 1) / k::kBM) * ((K + k::kBN - 1) / k::kBN));
  launch_kernel<k::Epilogue::kPartial, true, true>(map_a, map_b, p, blocks);
  for (int z = 0; z < splits; ++z)
    for (int n = 0; n < Nout; ++n)
      for (int c = 0; c < K; ++c) {
        double want = 0.0, scale = 0.0;
        for (int r = z * slices * k::kBK; r < std::min(R, (z + 1) * slices * k::kBK); ++r) {
          const double t = double(widen(dout[size_t(r) * ld_dout + n])) *
                           double(widen(inp[size_t(r) * ld_inp + c]));
          want += t;
          scale += std::fabs(t);
        }
        const float got = part[(size_t(z) * Nout + n) * K + c];
        ASSERT_NEAR(got, want, 1e-6 * scale + 1e-30)
            << "split " << z << " (" << n << ", " << c << ")";
      }
}

TEST(Sm90GemmOnHost, OneBlockCarriesTheRingThroughEveryTile) {
  // 2 x 3 tiles of 5 slices each through one block: the ring's phases run on across tiles
  // (30 slices, 3 stages), and every tile's column sums reuse one shared buffer
  run_case({200, 300, 300, 302, true, E::kGeluGrad, false}, 8, 1);
}

TEST(Sm90GemmOnHost, BlocksTakeUnevenSharesOfTheTiles) {
  // 3 x 2 tiles over 4 blocks: blocks 0 and 1 take two tiles each (units 4 and 5 too), 2 and 3
  // one
  run_case({300, 250, 136, 250, true, E::kBiasGelu, true}, 9, 4);
}

TEST(Sm90GemmOnHost, WeightGradientOneSplit) {
  run_wgrad_case(128, 128, 128, 0, 6);
}

TEST(Sm90GemmOnHost, WeightGradientSplitsAtTheEdges) {
  // 300 tokens: 5 slices, 2 a split (the last one alone, 44 rows), Nout and K past 128
  run_wgrad_case(300, 136, 200, 2, 7);
}

TEST(Sm90GemmOnHost, WeightGradientSplitsAndTilesThroughThreeBlocks) {
  // 3 splits x 2 x 2 tiles = 12 units over 3 blocks, each taking tiles of every split
  run_wgrad_case(300, 136, 200, 2, 10, 3);
}

}  // namespace
