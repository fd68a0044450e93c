// LayerNorm over channels, one warp per row, fp32 statistics. The row is shifted by its first
// value before the two-pass mean/variance, so rows with a large mean and a tiny spread
// (mean 1e3, std 1e-2) keep fp32 accuracy without the CPU's fp64 sums. The input and its
// accumulated gradient are the residual stream's X (ops.h): with X = float (T = bf16) neither is
// rounded, and out is rounded once to T. bf16 rows take the 16-byte kernels of
// layernorm_vec_kernels.cuh where C and the pointers allow (the same formulas, other sum
// orders; the kernel plan's layernorm rule).
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/layernorm_vec_kernels.cuh"
#include "ops/cuda/ops.h"
#include "ops/cuda/residual_sum.cuh"

namespace vit::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // forward: warps per block
constexpr int kBwdWarps = 8;      // backward: warps per block

// Mean of (x - x0) over the row, x0 = x[0]; every lane of the warp gets it.
template <typename T>
__device__ __forceinline__ float shifted_mean(const T* x, float x0, Index C, int lane) {
  float s = 0.0f;
  for (Index c = lane; c < C; c += 32) s += to_f32(x[c]) - x0;
  return warp_sum(s) / float(C);
}

template <typename T, typename X>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const X* inp,
                                         const T* weight, const T* bias, Index R, Index C,
                                         float eps) {
  // inp (R, C) in X, out (R, C); weight, bias (C); mean, rstd (R)
  const Index r = blockIdx.x * Index(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;  // whole warps leave together
  const X* x = inp + r * C;
  T* y = out + r * C;
  const float x0 = to_f32(x[0]);
  const float md = shifted_mean(x, x0, C, lane);
  float sq = 0.0f;
  for (Index c = lane; c < C; c += 32) {
    const float d = to_f32(x[c]) - x0 - md;
    sq += d * d;
  }
  sq = warp_sum(sq);
  const float rs = 1.0f / sqrtf(sq / float(C) + eps);
  for (Index c = lane; c < C; c += 32) {
    const float xh = (to_f32(x[c]) - x0 - md) * rs;
    y[c] = from_f32<T>(xh * to_f32(weight[c]) + to_f32(bias[c]));
  }
  if (lane == 0) {
    mean[r] = x0 + md;
    rstd[r] = rs;
  }
}

// The residual add a LayerNorm can take first (layernorm_vec_kernels.cuh).
template <typename T, typename X>
using ResidualAdd = layernorm_vec::ResidualAdd<T, X>;

// The same forward with the row in registers, as the backward holds it (lane l: columns l,
// l + 32, ..., at most kPerLane of them): x is read once and a row's loads are all in flight
// together. The sums run in layernorm_forward_kernel's order, so the bits are the same; that
// kernel stays for rows wider than 32 x 32. With kAdd the row is first the residual sum (add).
template <typename T, typename X, int kPerLane, bool kAdd>
__global__ void layernorm_forward_rows_kernel(T* out, float* mean, float* rstd, const X* inp,
                                              const T* weight, const T* bias, Index R, Index C,
                                              float eps, ResidualAdd<T, X> add) {
  // inp (R, C) in X, out (R, C); weight, bias (C); mean, rstd (R); add: see ResidualAdd
  const Index r = blockIdx.x * Index(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;  // whole warps leave together
  const X* x = inp + r * C;
  float xv[kPerLane];
  if constexpr (kAdd) {
    // Every load of the row first, then the sums and their stores: the stream may alias x, so
    // loads after a store could not be issued before it.
    const float k = add.sample_scale ? add.sample_scale[r / add.S] : 1.0f;
    const T* br = add.branch + r * C;
    float bv[kPerLane], kg[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const Index c = lane + 32 * j;
      const bool in = c < C;
      xv[j] = in ? to_f32(x[c]) : 0.0f;
      bv[j] = in ? to_f32(br[c]) : 0.0f;
      kg[j] = k * (in && add.gamma ? to_f32(add.gamma[c]) : 1.0f);
    }
    X* st = add.stream + r * C;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const Index c = lane + 32 * j;
      if (c >= C) continue;
      const X v = from_f32<X>(residual_sum(xv[j], kg[j], bv[j]));
      st[c] = v;
      xv[j] = to_f32(v);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const Index c = lane + 32 * j;
      xv[j] = c < C ? to_f32(x[c]) : 0.0f;
    }
  }
  const float x0 = __shfl_sync(0xffffffffu, xv[0], 0);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < C) s += xv[j] - x0;
  const float md = warp_sum(s) / float(C);
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    if (lane + 32 * j >= C) continue;
    const float d = xv[j] - x0 - md;
    sq += d * d;
  }
  sq = warp_sum(sq);
  const float rs = 1.0f / sqrtf(sq / float(C) + eps);
  T* y = out + r * C;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const Index c = lane + 32 * j;
    if (c >= C) continue;
    const float xh = (xv[j] - x0 - md) * rs;
    y[c] = from_f32<T>(xh * to_f32(weight[c]) + to_f32(bias[c]));
  }
  if (lane == 0) {
    mean[r] = x0 + md;
    rstd[r] = rs;
  }
}

