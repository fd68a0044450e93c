// The pooling backward's chunk kernel (ops/cuda/pool_kernels.cuh) run on the CPU
// (tests/cuda_host_sim.h) against the one-thread-an-element formula of pool.cu's other kernel,
// bit for bit: the class token and the mean of the patch tokens, with and without a class
// token, bf16 and fp32, a grid smaller than the chunks (its stride), the rows outside the pooled
// ones untouched. The GPU test CudaOps/*.PoolWideKernelGivesTheElementwiseBits runs both
// kernels on the device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_host_sim.h"
#include "emu_test_util.h"
#include "ops/cuda/pool_kernels.cuh"

namespace {

using vit::bf16;
using vit::Index;
namespace cu = vit::cuda;
namespace pk = vit::cuda::pool_kernels;
using vit::emu_test::as_floats;
using vit::emu_test::Gen;
using vit::emu_test::values_of;

struct PoolCase {
  Index B, N, prefix, C;
  bool avg;
};

template <typename T>
void check_pool_backward(const PoolCase& c, uint64_t seed) {
  SCOPED_TRACE("B=" + std::to_string(c.B) + " N=" + std::to_string(c.N) +
               " prefix=" + std::to_string(c.prefix) + " C=" + std::to_string(c.C) +
               (c.avg ? " avg" : " token"));
  ASSERT_EQ(c.C % cu::kChunk, 0) << "pool.cu takes the chunk kernel for whole chunks only";
  Gen gen(seed);
  const std::vector<T> dout = values_of<T>(gen, c.B * c.C),
                       dx0 = values_of<T>(gen, c.B * c.N * c.C);
  const Index first = c.avg ? c.prefix : 0, rows = c.avg ? c.N - c.prefix : 1;
  const float inv = c.avg ? 1.0f / float(rows) : 1.0f;
  std::vector<T> want = dx0, got = dx0;
  for (Index b = 0; b < c.B; ++b)
    for (Index n = first; n < first + rows; ++n)
      for (Index ch = 0; ch < c.C; ++ch) {
        T& d = want[(b * c.N + n) * c.C + ch];
        d = T(float(d) + float(dout[b * c.C + ch]) * inv);  // pool_backward_kernel's formula
      }
  const int chunks = int(c.B * rows * c.C / cu::kChunk);
  cu::launch({3}, {32}, [&] {  // fewer threads than chunks: the grid's stride too
    pk::pool_backward_chunks_kernel<T>(got.data(), dout.data(), int(c.N), int(c.C), int(first),
                                       int(rows), chunks, inv);
  });
  vit::emu_test::expect_same_bits(as_floats(got), as_floats(want));
}

TEST(PoolKernelsOnHost, ChunkBackwardIsTheElementwiseFormula) {
  uint64_t seed = 10;
  // ViT-Ti/4's pooled classifier (no class token, C = 192), a class token's mean and the token
  // itself (C = 384), one sample of one chunk
  for (const PoolCase& c : {PoolCase{5, 64, 0, 192, true}, PoolCase{3, 17, 1, 384, true},
                            PoolCase{3, 17, 1, 384, false}, PoolCase{1, 2, 1, 8, true}}) {
    check_pool_backward<bf16>(c, ++seed);
    check_pool_backward<float>(c, ++seed);
  }
}

}  // namespace
