// The wide-word patch and token kernels (ops/cuda/embed_kernels.cuh) run on the CPU
// (tests/cuda_host_sim.h) against plain loops: the patch runs at every word width (16, 8 and 4
// bytes) with images whose size P does not divide, the token assembly with and without a class
// token for bf16 and fp32 tokens and the fp32 residual stream, the backward's patch rows and the
// position embedding's batch sums. The copies and the assembly's one rounding are compared bit
// for bit; the batch sums are fp32 sums in slices, so within rounding of fp64's, and the same
// bits on a second run. The GPU tests (CudaOps/*.Im2Patches, CudaOps/*.EmbedTokens) run them on
// the device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_host_sim.h"
#include "emu_test_util.h"
#include "ops/cuda/embed_kernels.cuh"

namespace {

using vit::bf16;
using vit::Index;
namespace cu = vit::cuda;
namespace ek = vit::cuda::embed_kernels;
using vit::emu_test::as_floats;
using vit::emu_test::Gen;
using vit::emu_test::values_of;

struct ImageCase {
  Index B, Cin, H, W, P;
};

// patches (B, gh * gw, Cin * P * P) from img (B, Cin, H, W), the patch convolution's im2col.
template <typename T>
std::vector<T> im2patches_ref(const std::vector<T>& img, const ImageCase& c) {
  const Index gh = c.H / c.P, gw = c.W / c.P, F = c.Cin * c.P * c.P;
  std::vector<T> out(c.B * gh * gw * F);
  for (Index b = 0; b < c.B; ++b)
    for (Index py = 0; py < gh; ++py)
      for (Index px = 0; px < gw; ++px)
        for (Index ch = 0; ch < c.Cin; ++ch)
          for (Index ph = 0; ph < c.P; ++ph)
            for (Index pw = 0; pw < c.P; ++pw)
              out[((b * gh + py) * gw + px) * F + (ch * c.P + ph) * c.P + pw] =
                  img[((b * c.Cin + ch) * c.H + py * c.P + ph) * c.W + px * c.P + pw];
  return out;
}

template <typename T, int kWord>
void check_im2patches(const ImageCase& c, uint64_t seed) {
  SCOPED_TRACE("B=" + std::to_string(c.B) + " Cin=" + std::to_string(c.Cin) +
               " H=" + std::to_string(c.H) + " W=" + std::to_string(c.W) +
               " P=" + std::to_string(c.P) + " word=" + std::to_string(kWord));
  // what embed.cu asks before it takes these words (the vectors' data is 16-byte aligned)
  ASSERT_EQ(c.P * Index(sizeof(T)) % kWord, 0) << "a run is not whole words";
  ASSERT_EQ(c.W * Index(sizeof(T)) % kWord, 0) << "an image row is not whole words";
  Gen gen(seed);
  const std::vector<T> img = values_of<T>(gen, c.B * c.Cin * c.H * c.W);
  const std::vector<T> want = im2patches_ref(img, c);
  std::vector<T> got(want.size(), T(-7.0f));  // a value no run writes
  const int runs = int(c.B * (c.H / c.P) * (c.W / c.P) * c.Cin * c.P);
  cu::launch({3}, {64}, [&] {  // fewer threads than runs: the grid's stride too
    ek::im2patches_runs_kernel<T, kWord>(got.data(), img.data(), runs, int(c.Cin), int(c.H),
                                         int(c.W), int(c.P));
  });
  vit::emu_test::expect_same_bits(as_floats(got), as_floats(want));
}

TEST(EmbedKernelsOnHost, PatchRunsAreTheIm2col) {
  // ViT-S/16's runs (32 bytes of bf16), ViT-Ti/4's (8 bytes), 4-byte runs, and images P does not
  // divide (their last rows and columns belong to no patch)
  check_im2patches<bf16, 16>({2, 3, 32, 32, 16}, 1);
  check_im2patches<float, 16>({2, 3, 32, 32, 16}, 2);
  check_im2patches<bf16, 8>({3, 3, 32, 32, 4}, 3);
  check_im2patches<float, 16>({3, 3, 32, 32, 4}, 4);
  check_im2patches<float, 8>({2, 1, 30, 30, 2}, 5);
  check_im2patches<bf16, 4>({2, 2, 30, 26, 2}, 6);
  check_im2patches<bf16, 8>({1, 3, 35, 36, 8}, 7);
}

struct TokenCase {
  Index B, N, prefix, C;
};
std::string str(const TokenCase& c) {
  return "B=" + std::to_string(c.B) + " N=" + std::to_string(c.N) +
         " prefix=" + std::to_string(c.prefix) + " C=" + std::to_string(c.C);
}

// x (B, N, C) = [cls | patch_out] + pos, rounded once to X; the wide kernel against the loop.
template <typename T, typename X>
void check_tokens_forward(const TokenCase& c, uint64_t seed) {
  SCOPED_TRACE(str(c));
  Gen gen(seed);
  const Index Np = c.N - c.prefix;
  const std::vector<T> patch = values_of<T>(gen, c.B * Np * c.C), cls = values_of<T>(gen, c.C),
                       pos = values_of<T>(gen, c.N * c.C, 0.5);
  std::vector<X> want(c.B * c.N * c.C), got(want.size(), X(-7.0f));
  for (Index b = 0; b < c.B; ++b)
    for (Index n = 0; n < c.N; ++n)
      for (Index ch = 0; ch < c.C; ++ch) {
        const float src =
            n < c.prefix ? float(cls[ch]) : float(patch[(b * Np + n - c.prefix) * c.C + ch]);
        want[(b * c.N + n) * c.C + ch] = X(src + float(pos[n * c.C + ch]));
      }
  const int chunks = int(c.B * c.N * c.C / cu::kChunk);
  cu::launch({2}, {32}, [&] {
    ek::embed_tokens_forward_chunks_kernel<T, X>(got.data(), patch.data(), cls.data(), pos.data(),
                                                 chunks, int(c.N), int(c.prefix), int(c.C));
  });
  vit::emu_test::expect_same_bits(as_floats(got), as_floats(want));
}

TEST(EmbedKernelsOnHost, TokenChunksAreTheElementwiseSum) {
  for (const TokenCase& c :
       {TokenCase{3, 5, 1, 16}, TokenCase{2, 7, 0, 24}, TokenCase{4, 17, 1, 8}}) {
    check_tokens_forward<bf16, bf16>(c, 10);
    check_tokens_forward<bf16, float>(c, 11);  // --fp32-residual: the stream unrounded
    check_tokens_forward<float, float>(c, 12);
  }
}

// The backward: the patch rows of dx rounded to T, and dpos (N, C) += the batch sum of dx.
template <typename T, typename X>
void check_tokens_backward(const TokenCase& c, uint64_t seed) {
  SCOPED_TRACE(str(c));
  Gen gen(seed);
  const Index Np = c.N - c.prefix;
  const std::vector<X> dx = values_of<X>(gen, c.B * c.N * c.C);
  std::vector<T> want(c.B * Np * c.C), got(want.size(), T(-7.0f));
  for (Index b = 0; b < c.B; ++b)
    for (Index p = 0; p < Np; ++p)
      for (Index ch = 0; ch < c.C; ++ch)
        want[(b * Np + p) * c.C + ch] = T(float(dx[(b * c.N + c.prefix + p) * c.C + ch]));
  const int chunks = int(c.B * Np * c.C / cu::kChunk);
  cu::launch({2}, {32}, [&] {
    ek::embed_dpatch_chunks_kernel<T, X>(got.data(), dx.data(), chunks, int(c.N), int(c.prefix),
                                         int(c.C));
  });
  vit::emu_test::expect_same_bits(as_floats(got), as_floats(want));

  const std::vector<float> dpos0 = values_of<float>(gen, c.N * c.C);  // a gradient accumulates
  std::vector<float> dpos = dpos0, again = dpos0;
  const unsigned blocks = unsigned((c.N * c.C / cu::kChunk + 31) / 32);
  auto run = [&](std::vector<float>& out) {
    cu::launch({blocks}, {unsigned(ek::kDposThreads)}, [&] {
      ek::embed_dpos_chunks_kernel<X>(out.data(), dx.data(), int(c.B), int(c.N), int(c.C));
    });
  };
  run(dpos);
  run(again);
  size_t off = 0;
  for (Index i = 0; i < c.N * c.C; ++i) {
    double sum = dpos0[i], scale = std::fabs(dpos0[i]);
    for (Index b = 0; b < c.B; ++b) {
      sum += double(float(dx[b * c.N * c.C + i]));
      scale += std::fabs(double(float(dx[b * c.N * c.C + i])));
    }
    off += !(std::fabs(dpos[i] - sum) <= 4e-7 * scale);
  }
  EXPECT_EQ(off, 0u) << "of " << c.N * c.C << " dpos sums beyond fp32 rounding";
  // the second run added the same sums to the same start: the same bits
  SCOPED_TRACE("dpos rerun: deterministic");
  vit::emu_test::expect_same_bits(again, dpos);
}

TEST(EmbedKernelsOnHost, TokenGradientsAreThePatchRowsAndTheBatchSums) {
  // B over kDposSlices (slices of 3 and 2 rows), under it (empty slices), 38 chunks (a block's 32
  // and a partial second)
  for (const TokenCase& c :
       {TokenCase{19, 5, 1, 16}, TokenCase{3, 7, 0, 24}, TokenCase{9, 19, 1, 16}}) {
    check_tokens_backward<bf16, bf16>(c, 20);
    check_tokens_backward<bf16, float>(c, 21);
    check_tokens_backward<float, float>(c, 22);
  }
}

}  // namespace