// f(std::integral_constant<int, K>) for the smallest register row K in {4, 8, 12, 16, 24, 32}
// that holds C columns (32 x K per warp); false, without a call, when C > 1024.
template <typename F>
bool with_row_registers(Index C, F&& f) {
  const Index per_lane = (C + 31) / 32;
  if (per_lane <= 4)
    f(std::integral_constant<int, 4>());
  else if (per_lane <= 8)
    f(std::integral_constant<int, 8>());
  else if (per_lane <= 12)
    f(std::integral_constant<int, 12>());
  else if (per_lane <= 16)
    f(std::integral_constant<int, 16>());
  else if (per_lane <= 24)
    f(std::integral_constant<int, 24>());
  else if (per_lane <= 32)
    f(std::integral_constant<int, 32>());
  else
    return false;
  return true;
}

template <typename T, typename X, int kPerLane, bool kAdd = false>
void launch_layernorm_forward_rows(T* out, float* mean, float* rstd, const X* inp, const T* weight,
                                   const T* bias, Index R, Index C, float eps,
                                   ResidualAdd<T, X> add = {}) {
  layernorm_forward_rows_kernel<T, X, kPerLane, kAdd>
      <<<blocks_for(R, kRowsPerBlock), kRowsPerBlock * 32, 0, stream()>>>(
          out, mean, rstd, inp, weight, bias, R, C, eps, add);
  VIT_CUDA_LAUNCHED();
}

// Backward, one warp per row with the row in registers: lane l holds columns l, l + 32, ...
// (at most kPerLane of them), so x and dy are read once, all loads of a row are in flight
// together, and each lane sums its columns' weight/bias gradients in registers across its rows.
// (The first version re-read the row three times from a few warps per SM and spent 31% of a
// ViT-S/16 step here: latency-bound, 0.83 ms a call on an H100.) Rows of up to 768 channels also
// load the gradient they add to with x and dy, so a row waits for memory once, not twice (the
// H200 profile of 2026-11-26 still had this kernel at 0.17 ms a ViT-S/16 call, ~0.9 TB/s).
// Blocks per SM the kernel kept before the early dx load (registers then: 48, 80, 108, 128 for
// 4, 8, 12, 16 columns a lane), held as a launch bound so the extra registers do not cost
// occupancy. Wider rows (ViT-B's 768: 24 a lane) held x, dy, the weight and both gradient sums
// in 182 registers, one block of 8 warps per SM; they keep the weight and the sums in shared
// memory instead (each lane its own columns: the same additions in the same order) and run two
// blocks per SM.
constexpr int bwd_min_blocks(int per_lane) {
  return per_lane <= 4 ? 5 : per_lane <= 8 ? 3 : 2;
}
__host__ __device__ constexpr bool bwd_sums_in_smem(int per_lane) {
  return per_lane > 16;
}
// Dynamic shared memory of the backward kernel: the per-warp sums (kBwdWarps, 2, C), and the
// weight (C) where the sums live there.
template <int kPerLane>
size_t bwd_smem_bytes(Index C) {
  return (size_t(kBwdWarps) * 2 + (bwd_sums_in_smem(kPerLane) ? 1 : 0)) * size_t(C) * sizeof(float);
}

