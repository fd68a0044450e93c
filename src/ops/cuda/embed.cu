// Patch extraction (the im2col of the stride-P patch convolution) and token assembly (class
// token, position embedding). The tokens x and their gradient dx are the residual stream's X
// (ops.h): with X = float (T = bf16), x is the fp32 sum unrounded and dpatch_out is dx rounded
// once to T (a copy when X = T). Where the kernel plan picks them (the embed family: "wide" by
// rule, or the autotuner's pick; both give the same bits, tests/test_embed_on_host.cpp) and
// shapes and pointers allow, the kernels of embed_kernels.cuh move runs of values over wide
// words; else the ones below, one thread an element.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/embed_kernels.cuh"
#include "ops/cuda/plan_timing.cuh"

namespace vit::cuda {

namespace {

constexpr Index kInt32Max = 2147483647;

// Whether the plan runs the patch embedding of B images of `patches` patches on wide words.
template <typename T>
bool embed_wide(Index B, Index patches) {
  return planned_choice(embed_key(B, patches, storage_of<T>())).variant == "wide";
}

bool aligned_to(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % unsigned(bytes) == 0;
}

// Whether rows of C values at these pointers (null ones aside) deal into 16-byte chunks.
bool chunked(Index C, std::initializer_list<const void*> pointers) {
  return C % kChunk == 0 && all_aligned16(pointers);
}

template <typename T>
__global__ void im2patches_kernel(T* patches, const T* img, Index B, Index Cin, Index Himg,
                                  Index Wimg, Index P) {
  // img (B, Cin, Himg, Wimg) -> patches (B, gh * gw, Cin * P * P), each (c, ph, pw)
  const Index gh = Himg / P, gw = Wimg / P, F = Cin * P * P;
  VIT_GRID_STRIDE(i, B * gh * gw * F) {
    const Index f = i % F, q = i / F;
    const Index b = q / (gh * gw), p = q % (gh * gw), py = p / gw, px = p % gw;
    const Index c = f / (P * P), ph = (f / P) % P, pw = f % P;
    patches[i] = img[((b * Cin + c) * Himg + py * P + ph) * Wimg + px * P + pw];
  }
}

template <typename T, typename X>
__global__ void embed_tokens_forward_kernel(X* x, const T* patch_out, const T* cls, const T* pos,
                                            Index B, Index N, Index prefix, Index C) {
  // x (B, N, C) in X; patch_out (B, N - prefix, C); cls (C); pos (N, C)
  VIT_GRID_STRIDE(i, B * N * C) {
    const Index c = i % C, n = (i / C) % N, b = i / (C * N);
    const float src =
        n < prefix ? to_f32(cls[c]) : to_f32(patch_out[(b * (N - prefix) + n - prefix) * C + c]);
    x[i] = from_f32<X>(src + to_f32(pos[n * C + c]));
  }
}

template <typename T, typename X>
__global__ void embed_dpatch_kernel(T* dpatch_out, const X* dx, Index B, Index N, Index prefix,
                                    Index C) {
  // dpatch_out (B, N - prefix, C) = the patch rows of dx (B, N, C) in X
  const Index Np = N - prefix;
  VIT_GRID_STRIDE(i, B * Np * C) {
    const Index c = i % C, p = (i / C) % Np, b = i / (C * Np);
    dpatch_out[i] = convert_to<T>(dx[(b * N + prefix + p) * C + c]);
  }
}

template <typename X>
__global__ void embed_dpos_kernel(float* dpos, const X* dx, Index B, Index N, Index C) {
  // dpos (N, C) += sum over b of dx (B, N, C) in X; one thread per (n, c), coalesced over c
  VIT_GRID_STRIDE(i, N * C) {
    float s = 0.0f;
    for (Index b = 0; b < B; ++b) s += to_f32(dx[b * N * C + i]);
    dpos[i] += s;
  }
}

template <typename X>
__global__ void embed_dcls_kernel(float* dcls, const X* dx, Index B, Index N, Index prefix,
                                  Index C) {
  // dcls (C) += sum over b and the prefix rows n < prefix of dx (B, N, C) in X
  VIT_GRID_STRIDE(c, C) {
    float s = 0.0f;
    for (Index n = 0; n < prefix; ++n)
      for (Index b = 0; b < B; ++b) s += to_f32(dx[(b * N + n) * C + c]);
    dcls[c] += s;
  }
}

}  // namespace

// The patches as runs of P values (embed_kernels.cuh) copied in the widest words (16, 8 or 4
// bytes) that a run, an image row and both pointers align to; false, launching nothing, where
// none does or the runs do not fit 32-bit indices.
template <typename T>
bool launch_im2patches_runs(T* patches, const T* img, Index B, Index Cin, Index Himg, Index Wimg,
                            Index P) {
  const Index runs = B * (Himg / P) * (Wimg / P) * Cin * P;
  if (runs > kInt32Max || Himg > kInt32Max || Wimg > kInt32Max) return false;
  auto run = [&](auto word) {
    constexpr int kWord = decltype(word)::value;
    const Index bytes = P * Index(sizeof(T)), row = Wimg * Index(sizeof(T));
    if (bytes % kWord || row % kWord || !aligned_to(patches, kWord) || !aligned_to(img, kWord))
      return false;
    embed_kernels::im2patches_runs_kernel<T, kWord>
        <<<grid_stride_blocks(runs), kBlock, 0, stream()>>>(patches, img, int(runs), int(Cin),
                                                            int(Himg), int(Wimg), int(P));
    VIT_CUDA_LAUNCHED();
    return true;
  };
  return run(std::integral_constant<int, 16>()) || run(std::integral_constant<int, 8>()) ||
         run(std::integral_constant<int, 4>());
}

template <typename T>
void im2patches(T* patches, const T* img, Index B, Index Cin, Index Himg, Index Wimg, Index P) {
  const Index patch_count = (Himg / P) * (Wimg / P), n = B * patch_count * Cin * P * P;
  if (n <= 0) return;
  // patches (B, patch_count, Cin P P): overwritten, so the autotuner may time it here
  auto launch = [&](const KernelChoice& choice) {
    if (choice.variant == "wide" && launch_im2patches_runs(patches, img, B, Cin, Himg, Wimg, P))
      return;
    im2patches_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(patches, img, B, Cin, Himg,
                                                                      Wimg, P);
    VIT_CUDA_LAUNCHED();
  };
  launch(tuned_choice(embed_key(B, patch_count, storage_of<T>()), launch));
}

template <typename T, typename X>
void embed_tokens_forward(X* x, const T* patch_out, const T* cls, const T* pos, Index B, Index N,
                          Index prefix, Index C) {
  if (B * N * C <= 0) return;
  const Index chunks = B * N * C / kChunk;
  if (embed_wide<T>(B, N - prefix) && chunks <= kInt32Max && chunked(C, {x, patch_out, cls, pos})) {
    embed_kernels::
        embed_tokens_forward_chunks_kernel<<<grid_stride_blocks(chunks), kBlock, 0, stream()>>>(
            x, patch_out, cls, pos, int(chunks), int(N), int(prefix), int(C));
  } else {
    embed_tokens_forward_kernel<<<grid_stride_blocks(B * N * C), kBlock, 0, stream()>>>(
        x, patch_out, cls, pos, B, N, prefix, C);
  }
  VIT_CUDA_LAUNCHED();
}

template <typename T, typename X>
void embed_tokens_backward(T* dpatch_out, float* dcls, float* dpos, const X* dx, Index B, Index N,
                           Index prefix, Index C) {
  if (B * N * C <= 0) return;
  const bool wide =
      embed_wide<T>(B, N - prefix) && B * N * C / kChunk <= kInt32Max && chunked(C, {dx});
  if (dpatch_out && N > prefix) {
    const Index chunks = B * (N - prefix) * C / kChunk;
    if (wide && aligned16(dpatch_out)) {
      embed_kernels::
          embed_dpatch_chunks_kernel<<<grid_stride_blocks(chunks), kBlock, 0, stream()>>>(
              dpatch_out, dx, int(chunks), int(N), int(prefix), int(C));
    } else {
      embed_dpatch_kernel<<<grid_stride_blocks(B * (N - prefix) * C), kBlock, 0, stream()>>>(
          dpatch_out, dx, B, N, prefix, C);
    }
    VIT_CUDA_LAUNCHED();
  }
  if (dpos) {
    if (wide && aligned16(dpos)) {
      const unsigned blocks = unsigned((N * C / kChunk + 31) / 32);
      embed_kernels::embed_dpos_chunks_kernel<<<blocks, embed_kernels::kDposThreads, 0, stream()>>>(
          dpos, dx, int(B), int(N), int(C));
    } else {
      embed_dpos_kernel<<<grid_stride_blocks(N * C), kBlock, 0, stream()>>>(dpos, dx, B, N, C);
    }
    VIT_CUDA_LAUNCHED();
  }
  if (dcls && prefix > 0) {
    embed_dcls_kernel<<<grid_stride_blocks(C), kBlock, 0, stream()>>>(dcls, dx, B, N, prefix, C);
    VIT_CUDA_LAUNCHED();
  }
}

#define INSTANTIATE(T) template void im2patches<T>(T*, const T*, Index, Index, Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE
#define INSTANTIATE(T, X)                                                                         \
  template void embed_tokens_forward<T, X>(X*, const T*, const T*, const T*, Index, Index, Index, \
                                           Index);                                                \
  template void embed_tokens_backward<T, X>(T*, float*, float*, const X*, Index, Index, Index,    \
                                            Index);
VIT_CUDA_INSTANTIATE_STREAM(INSTANTIATE)

}  // namespace vit::cuda
