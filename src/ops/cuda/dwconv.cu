// Depthwise 3x3 convolution (stride 1, zero padding 1) on the channels-last token grid (the
// kernels: dwconv_kernels.cuh). Each thread walks (b, x, c) columns of the grid down their rows
// with 3x3 windows in registers: each value is loaded 3 times (by the columns x - 1, x and
// x + 1, C threads apart, so the second and third loads mostly hit the cache), not 9, and
// there is no index division per output. Neighbouring threads hold neighbouring channels, so
// every load is a coalesced row read. The forward runs one thread per column; the backward
// runs blocks of 32 channels x 8 lanes over chunks of columns and forms the input gradient and
// the weight gradient's partial sums in the same pass (two windows: the output gradient's and
// the input's), the partials summed in a fixed order afterwards. A tap outside the grid reads
// 0: fma(w, 0, acc) leaves acc's bits as skipping the tap would (acc starts at +0 and a sum
// never becomes -0), so the sums are those of the per-tap form. The prefix (class-token) rows
// bypass the conv: output 0, input gradient that of a zero sum.
// The locality FFN's middle (h-swish, this conv, h-swish) runs as the three separate ops.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/common.cuh"
#include "ops/cuda/dwconv_kernels.cuh"
#include "ops/cuda/plan_timing.cuh"
#include "ops/cuda/ops.h"

namespace vit::cuda {

namespace {

using namespace dwconv_kernels;

// The threads of a forward pass: one per (b, x, c) column, then one per prefix element (the
// backward's prefix rows are a pass of their own). The kernels' 32-bit element indices need
// B N C < 2^31.
struct ConvThreads {
  int columns, prefix_total;
  ConvThreads(Index B, Index N, Index prefix, Index gh, Index gw, Index C) {
    VIT_CHECK(N - prefix == gh * gw, "dwconv3x3: N - prefix must equal gh * gw");
    VIT_CHECK(B * N * C < (Index(1) << 31), "dwconv3x3: tensor too large for 32-bit indices");
    columns = int(B * gw * C);
    prefix_total = int(B * prefix * C);
  }
  Index total() const { return Index(columns) + prefix_total; }
};

// Two neighbouring channels a thread, moved as one 4-byte (bf16) or 8-byte (fp32) access,
// where C is even and every tensor 2-element aligned: half the load and store instructions. The
// same bits as one channel (each channel's sums in the same order;
// DwconvKernelsOnHost.PairedChannelsGiveTheSameBits). How many is the kernel plan's (the
// dwconv families): by rule the forward pairs and the backward does not (the paired backward's
// registers go 64 -> 96); --kernels dwconv_forward / dwconv_backward force one; autotune times
// the forward's two.
template <typename T, typename... Ptrs>
int channels_a_thread(int planned, Index C, const Ptrs*... tensors) {
  const bool aligned = ((reinterpret_cast<uintptr_t>(tensors) % (2 * sizeof(T)) == 0) && ...);
  return planned == 2 && C % 2 == 0 && aligned ? 2 : 1;
}

template <typename T>
void conv_forward(T* out, const T* inp, const T* weight, Index B, Index N, Index prefix, Index gh,
                  Index gw, Index C) {
  const ConvThreads th(B, N, prefix, gh, gw, C);
  if (th.total() <= 0) return;
  auto launch = [&](auto kernel, int vec) {
    const Index threads = th.columns / vec + Index(th.prefix_total);
    kernel<<<grid_stride_blocks(threads), kBlock, 0, stream()>>>(
        out, inp, weight, th.columns / vec, th.prefix_total, int(N), int(prefix), int(gh), int(gw),
        int(C));
    VIT_CUDA_LAUNCHED();
  };
  // out (B, N, C) is overwritten: the autotuner may time the candidates here
  auto run = [&](const KernelChoice& choice) {
    if (channels_a_thread<T>(choice.param, C, out, inp) == 2)
      launch(dwconv3x3_forward_kernel<T, 2>, 2);
    else
      launch(dwconv3x3_forward_kernel<T, 1>, 1);
  };
  run(tuned_choice(dwconv_key(true, B, N, C, storage_of<T>()), run));
}

template <typename T>
void conv_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, Index B,
                   Index N, Index prefix, Index gh, Index gw, Index C) {
  const ConvThreads th(B, N, prefix, gh, gw, C);
  if (th.total() <= 0) return;
  if (dinp && th.prefix_total > 0) {
    dwconv3x3_backward_prefix_kernel<T>
        <<<grid_stride_blocks(th.prefix_total), kBlock, 0, stream()>>>(dinp, th.prefix_total,
                                                                       int(N), int(prefix), int(C));
    VIT_CUDA_LAUNCHED();
  }
  if (th.columns == 0 || (!dinp && !dweight)) return;
  // Column chunks: about 8 blocks per SM in all, each lane at least one (b, x) column. Fixed
  // for a shape, so the weight gradient's sums are deterministic.
  const Index units = B * gw, col_blocks = (C + 31) / 32;
  Index chunks = (8 * Index(num_sms()) + col_blocks - 1) / col_blocks;
  chunks = std::min(chunks, (units + kRows - 1) / kRows);
  chunks = std::max<Index>(1, std::min<Index>(chunks, 65535));
  const Index cols_per_chunk = (units + chunks - 1) / chunks;
  float* partial =
      dweight ? static_cast<float*>(scratch(size_t(chunks * 9 * C) * sizeof(float), kScratchDwconv))
              : nullptr;
  // The chunks above are those of one channel a thread at any width, so the weight gradient's
  // sums are too.
  auto launch = [&](auto kernel, int vec) {
    const Index lane_blocks = (C / vec + 31) / 32;
    kernel<<<dim3(unsigned(lane_blocks), unsigned(chunks)), dim3(32, kRows), 0, stream()>>>(
        dinp, partial, dout, inp, weight, int(B), int(N), int(prefix), int(gh), int(gw), int(C),
        int(cols_per_chunk));
    VIT_CUDA_LAUNCHED();
  };
  const int planned = planned_choice(dwconv_key(false, B, N, C, storage_of<T>())).param;
  if (channels_a_thread<T>(planned, C, dinp, dout, inp) == 2)
    launch(dwconv3x3_backward_kernel<T, 2>, 2);
  else
    launch(dwconv3x3_backward_kernel<T, 1>, 1);
  if (!dweight) return;
  dwconv3x3_weight_finish_kernel<<<blocks_for(9 * C), kBlock, 0, stream()>>>(dweight, partial,
                                                                             chunks, C);
  VIT_CUDA_LAUNCHED();
}

}  // namespace