template <typename T, typename X, int kPerLane>
__global__ void __launch_bounds__(kBwdWarps * 32, bwd_min_blocks(kPerLane))
    layernorm_backward_kernel(X* dinp, float* partial, const T* dout, const X* inp, const T* weight,
                              const float* rstd, Index R, Index C) {
  // dinp, inp (R, C) in X; dout (R, C); weight (C); rstd (R); partial (gridDim.x, 2, C)
  // dweight/dbias sums
  // (kBwdWarps, 2, C) per-warp column partials, then (C) the weight when kSmemSums
  extern __shared__ float sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr bool kSmemSums = bwd_sums_in_smem(kPerLane);
  constexpr int kRegs = kSmemSums ? 1 : kPerLane;  // the register copies, where kept
  float* dw_w = sm + Index(warp) * 2 * C;          // (C) this warp's weight-gradient sums
  float* db_w = dw_w + C;                          // (C) this warp's bias-gradient sums
  float* w_s = sm + Index(kBwdWarps) * 2 * C;      // (C) the weight, when kSmemSums
  float w[kRegs], dw[kRegs], db[kRegs];
  if constexpr (kSmemSums) {
    for (Index c = threadIdx.x; c < C; c += blockDim.x) w_s[c] = to_f32(weight[c]);
    for (Index c = lane; c < C; c += 32) dw_w[c] = db_w[c] = 0.0f;
    __syncthreads();
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const Index c = lane + 32 * j;
      w[j] = c < C ? to_f32(weight[c]) : 0.0f;
      dw[j] = 0.0f;
      db[j] = 0.0f;
    }
  }
  // The weight of column j of this lane.
  auto weight_of = [&](int j) {
    if constexpr (kSmemSums)
      return w_s[lane + 32 * j];
    else
      return w[j];
  };
  // x, dy and the gradient added to, in flight together (not at 1024 channels: registers)
  constexpr bool kEarlyDx = kPerLane <= 24;
  for (Index r = blockIdx.x * Index(kBwdWarps) + warp; r < R; r += Index(gridDim.x) * kBwdWarps) {
    const X* x = inp + r * C;
    const T* dy = dout + r * C;
    float xv[kPerLane], g[kPerLane], old[kEarlyDx ? kPerLane : 1];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const Index c = lane + 32 * j;
      xv[j] = c < C ? to_f32(x[c]) : 0.0f;
      g[j] = c < C ? to_f32(dy[c]) : 0.0f;
      if constexpr (kEarlyDx) old[j] = dinp && c < C ? to_f32(dinp[r * C + c]) : 0.0f;
    }
    // The shifted mean again, summed in the forward's order (the saved fp32 mean is rounded;
    // see the file comment).
    const float x0 = __shfl_sync(0xffffffffu, xv[0], 0);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < C) s += xv[j] - x0;
    const float md = warp_sum(s) / float(C);
    const float rs = rstd[r];
    // dnorm = dy * w; dx = rs * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    float sum_dn = 0.0f, sum_dn_xh = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + 32 * j >= C) continue;
      const float xh = (xv[j] - x0 - md) * rs;
      xv[j] = xh;
      const float dn = g[j] * weight_of(j);
      sum_dn += dn;
      sum_dn_xh += dn * xh;
      if constexpr (kSmemSums) {
        dw_w[lane + 32 * j] += g[j] * xh;
        db_w[lane + 32 * j] += g[j];
      } else {
        dw[j] += g[j] * xh;
        db[j] += g[j];
      }
    }
    const float m_dn = warp_sum(sum_dn) / float(C);
    const float m_dn_xh = warp_sum(sum_dn_xh) / float(C);
    if (dinp) {
      // old + delta in fp32, one rounding to X (none for an fp32 stream)
      X* dx = dinp + r * C;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const Index c = lane + 32 * j;
        if (c >= C) continue;
        float prev;
        if constexpr (kEarlyDx)
          prev = old[j];
        else
          prev = to_f32(dx[c]);
        dx[c] = from_f32<X>(prev + rs * (g[j] * weight_of(j) - m_dn - xv[j] * m_dn_xh));
      }
    }
  }
  if constexpr (!kSmemSums) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const Index c = lane + 32 * j;
      if (c < C) {
        dw_w[c] = dw[j];
        db_w[c] = db[j];
      }
    }
  }
  __syncthreads();
  // Sum the warps' partials in warp order (deterministic) into this block's slot.
  float* out = partial + Index(blockIdx.x) * 2 * C;
  for (Index i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    float t = 0.0f;
    for (int v = 0; v < kBwdWarps; ++v) t += sm[Index(v) * 2 * C + i];
    out[i] = t;
  }
}

