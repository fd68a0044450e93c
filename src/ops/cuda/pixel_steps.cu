// The uint8 ops of planned batches (core/pixel_step.h: RandAugment's ops, colour jitter): the
// GPU twin of src/ops/cpu/pixel_steps.cpp. The per-pixel arithmetic is core/pixel_step.h's, and
// this file is compiled with --fmad=false (CMakeLists.txt), as the CPU file is without
// contraction, so both give the same bytes. Image statistics (channel min/max, histograms, the
// luma mean) are integer reductions, exact in any order.
#include "core/pixel_step.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/device.h"

namespace vit::cuda {

namespace {

constexpr int kStepThreads = 512;

// Per-channel minima / maxima of the in-image, for AutoContrast.
__device__ void channel_range(const uint8_t* in, int C, int P, int* lo, int* hi) {
  for (int c = threadIdx.x; c < C; c += blockDim.x) lo[c] = 255, hi[c] = 0;
  __syncthreads();
  for (int c = 0; c < C; ++c) {
    int mn = 255, mx = 0;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
      const int v = in[c * P + i];
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    atomicMin(&lo[c], mn);
    atomicMax(&hi[c], mx);
  }
  __syncthreads();
}

// Equalize's table of channel plane (P): histogram in shared memory, table by one thread.
// Returns whether the channel changes (equalize_table).
__device__ bool equalize_lut(const uint8_t* plane, int P, int* hist, int64_t* hist64, uint8_t* lut,
                             int* apply) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += blockDim.x) atomicAdd(&hist[plane[i]], 1);
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) hist64[i] = hist[i];
  __syncthreads();
  if (threadIdx.x == 0) *apply = equalize_table(hist64, lut) ? 1 : 0;
  __syncthreads();
  return *apply != 0;
}

// The sum of the L image over the in-image (Contrast's mean), or of the one channel.
__device__ int64_t luma_sum(const uint8_t* in, int C, int P, unsigned long long* total) {
  if (threadIdx.x == 0) *total = 0;
  __syncthreads();
  unsigned long long s = 0;
  for (int i = threadIdx.x; i < P; i += blockDim.x)
    s += C == 3 ? pil_luma(in[i], in[P + i], in[2 * P + i]) : in[i];
  atomicAdd(total, s);
  __syncthreads();
  return int64_t(*total);
}

__global__ void pixel_step_kernel(const uint8_t* in_all, uint8_t* out_all, const PixelStep* steps,
                                  int32_t slots, int32_t k, Index C, Index S, PixelFill fill) {
  // grid (B): one block per image; in/out (B, C, S, S), step k of sample blockIdx.x
  __shared__ int lo[3], hi[3], hist[256], apply;
  __shared__ int64_t hist64[256];
  __shared__ uint8_t lut[256];
  __shared__ unsigned long long total;
  // Within an image 32-bit index math (the host checks C * S * S < 2^31).
  const int P = int(S * S), n = int(C) * P;
  const uint8_t* in = in_all + Index(blockIdx.x) * n;  // (C, S, S)
  uint8_t* out = out_all + Index(blockIdx.x) * n;      // (C, S, S)
  const int b = blockIdx.x, W = int(S);
  const PixelStep s = steps[b * slots + k];
  const RaOp op = RaOp(s.op);
  const float factor = float(s.arg);
  if (s.op == PixelStep::kNone) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
  } else if (s.geometric()) {
    for (int p = threadIdx.x; p < P; p += blockDim.x) {  // one source point for all channels
      const AffineTap t = affine_tap(s, S, S, p / W, p % W);
      for (int c = 0; c < C; ++c)
        out[c * P + p] =
            t.inside ? affine_sample(in + c * P, S, S, t, s.bicubic != 0) : fill.v[c < 2 ? c : 2];
    }
  } else if (op == RaOp::Sharpness || op == RaOp::SharpnessIncreasing) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int c = i / P, y = (i / W) % W, x = i % W;
      const bool border = y == 0 || x == 0 || y == W - 1 || x == W - 1;
      out[i] = border ? in[i] : pil_blend(smooth_value(in + c * P, S, y, x), in[i], factor);
    }
  } else if (op == RaOp::Brightness || op == RaOp::BrightnessIncreasing) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = pil_blend(0, in[i], factor);
  } else if (op == RaOp::Color || op == RaOp::ColorIncreasing) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (C != 3) {  // grey images have no saturation
        out[i] = in[i];
        continue;
      }
      const int p = i % P;
      out[i] = pil_blend(pil_luma(in[p], in[P + p], in[2 * P + p]), in[i], factor);
    }
  } else if (op == RaOp::Contrast || op == RaOp::ContrastIncreasing) {
    const uint8_t mean = contrast_mean(luma_sum(in, C, P, &total), P);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = pil_blend(mean, in[i], factor);
  } else if (op == RaOp::AutoContrast) {
    channel_range(in, C, P, lo, hi);
    for (int c = 0; c < C; ++c) {
      const bool same = hi[c] <= lo[c];
      for (int v = threadIdx.x; v < 256; v += blockDim.x)
        lut[v] = same ? uint8_t(v) : autocontrast_value(lo[c], hi[c], v);
      __syncthreads();
      for (int i = threadIdx.x; i < P; i += blockDim.x) out[c * P + i] = lut[in[c * P + i]];
      __syncthreads();
    }
  } else if (op == RaOp::Equalize) {
    for (int c = 0; c < C; ++c) {
      const bool change = equalize_lut(in + c * P, P, hist, hist64, lut, &apply);
      for (int i = threadIdx.x; i < P; i += blockDim.x)
        out[c * P + i] = change ? lut[in[c * P + i]] : in[c * P + i];
      __syncthreads();
    }
  } else {  // the table ops
    for (int v = threadIdx.x; v < 256; v += blockDim.x) lut[v] = pointwise_value(s.op, s.arg, v);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = lut[in[i]];
  }
}

}  // namespace

void apply_pixel_steps(uint8_t* images, const PixelStep* steps, int32_t slots, Index B, Index C,
                       Index S, const PixelFill& fill) {
  if (slots <= 0 || B <= 0) return;
  VIT_CHECK(C <= 3, "apply_pixel_steps: images of 1 to 3 channels");
  VIT_CHECK(C * S * S < (Index(1) << 31), "apply_pixel_steps: images of 2^31 or more values");
  const size_t bytes = size_t(B * C * S * S);
  // Geometric ops and the smoothing read neighbours, so each step writes the other buffer.
  auto* other = static_cast<uint8_t*>(scratch(bytes, kScratchPixelSteps));  // (B, C, S, S)
  uint8_t* buf[2] = {images, other};
  for (int32_t k = 0; k < slots; ++k) {
    pixel_step_kernel<<<unsigned(B), kStepThreads, 0, stream()>>>(buf[k % 2], buf[(k + 1) % 2],
                                                                  steps, slots, k, C, S, fill);
    VIT_CUDA_LAUNCHED();
  }
  if (slots % 2)
    VIT_CUDA_CHECK(cudaMemcpyAsync(images, other, bytes, cudaMemcpyDeviceToDevice, stream()));
}

}  // namespace vit::cuda
