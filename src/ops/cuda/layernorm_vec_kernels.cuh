// LayerNorm over 16-byte loads (the default for bf16 rows whose width they take; layernorm.cu
// launches them, VIT_LAYERNORM_VEC=0 turns them off): the forward, with the residual add it may
// take first, and the backward's row pass. The row-in-registers kernels (layernorm.cu) move one
// bf16 a lane a load, and the fifth runs' profile had them at 3.3 ms of a ViT-S/16 b256 step at
// 40-54% of the H200's bandwidth, latency-bound at 25-33% occupancy. On their first device run
// (2026-11-28, ncu, H200, ViT-S/16 b256) these took the backward from 77 to 52 us and the forward
// from 55 to 40 us.
// Here a lane owns whole chunks of 8 columns (one 16-byte word of bf16, two of fp32), `group`
// lanes share a row (8, 16 or 32, so that C = 8 x group x kChunks exactly: ViT-Ti's 192 is 8
// lanes x 3 chunks, ViT-S's 384 16 x 3, ViT-B's 768 32 x 3) and a warp holds 32 / group rows, so
// a row's loads are 16-byte words and every lane has work. The row stays in registers packed
// as loaded (bf16 pairs), unpacked where used. The statistics are the default kernels' (the row
// shifted by its first value, the shifted mean, then the centred squares) summed in another
// order (each lane its chunks, then the group's lanes), so the bits differ from the default's
// in the last place of the fp32 sums.
//
// Plain CUDA C++ beyond __shfl_xor_sync / __shfl_sync, shared memory and __syncthreads, so that
// tests/cuda_host_sim.h compiles it for the CPU (tests/test_layernorm_on_host.cpp): CI checks the
// indexing of groups, chunks and partial sums, where no GPU is.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#ifndef VIT_CUDA_HOST_SIM
#include "ops/cuda/common.cuh"
#endif
#include "ops/cuda/chunk.cuh"
#include "ops/layernorm_layout.h"
#include "ops/cuda/residual_sum.cuh"

namespace vit::cuda::layernorm_vec {

constexpr int kVec = kChunk;                      // columns a chunk (chunk.cuh)
constexpr int kThreads = 256;                     // threads a block, both kernels
constexpr int kMaxChunks = kLayernormMaxChunks;  // chunks a lane: up to 1024 columns a row
static_assert(kVec == kLayernormChunk, "the plan's rule and the kernels deal rows alike");

// How C columns are dealt (ops/layernorm_layout.h, which the kernel plan's rule reads too).
using Layout = LayernormLayout;
inline Layout layout_for(Index C) {
  return layernorm_layout_for(C);
}
// f(integral_constant<int, G>, integral_constant<int, K>) for a layout's group G and chunks K
// (the kernels' template arguments) if it is one of the 8 pairs layout_for gives (the 4 others
// deal C = 128, 256, 512 too, but with more chunks a lane: they are never chosen, so never
// compiled); false, calling nothing, for any other.
template <int kGroup, int kChunks, typename F>
bool call_with(Layout l, F& f) {
  if (l.group != kGroup || l.chunks != kChunks) return false;
  f(std::integral_constant<int, kGroup>(), std::integral_constant<int, kChunks>());
  return true;
}
template <typename F>
bool with_layout(Layout l, F&& f) {
  return call_with<8, 1>(l, f) || call_with<16, 1>(l, f) || call_with<32, 1>(l, f) ||
         call_with<32, 2>(l, f) || call_with<8, 3>(l, f) || call_with<16, 3>(l, f) ||
         call_with<32, 3>(l, f) || call_with<32, 4>(l, f);
}

// Sum over the lanes of an aligned group of kGroup lanes; each of them gets it.
template <int kGroup>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = kGroup / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The lane's place: row `row` of the (R, C) tensor (live when < R), chunks g, g + kGroup, ...
// (kGroup a template argument: a chunk's offset from the lane's first is then a constant the
// loads and stores carry, not a register).
template <int kGroup>
struct RowLane {
  int g;       // this lane's place in its group
  int leader;  // the group's first lane in the warp
  Index row;
  bool live;
  // The first column of this lane's chunk j.
  __device__ int col(int j) const { return kVec * (g + kGroup * j); }
};
// Lane `lane` of a warp whose first row is warp_row.
template <int kGroup>
__device__ __forceinline__ RowLane<kGroup> row_lane(int lane, Index warp_row, Index R) {
  const Index row = warp_row + lane / kGroup;
  return {lane % kGroup, lane / kGroup * kGroup, row, row < R};
}

// The shifted mean: x0 = x[0] of the row (the leader's first value), md = mean(x - x0), summed
// each lane over its chunks in order, then over the group.
struct Shifted {
  float x0, md;
};
template <int kGroup, int kChunks, typename X>
__device__ __forceinline__ Shifted shifted_mean(const Chunk<X> (&x)[kChunks],
                                                const RowLane<kGroup>& rl, Index C) {
  const float x0 = __shfl_sync(0xffffffffu, to_f32(x[0].v[0]), rl.leader);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j)
#pragma unroll
    for (int e = 0; e < kVec; ++e) s += to_f32(x[j].v[e]) - x0;
  return {x0, group_sum<kGroup>(s) / float(C)};
}