__global__ void layernorm_param_grad_kernel(float* dweight, float* dbias, const float* partial,
                                            Index blocks, Index C) {
  // partial (blocks, 2, C) -> dweight, dbias (C) accumulate. A block: 32 columns x 32 slices of
  // the partial rows; each thread sums its slice in a fixed order (four interleaved sums, so
  // four loads are in flight, not one), then one thread per column sums the slices in order
  // (deterministic for a given block count).
  __shared__ float sw[32][33], sb[32][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const Index c = blockIdx.x * Index(32) + tx;
  float a = 0.0f, b = 0.0f;
  if (c < C) {
    float a4[4] = {0.0f, 0.0f, 0.0f, 0.0f}, b4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    Index k = ty;
    for (; k + 96 < blocks; k += 128) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        a4[u] += partial[(k + 32 * u) * 2 * C + c];
        b4[u] += partial[(k + 32 * u) * 2 * C + C + c];
      }
    }
    for (; k < blocks; k += 32) {
      a4[0] += partial[k * 2 * C + c];
      b4[0] += partial[k * 2 * C + C + c];
    }
    a = (a4[0] + a4[1]) + (a4[2] + a4[3]);
    b = (b4[0] + b4[1]) + (b4[2] + b4[3]);
  }
  sw[ty][tx] = a;
  sb[ty][tx] = b;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  float sa = 0.0f, sbias = 0.0f;
  for (int t = 0; t < 32; ++t) {
    sa += sw[t][tx];
    sbias += sb[t][tx];
  }
  if (dweight) dweight[c] += sa;
  if (dbias) dbias[c] += sbias;
}

// Blocks of a backward kernel (kKernel, kThreads a block) for its shared memory: as many as the
// device holds at once (the kernels stride over the rows; more blocks would only add partial rows
// to sum), found once per shared-memory size. Also raises the kernel's shared-memory limit where
// C needs it.
template <auto kKernel, int kThreads>
Index resident_blocks(size_t smem) {
  static size_t known_smem = 0;
  static int per_sm = 0;
  if (smem != known_smem) {
    if (smem > 48 * 1024)
      VIT_CUDA_CHECK(
          cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    VIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, smem));
    known_smem = smem;
  }
  return Index(std::max(per_sm, 1)) * num_sms();
}

// The smallest register row that holds C columns: 32 x kPerLane. Returns the blocks launched
// (the rows of `partial`, sized for the most blocks, max_blocks).
template <typename T, typename X, int kPerLane>
Index launch_layernorm_backward(X* dinp, float* partial, const T* dout, const X* inp,
                                const T* weight, const float* rstd, Index R, Index C,
                                Index max_blocks) {
  const size_t smem = bwd_smem_bytes<kPerLane>(C);
  const Index blocks = std::min(
      max_blocks, resident_blocks<layernorm_backward_kernel<T, X, kPerLane>, kBwdWarps * 32>(smem));
  layernorm_backward_kernel<T, X, kPerLane><<<unsigned(blocks), kBwdWarps * 32, smem, stream()>>>(
      dinp, partial, dout, inp, weight, rstd, R, C);
  VIT_CUDA_LAUNCHED();
  return blocks;
}