template <typename T>
void dwconv3x3_forward(T* out, const T* inp, const T* weight, Index B, Index N, Index prefix,
                       Index gh, Index gw, Index C) {
  conv_forward<T>(out, inp, weight, B, N, prefix, gh, gw, C);
}

template <typename T>
void dwconv3x3_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                        Index B, Index N, Index prefix, Index gh, Index gw, Index C) {
  conv_backward<T>(dinp, dweight, dout, inp, weight, B, N, prefix, gh, gw, C);
}

namespace {

// `count` (n) buffers in one scratch slot, each starting 256-byte aligned (the maps' packs),
// for the separate ops' act1 (forward) or act1 and d(act1) (backward).
template <typename T>
T* separate_ops_scratch(Index n, int count) {
  const size_t stride = (size_t(n) * sizeof(T) + 255) / 256 * 256;
  return static_cast<T*>(scratch(stride * size_t(count), kScratchLocalFfn));
}
template <typename T>
T* second_buffer(T* first, Index n) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(first) +
                              (size_t(n) * sizeof(T) + 255) / 256 * 256);
}

}  // namespace

template <typename T>
void local_ffn_forward(T* act1, T* dw, T* act2, const T* fc1, const T* weight, Index B, Index N,
                       Index prefix, Index gh, Index gw, Index M) {
  const Index n = B * N * M;
  T* a1 = act1 ? act1 : separate_ops_scratch<T>(n, 1);
  hswish_forward(a1, fc1, n);
  dwconv3x3_forward(dw, static_cast<const T*>(a1), weight, B, N, prefix, gh, gw, M);
  hswish_forward(act2, static_cast<const T*>(dw), n);
}

template <typename T>
void local_ffn_backward(T* dfc1, float* dweight, T* dact2, const T* dw, const T* /*act1*/,
                        const T* fc1, const T* weight, Index B, Index N, Index prefix, Index gh,
                        Index gw, Index M) {
  // act1 is recomputed from fc1 where the weight gradient reads it. dact2 stays as it was (the
  // host backends' version overwrites it).
  // dfc1 holds ddw until the last op; act1 and d(act1) go through scratch, so dact2 stays as it
  // was.
  const Index n = B * N * M;
  T* a1 = separate_ops_scratch<T>(n, 2);
  T* dact1 = second_buffer(a1, n);
  hswish_forward(a1, fc1, n);
  hswish_backward(dfc1, static_cast<const T*>(dact2), dw, n);
  dwconv3x3_backward(dact1, dweight, static_cast<const T*>(dfc1), static_cast<const T*>(a1), weight,
                     B, N, prefix, gh, gw, M);
  hswish_backward(dfc1, static_cast<const T*>(dact1), fc1, n);
}

#define INSTANTIATE(T)                                                                           \
  template void dwconv3x3_forward<T>(T*, const T*, const T*, Index, Index, Index, Index, Index,  \
                                     Index);                                                     \
  template void dwconv3x3_backward<T>(T*, float*, const T*, const T*, const T*, Index, Index,    \
                                      Index, Index, Index, Index);                               \
  template void local_ffn_forward<T>(T*, T*, T*, const T*, const T*, Index, Index, Index, Index, \
                                     Index, Index);                                              \
  template void local_ffn_backward<T>(T*, float*, T*, const T*, const T*, const T*, const T*,    \
                                      Index, Index, Index, Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