// The residual add a LayerNorm can take first (residual_layernorm_forward): row r of the stream
// becomes x + sample_scale[r / S] gamma branch, stored in X, and the norm reads the stored value,
// as residual_forward followed by layernorm_forward would (the same residual_sum, so the bits).
template <typename T, typename X>
struct ResidualAdd {
  X* stream = nullptr;                  // (R, C) the sum; may alias the norm's input x
  const T* branch = nullptr;            // (R, C); nullptr: no add (the 16-byte forward)
  const T* gamma = nullptr;             // (C) or nullptr
  const float* sample_scale = nullptr;  // (R / S) or nullptr
  Index S = 1;                          // rows per sample
};

// The stream's row after the add, written to add.stream and returned in x. Every load first:
// the stream may alias x, so loads after a store could not be issued before it.
template <typename T, typename X, int kGroup, int kChunks>
__device__ __forceinline__ void add_residual(Chunk<X> (&x)[kChunks], const RowLane<kGroup>& rl,
                                             Index C, const ResidualAdd<T, X>& add) {
  const float k = add.sample_scale ? add.sample_scale[rl.row / add.S] : 1.0f;
  const T* branch = add.branch + rl.row * C;
  X* stream = add.stream + rl.row * C;
  Chunk<T> br[kChunks], gm[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    br[j] = load_chunk(branch + rl.col(j));
    if (add.gamma) gm[j] = load_chunk(add.gamma + rl.col(j));
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float kg = k * (add.gamma ? to_f32(gm[j].v[e]) : 1.0f);
      x[j].v[e] = from_f32<X>(residual_sum(to_f32(x[j].v[e]), kg, to_f32(br[j].v[e])));
    }
    store_chunk(stream + rl.col(j), x[j]);
  }
}

template <typename T, typename X, int kGroup, int kChunks>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_vec_kernel(T* out, float* mean, float* rstd, const X* inp, const T* weight,
                                 const T* bias, Index R, Index C, float eps,
                                 ResidualAdd<T, X> add) {
  // inp (R, C) in X, out (R, C); weight, bias (C); mean, rstd (R); add: see ResidualAdd.
  // A block: kThreads / kGroup rows, kGroup lanes each.
  const Index warp_row =
      blockIdx.x * Index(kThreads / kGroup) + Index(threadIdx.x / 32) * (32 / kGroup);
  if (warp_row >= R) return;  // whole warps leave together; a later group's row may be past R
  const RowLane<kGroup> rl = row_lane<kGroup>(threadIdx.x % 32, warp_row, R);
  const X* xr = inp + rl.row * C;
  Chunk<X> x[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) x[j] = rl.live ? load_chunk(xr + rl.col(j)) : zero_chunk<X>();
  if (add.branch && rl.live) add_residual(x, rl, C, add);
  const Shifted sh = shifted_mean(x, rl, C);
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j)
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float d = to_f32(x[j].v[e]) - sh.x0 - sh.md;
      sq += d * d;
    }
  sq = group_sum<kGroup>(sq);
  const float rs = 1.0f / sqrtf(sq / float(C) + eps);
  if (!rl.live) return;  // past the group sums: nothing more is exchanged
  T* yr = out + rl.row * C;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const Chunk<T> w = load_chunk(weight + rl.col(j)), b = load_chunk(bias + rl.col(j));
    Chunk<T> y;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float xh = (to_f32(x[j].v[e]) - sh.x0 - sh.md) * rs;
      y.v[e] = from_f32<T>(xh * to_f32(w.v[e]) + to_f32(b.v[e]));
    }
    store_chunk(yr + rl.col(j), y);
  }
  if (rl.g == 0) {
    mean[rl.row] = sh.x0 + sh.md;
    rstd[rl.row] = rs;
  }
}

// Blocks an SM the backward keeps (a launch bound), from an estimate of its registers: a chunk's
// x, dy and the gradient it adds to (packed: 4 registers of bf16, 8 of fp32), its weight, and 8
// for its normed values; 40 more for the rest (calibrated on ptxas: bf16 at 4 chunks spilled at
// a bound of 128). 256 registers a thread is one block of kThreads; at most 3 blocks (85).
constexpr int backward_min_blocks(int chunks, int t_bytes, int x_bytes) {
  const int regs = chunks * (4 * t_bytes + 4 * x_bytes + 8) + 40;
  const int blocks = 256 / regs;
  return blocks < 1 ? 1 : blocks > 3 ? 3 : blocks;
}
// Dynamic shared memory of the backward: each group's weight and bias gradient sums
// (kThreads / group, 2, C), 16 KiB a chunk.
inline size_t backward_smem_bytes(Index C, int group) {  // group: lanes a row
  return size_t(kThreads / group) * 2 * size_t(C) * sizeof(float);
}