// The 16-byte kernels (layernorm_vec_kernels.cuh), where C deals into whole chunks and every
// pointer given is 16-byte aligned (null ones are); else group 0 and the row-in-registers
// kernels. They sum a row in another order than those, so which runs is the kernel plan's
// layernorm rule (ops/layernorm_layout.h, the same function of C), never a tuned pick.
layernorm_vec::Layout vec_layout(Index C, std::initializer_list<const void*> pointers) {
  if (!all_aligned16(pointers)) return {};
  return layernorm_vec::layout_for(C);
}
// They are compiled for bf16 activations only (the fp32 mode is the device's check against the
// CPU, not its speed; 8 layouts x 2 stream types x 2 kernels add ~1.7 MB to each binary that
// links LayerNorm, against a 64 MiB bundle).
template <typename T>
constexpr bool kVecKernels = std::is_same_v<T, bf16>;

// The 16-byte forward (the residual add first where add.branch is set); false, launching
// nothing, where it does not apply.
template <typename T, typename X>
bool launch_layernorm_forward_vec(T* out, float* mean, float* rstd, const X* inp, const T* weight,
                                  const T* bias, Index R, Index C, float eps,
                                  ResidualAdd<T, X> add = {}) {
  if constexpr (!kVecKernels<T>) {
    return false;
  } else {
    const layernorm_vec::Layout l =
        vec_layout(C, {out, inp, weight, bias, add.stream, add.branch, add.gamma});
    const bool launched = layernorm_vec::with_layout(l, [&](auto g, auto k) {
      constexpr int kGroup = decltype(g)::value;
      layernorm_vec::layernorm_forward_vec_kernel<T, X, kGroup, decltype(k)::value>
          <<<blocks_for(R, layernorm_vec::kThreads / kGroup), layernorm_vec::kThreads, 0,
             stream()>>>(out, mean, rstd, inp, weight, bias, R, C, eps, add);
      VIT_CUDA_LAUNCHED();
    });
    return launched;
  }
}

// The 16-byte backward's row pass into partial (at most max_blocks rows of it); returns the
// blocks launched, 0 (launching nothing) where it does not apply.
template <typename T, typename X>
Index launch_layernorm_backward_vec(X* dinp, float* partial, const T* dout, const X* inp,
                                    const T* weight, const float* rstd, Index R, Index C,
                                    Index max_blocks) {
  Index blocks = 0;
  if constexpr (kVecKernels<T>) {
    const layernorm_vec::Layout l = vec_layout(C, {dinp, dout, inp, weight});
    layernorm_vec::with_layout(l, [&](auto g, auto k) {
      constexpr auto kernel = layernorm_vec::layernorm_backward_vec_kernel<T, X, decltype(g)::value,
                                                                           decltype(k)::value>;
      const size_t smem = layernorm_vec::backward_smem_bytes(C, decltype(g)::value);
      blocks = std::min(max_blocks, resident_blocks<kernel, layernorm_vec::kThreads>(smem));
      kernel<<<unsigned(blocks), layernorm_vec::kThreads, smem, stream()>>>(
          dinp, partial, dout, inp, weight, rstd, R, C);
      VIT_CUDA_LAUNCHED();
    });
  }
  return blocks;
}

}  // namespace

template <typename T, typename X>
void layernorm_forward_loop(T* out, float* mean, float* rstd, const X* inp, const T* weight,
                            const T* bias, Index R, Index C, float eps) {
  if (R <= 0) return;
  layernorm_forward_kernel<<<blocks_for(R, kRowsPerBlock), kRowsPerBlock * 32, 0, stream()>>>(
      out, mean, rstd, inp, weight, bias, R, C, eps);
  VIT_CUDA_LAUNCHED();
}

template <typename T, typename X>
void layernorm_forward(T* out, float* mean, float* rstd, const X* inp, const T* weight,
                       const T* bias, Index R, Index C, float eps) {
  if (R <= 0) return;
  if (launch_layernorm_forward_vec<T, X>(out, mean, rstd, inp, weight, bias, R, C, eps)) return;
  const bool in_registers = with_row_registers(C, [&](auto k) {
    launch_layernorm_forward_rows<T, X, decltype(k)::value>(out, mean, rstd, inp, weight, bias, R,
                                                            C, eps);
  });
  if (!in_registers) layernorm_forward_loop(out, mean, rstd, inp, weight, bias, R, C, eps);
}

template <typename T, typename X>
void residual_layernorm_forward(X* stream, T* out, float* mean, float* rstd, const X* x,
                                const T* branch, const T* gamma, const float* sample_scale,
                                const T* weight, const T* bias, Index B, Index S, Index C,
                                float eps) {
  const Index R = B * S;
  if (R <= 0) return;
  const ResidualAdd<T, X> add{stream, branch, gamma, sample_scale, S};
  if (launch_layernorm_forward_vec<T, X>(out, mean, rstd, x, weight, bias, R, C, eps, add))
    return;
  const bool in_registers = with_row_registers(C, [&](auto k) {
                              launch_layernorm_forward_rows<T, X, decltype(k)::value, true>(
                                  out, mean, rstd, x, weight, bias, R, C, eps, add);
                            });
  if (in_registers) return;
  residual_forward(stream, x, branch, gamma, sample_scale, B, S, C);  // rows over 1024: two passes
  layernorm_forward(out, mean, rstd, static_cast<const X*>(stream), weight, bias, R, C, eps);
}

template <typename T, typename X>
void layernorm_backward(X* dinp, float* dweight, float* dbias, const T* dout, const X* inp,
                        const T* weight, const float* mean, const float* rstd, Index R, Index C) {
  if (R <= 0) return;
  VIT_CHECK(C <= 1024, "layernorm_backward: more than 1024 channels");
  // At most 8 blocks per SM (the scratch's size, fixed for CUDA graphs), fewer by occupancy.
  const Index max_blocks = std::min<Index>((R + kBwdWarps - 1) / kBwdWarps, Index(num_sms()) * 8);
  auto* partial = static_cast<float*>(
      scratch(size_t(max_blocks) * 2 * size_t(C) * sizeof(float), kScratchLayernorm));
  Index blocks =
      launch_layernorm_backward_vec(dinp, partial, dout, inp, weight, rstd, R, C, max_blocks);
  if (blocks == 0)
    with_row_registers(C, [&](auto k) {  // C <= 1024: always a register row
      blocks = launch_layernorm_backward<T, X, decltype(k)::value>(dinp, partial, dout, inp, weight,
                                                                   rstd, R, C, max_blocks);
    });
  if (dweight || dbias) {
    layernorm_param_grad_kernel<<<unsigned((C + 31) / 32), 1024, 0, stream()>>>(dweight, dbias,
                                                                                partial, blocks, C);
    VIT_CUDA_LAUNCHED();
  }
}

bool layernorm_vectorized(Index C) {
  return vec_layout(C, {}).group != 0;  // with_layout takes every layout layout_for gives
}

#define INSTANTIATE(T, X)                                                                        \
  template void layernorm_forward<T, X>(T*, float*, float*, const X*, const T*, const T*, Index, \
                                        Index, float);                                           \
  template void layernorm_forward_loop<T, X>(T*, float*, float*, const X*, const T*, const T*,   \
                                             Index, Index, float);                               \
  template void residual_layernorm_forward<T, X>(X*, T*, float*, float*, const X*, const T*,     \
                                                 const T*, const float*, const T*, const T*,     \
                                                 Index, Index, Index, float);                    \
  template void layernorm_backward<T, X>(X*, float*, float*, const T*, const X*, const T*,       \
                                         const float*, const float*, Index, Index);
VIT_CUDA_INSTANTIATE_STREAM(INSTANTIATE)

}  // namespace vit::cuda