// sums[c .. c + 7] += v, as two 16-byte words each way.
__device__ __forceinline__ void add_to_sums(float* sums, const float (&v)[kVec]) {
  Chunk<float> s = load_chunk(sums);
#pragma unroll
  for (int e = 0; e < kVec; ++e) s.v[e] += v[e];
  store_chunk(sums, s);
}

// Backward over the rows, a grid that strides: each group a row at a time, x, dy and the
// gradient it adds to (dinp, X) all loaded before any arithmetic; dx = dinp + rs (dy w -
// mean(dy w) - xhat mean(dy w xhat)) rounded once to X. Each group sums its rows' weight and
// bias gradients in its own slot of shared memory (registers would spill at 3 chunks a lane),
// and the block adds the slots in group order to its row of partial, which
// layernorm_param_grad_kernel (layernorm.cu) adds up.
template <typename T, typename X, int kGroup, int kChunks>
__global__ void __launch_bounds__(kThreads, backward_min_blocks(kChunks, sizeof(T), sizeof(X)))
    layernorm_backward_vec_kernel(X* dinp, float* partial, const T* dout, const X* inp,
                                  const T* weight, const float* rstd, Index R, Index C) {
  // dinp, inp (R, C) in X; dout (R, C); weight (C); rstd (R); partial (gridDim.x, 2, C)
  // (kGroups, 2, C) the groups' column sums: dweight, then dbias
  constexpr int kGroups = kThreads / kGroup;
  VIT_DYNAMIC_SHARED(smem);
  float* group_sums = reinterpret_cast<float*>(smem);
  for (Index i = threadIdx.x; i < Index(kGroups) * 2 * C; i += kThreads) group_sums[i] = 0.0f;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  float* dw_sums = group_sums + Index(threadIdx.x / kGroup) * 2 * C;  // (C)
  float* db_sums = dw_sums + C;                                       // (C)
  const Index first = blockIdx.x * Index(kGroups) + Index(threadIdx.x / 32) * (32 / kGroup);
  Chunk<T> w[kChunks];
  {
    const RowLane<kGroup> rl = row_lane<kGroup>(lane, first, R);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) w[j] = load_chunk(weight + rl.col(j));
  }
  for (Index warp_row = first; warp_row < R; warp_row += Index(gridDim.x) * kGroups) {
    const RowLane<kGroup> rl = row_lane<kGroup>(lane, warp_row, R);
    const X* xr = inp + rl.row * C;
    const T* dyr = dout + rl.row * C;
    X* dxr = dinp ? dinp + rl.row * C : nullptr;
    Chunk<X> x[kChunks], old[kChunks];
    Chunk<T> dy[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      x[j] = rl.live ? load_chunk(xr + rl.col(j)) : zero_chunk<X>();
      dy[j] = rl.live ? load_chunk(dyr + rl.col(j)) : zero_chunk<T>();
      old[j] = rl.live && dxr ? load_chunk(dxr + rl.col(j)) : zero_chunk<X>();
    }
    // The shifted mean again, as the forward sums it (the saved fp32 mean is rounded).
    const Shifted sh = shifted_mean(x, rl, C);
    const float rs = rl.live ? rstd[rl.row] : 0.0f;
    float sum_dn = 0.0f, sum_dn_xh = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float xh = (to_f32(x[j].v[e]) - sh.x0 - sh.md) * rs;
        const float dn = to_f32(dy[j].v[e]) * to_f32(w[j].v[e]);
        sum_dn += dn;
        sum_dn_xh += dn * xh;
      }
    const float m_dn = group_sum<kGroup>(sum_dn) / float(C);
    const float m_dn_xh = group_sum<kGroup>(sum_dn_xh) / float(C);
    if (!rl.live) continue;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float dw[kVec], db[kVec];
      Chunk<X> dx;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float g = to_f32(dy[j].v[e]);
        const float xh = (to_f32(x[j].v[e]) - sh.x0 - sh.md) * rs;
        dw[e] = g * xh;
        db[e] = g;
        dx.v[e] =
            from_f32<X>(to_f32(old[j].v[e]) + rs * (g * to_f32(w[j].v[e]) - m_dn - xh * m_dn_xh));
      }
      add_to_sums(dw_sums + rl.col(j), dw);
      add_to_sums(db_sums + rl.col(j), db);
      if (dxr) store_chunk(dxr + rl.col(j), dx);
    }
  }
  __syncthreads();
  // Sum the groups' slots in group order (deterministic) into this block's row of partial.
  float* out = partial + Index(blockIdx.x) * 2 * C;
  for (Index i = threadIdx.x; i < 2 * C; i += kThreads) {
    float t = 0.0f;
    for (int v = 0; v < kGroups; ++v) t += group_sums[Index(v) * 2 * C + i];
    out[i] = t;
  }
}

}  // namespace vit::cuda::layernorm_vec
