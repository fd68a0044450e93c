// Fused multi-head attention, flash-style (FlashAttention-2 scheme): the (B, H, N, N) scores and
// probabilities never reach global memory. A block owns one (b, h) and 64 rows (queries in the
// forward and dQ kernels, keys in the dK/dV kernel), 16 per warp; it streams the other side in
// 64-row tiles through shared memory. Each warp works on its own 16 rows only, so apart from the
// tile loads a warp never waits for the others.
//  * Forward: online softmax in fp32 (running max and sum per row, in log2 units), O kept
//    unnormalised in registers and rescaled per tile; saves lse (B, H, N) fp32.
//  * Backward: Drow = rowsum(dO * O) in a small kernel, then one kernel over key blocks (dK, dV,
//    looping over query tiles) and one over query blocks (dQ, looping over key tiles), each
//    recomputing P from lse. No atomics: fixed loop orders, bitwise reproducible.
// bf16 runs the mma.sync kernels (flash_attention_mma.cu, flash_mma_kernels.cuh); the kernels
// here are the fp32 ones (T = float, the debugging mode): the same scheme with the tile products
// as plain FMA loops on shared memory (struct Warp). Scores, softmax statistics, dP and the
// accumulators are fp32. Ragged tiles: rows past N load as zeros, keys past N get probability
// 0, rows past N are never written.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/cuda/flash_common.cuh"
#include "ops/cuda/flash_mma.cuh"

namespace vit::cuda {

namespace {

using namespace flash;  // kRows, load_tile, BlockPos, ...: flash_common.cuh

constexpr int kHalf = kCols / 2;  // score columns per lane in the softmax: a lane pair per row

// Shared-memory strides (elements). Padding keeps rows 16-byte multiples (uint4 stores) and
// shifts banks between rows.
template <typename T, int D>
struct Layout {
  static constexpr int kVec = 16 / int(sizeof(T));         // elements per 16-byte access
  static constexpr int ldt = kTileLd<T, D>;                // (kRows, D) tiles of q, k, v, dO
  static constexpr int ldp = kCols + kVec;                 // (kRows, kCols) P / dS tiles
  static constexpr int lds = (D > kCols ? D : kCols) + 4;  // (kRows, max(D, kCols)) fp32 scratch
  static constexpr size_t tile = size_t(kRows) * ldt * sizeof(T);
  static constexpr size_t ptile = size_t(kRows) * ldp * sizeof(T);
  static constexpr size_t scratch = size_t(kRows) * lds * sizeof(float);
  static constexpr size_t forward_bytes = 3 * tile + scratch + ptile;   // q, k, v, S, P
  static constexpr size_t dq_bytes = 4 * tile + scratch + ptile;        // q, dO, k, v, S, dS
  static constexpr size_t dkv_bytes = 4 * tile + scratch + 2 * ptile +  // k, v, q, dO, S, P, dS
                                      2 * kCols * sizeof(float);        // lse, Drow
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  static_assert(tile % 128 == 0 && ptile % 128 == 0 && scratch % 128 == 0, "smem alignment");
};

// ---------------------------------------------------------------------------------------------
// Warp-level tile products on shared memory. A warp's 16 rows times D or kCols columns:
//  * Rows: a (16, D) left operand;
//  * nt:  c (16, kCols) fp32 = a (16, D) @ b (kCols, D)^T, stored to shared memory;
//  * mul: c (16, D) fp32 = a (16, kCols) @ b (kCols, D), stored to shared memory;
//  * Acc / nn / store: acc (16, D) fp32 += a (16, kCols) @ b (kCols, D), kept in registers.
// Callers __syncwarp() between writing shared memory and another lane reading it.
template <typename T, int D>
struct Warp;

// fp32: plain FMA loops. nt: lane computes columns lane and lane + 32 of all 16 rows; nn/mul:
// lane owns row lane / 2, columns lane % 2 + 2c.
template <int D>
struct Warp<float, D> {
  struct Rows {
    const float* p;
    int ld;
  };
  struct Acc {
    float v[D / 2];
  };

  static __device__ __forceinline__ void load(Rows& a, const float* p, int ld) {
    a.p = p;
    a.ld = ld;
  }
  static __device__ __forceinline__ void zero(Acc& c) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) c.v[i] = 0.0f;
  }
  static __device__ __forceinline__ void nt(float* c, int ldc, const Rows& a, const float* b,
                                            int ldb) {
    const int lane = threadIdx.x % 32;
    float acc[16][2] = {};
    for (int k = 0; k < D; ++k) {
      const float b0 = b[lane * ldb + k], b1 = b[(lane + 32) * ldb + k];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const float x = a.p[r * a.ld + k];
        acc[r][0] = fmaf(x, b0, acc[r][0]);
        acc[r][1] = fmaf(x, b1, acc[r][1]);
      }
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      c[r * ldc + lane] = acc[r][0];
      c[r * ldc + lane + 32] = acc[r][1];
    }
  }
  static __device__ __forceinline__ void nn(Acc& c, const float* a, int lda, const float* b,
                                            int ldb) {
    const int r = (threadIdx.x % 32) / 2, h = threadIdx.x % 2;
    for (int kk = 0; kk < kCols; ++kk) {
      const float x = a[r * lda + kk];
      const float* brow = b + kk * ldb + h;
#pragma unroll
      for (int i = 0; i < D / 2; ++i) c.v[i] = fmaf(x, brow[2 * i], c.v[i]);
    }
  }
  static __device__ __forceinline__ void store(float* c, int ldc, const Acc& a) {
    const int r = (threadIdx.x % 32) / 2, h = threadIdx.x % 2;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) c[r * ldc + h + 2 * i] = a.v[i];
  }
  static __device__ __forceinline__ void mul(float* c, int ldc, const float* a, int lda,
                                             const float* b, int ldb) {
    Acc acc;
    zero(acc);
    nn(acc, a, lda, b, ldb);
    store(c, ldc, acc);
  }
};

// ---------------------------------------------------------------------------------------------
// Global <-> shared memory

// g rows [0, valid) (row stride ldg) = s (16, D) fp32 shared (row stride lds) as T; one warp.
template <typename T, int D>
__device__ __forceinline__ void store_rows(T* g, int ldg, const float* s, int lds, int valid,
                                           bool vec) {
  constexpr int kVec = Layout<T, D>::kVec, kChunks = D / kVec;
  for (int idx = threadIdx.x % 32; idx < 16 * kChunks; idx += 32) {
    const int r = idx / kChunks, c = (idx % kChunks) * kVec;
    if (r >= valid) continue;
    const float* src = s + r * lds + c;
    if (vec) {
      alignas(16) T tmp[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) tmp[e] = from_f32<T>(src[e]);
      *reinterpret_cast<uint4*>(g + r * ldg + c) = *reinterpret_cast<const uint4*>(tmp);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) g[r * ldg + c + e] = from_f32<T>(src[e]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(T* out, float* lse, const T* qkv, int N, int H, int tiles,
                         float scale_log2, bool vec) {
  // qkv (B, N, 3C) -> out (B, N, C), lse (B, H, N); block: (b, h), queries [row0, row0 + 64)
  using L = Layout<T, D>;
  using W = Warp<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);                         // (kRows, ldt) queries
  T* sk = sq + kRows * L::ldt;                                // (kCols, ldt) keys of the tile
  T* sv = sk + kRows * L::ldt;                                // (kCols, ldt) values of the tile
  float* ss = reinterpret_cast<float*>(sv + kRows * L::ldt);  // (kRows, lds) S, then P V
  T* sp = reinterpret_cast<T*>(ss + kRows * L::lds);          // (kRows, ldp) P
  const BlockPos pos(H, tiles);
  const int C = H * D, ld3 = 3 * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;  // softmax: lanes 2r, 2r+1 share row r of the warp
  const T* q = qkv + Index(pos.b) * N * ld3 + pos.h * D;  // (N, D), row stride 3C
  const T* k = q + C;
  const T* v = q + 2 * C;
  float* sw = ss + warp * 16 * L::lds;  // (16, lds) this warp's scratch
  T* pw = sp + warp * 16 * L::ldp;      // (16, ldp) this warp's P

  load_tile<T, D>(sq, q + Index(pos.row0) * ld3, ld3, N - pos.row0, vec);
  __syncthreads();
  typename W::Rows qa;
  W::load(qa, sq + warp * 16 * L::ldt, L::ldt);
  float o[D / 2];  // row r, columns half + 2c of P V, unnormalised
#pragma unroll
  for (int c = 0; c < D / 2; ++c) o[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // running max (log2 units, scaled) and sum of row r

  for (int j0 = 0; j0 < N; j0 += kCols) {
    const int nv = min(kCols, N - j0);  // valid keys in the tile
    __syncthreads();                    // the previous K, V tiles and scratch reads are done
    load_tile<T, D>(sk, k + Index(j0) * ld3, ld3, nv, vec);
    load_tile<T, D>(sv, v + Index(j0) * ld3, ld3, nv, vec);
    __syncthreads();
    W::nt(sw, L::lds, qa, sk, L::ldt);  // raw scores (16, kCols)
    __syncwarp();
    float s[kHalf];
    float mt = -INFINITY;
#pragma unroll
    for (int t = 0; t < kHalf; ++t) {
      const int j = half + 2 * t;
      s[t] = j < nv ? sw[r * L::lds + j] * scale_log2 : -INFINITY;
      mt = fmaxf(mt, s[t]);
    }
    const float mn = fmaxf(m, fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1)));  // finite: j0 < N
    const float alpha = exp2f(m - mn);  // 0 on the first tile
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kHalf; ++t) {
      const float p = exp2f(s[t] - mn);  // masked keys: exp2(-inf) = 0
      sum += p;
      pw[r * L::ldp + half + 2 * t] = from_f32<T>(p);
    }
    l = l * alpha + (sum + __shfl_xor_sync(0xffffffffu, sum, 1));  // same bits in both lanes
    m = mn;
    __syncwarp();
    W::mul(sw, L::lds, pw, L::ldp, sv, L::ldt);  // P V (16, D) over the scores, all read above
    __syncwarp();
#pragma unroll
    for (int c = 0; c < D / 2; ++c) o[c] = o[c] * alpha + sw[r * L::lds + half + 2 * c];
  }

  __syncwarp();  // every lane has read its P V before the scratch takes the output
  const float inv = 1.0f / l;
#pragma unroll
  for (int c = 0; c < D / 2; ++c) sw[r * L::lds + half + 2 * c] = o[c] * inv;
  const int row = pos.row0 + warp * 16 + r;
  if (half == 0 && row < N) lse[Index(pos.bh) * N + row] = (m + log2f(l)) * kLn2;
  __syncwarp();
  const int first = pos.row0 + warp * 16;
  store_rows<T, D>(out + (Index(pos.b) * N + first) * C + pos.h * D, C, sw, L::lds, N - first, vec);
}

template <typename T>
__global__ void flash_drow_kernel(float* drow, const T* dout, const T* out, Index rows, int N,
                                  int H, int D) {
  // drow (B, H, N) = rowsum(dout * out) per head; dout, out (B, N, C). A warp per (b, n, h).
  const Index w = blockIdx.x * Index(blockDim.x / 32) + threadIdx.x / 32;  // in (B * N * H)
  const int lane = threadIdx.x % 32;
  if (w >= rows) return;
  const Index bn = w / H;
  const int h = int(w % H);
  const T* a = dout + bn * H * D + h * D;  // (D)
  const T* o = out + bn * H * D + h * D;   // (D)
  float s = 0.0f;
  for (int c = lane; c < D; c += 32) s += to_f32(a[c]) * to_f32(o[c]);
  s = warp_sum(s);
  if (lane == 0) drow[(bn / N * H + h) * N + bn % N] = s;
}

// The same sums with 16-byte loads: eight lanes per (b, n, h) row, lane j taking packs j,
// j + 8, ..., so a warp's load covers four consecutive head rows, contiguous in memory (the
// warp-per-head kernel moved two bf16 a lane at D = 64, ~3x its bytes'
// time). Fixed order (lane sums, then a butterfly over the eight), so the bits
// are reproducible; they differ from the warp kernel's by rounding only (the emulation's tests
// bound Drow's error, not its summation order).
constexpr int kDrowLanes = 8;  // lanes per head row
template <typename T, int D>
__global__ void flash_drow_packed_kernel(float* drow, const T* dout, const T* out, Index rows,
                                         int N, int H) {
  // drow (B, H, N); dout, out (B, N, C) with C = H D: row t = (b, n, h) starts at t D
  constexpr int G = 16 / int(sizeof(T));  // elements per 16-byte load
  constexpr int kPacks = D / G;           // per head row
  const Index t = (blockIdx.x * Index(blockDim.x) + threadIdx.x) / kDrowLanes;  // in (B * N * H)
  const int j = threadIdx.x % kDrowLanes;
  float s = 0.0f;
  if (t < rows) {
    const auto* a = reinterpret_cast<const uint4*>(dout + t * D);  // (kPacks)
    const auto* o = reinterpret_cast<const uint4*>(out + t * D);   // (kPacks)
#pragma unroll
    for (int p = j; p < kPacks; p += kDrowLanes) {
      const uint4 ap = a[p], op = o[p];
      const T* av = reinterpret_cast<const T*>(&ap);
      const T* ov = reinterpret_cast<const T*>(&op);
#pragma unroll
      for (int e = 0; e < G; ++e) s += to_f32(av[e]) * to_f32(ov[e]);
    }
  }
#pragma unroll
  for (int m = kDrowLanes / 2; m > 0; m /= 2) s += __shfl_xor_sync(0xffffffffu, s, m);
  if (t >= rows || j != 0) return;
  const Index bn = t / H;
  const int h = int(t % H);
  drow[(bn / N * H + h) * N + bn % N] = s;
}

// drow (B, H, N) = rowsum(dout * out) per head, on stream(): packed where both tensors are
// 16-byte aligned (D is a multiple of 16, so every head row is too).
template <typename T>
void flash_drow(float* drow, const T* dout, const T* out, Index B, Index N, Index H, Index D) {
  const Index rows = B * N * H;
  if (aligned16(dout) && aligned16(out)) {
    constexpr int kThreadsPerBlock = 256, kRowsPerBlock = kThreadsPerBlock / kDrowLanes;
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      flash_drow_packed_kernel<T, kD>
          <<<blocks_for(rows, kRowsPerBlock), kThreadsPerBlock, 0, stream()>>>(
              drow, dout, out, rows, int(N), int(H));
    });
  } else {
    constexpr int kWarpsPerBlock = 8;
    flash_drow_kernel<T><<<blocks_for(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream()>>>(
        drow, dout, out, rows, int(N), int(H), int(D));
  }
  VIT_CUDA_LAUNCHED();
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* drow,
                    int N, int H, int tiles, float scale, bool vec) {
  // dq (B, N, D) at column h*D of dqkv (B, N, 3C); block: (b, h), queries [row0, row0 + 64)
  using L = Layout<T, D>;
  using W = Warp<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);                         // (kRows, ldt) queries
  T* sdo = sq + kRows * L::ldt;                               // (kRows, ldt) dO
  T* sk = sdo + kRows * L::ldt;                               // (kCols, ldt) keys of the tile
  T* sv = sk + kRows * L::ldt;                                // (kCols, ldt) values of the tile
  float* ss = reinterpret_cast<float*>(sv + kRows * L::ldt);  // (kRows, lds) S, dP, then dQ
  T* sds = reinterpret_cast<T*>(ss + kRows * L::lds);         // (kRows, ldp) dS
  const BlockPos pos(H, tiles);
  const int C = H * D, ld3 = 3 * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  const T* q = qkv + Index(pos.b) * N * ld3 + pos.h * D;  // (N, D), row stride 3C
  const T* k = q + C;
  const T* v = q + 2 * C;
  const T* dO = dout + Index(pos.b) * N * C + pos.h * D;  // (N, D), row stride C
  float* sw = ss + warp * 16 * L::lds;
  T* dsw = sds + warp * 16 * L::ldp;
  const float scale_log2 = scale * kLog2e;

  load_tile<T, D>(sq, q + Index(pos.row0) * ld3, ld3, N - pos.row0, vec);
  load_tile<T, D>(sdo, dO + Index(pos.row0) * C, C, N - pos.row0, vec);
  __syncthreads();
  typename W::Rows qa, da;
  W::load(qa, sq + warp * 16 * L::ldt, L::ldt);
  W::load(da, sdo + warp * 16 * L::ldt, L::ldt);
  const int row = pos.row0 + warp * 16 + r;
  // Rows past N: any finite values (their dQ is never written).
  const float lse2 = row < N ? lse[Index(pos.bh) * N + row] * kLog2e : 0.0f;
  const float dr = row < N ? drow[Index(pos.bh) * N + row] : 0.0f;
  typename W::Acc dq;
  W::zero(dq);

  for (int j0 = 0; j0 < N; j0 += kCols) {
    const int nv = min(kCols, N - j0);
    __syncthreads();
    load_tile<T, D>(sk, k + Index(j0) * ld3, ld3, nv, vec);
    load_tile<T, D>(sv, v + Index(j0) * ld3, ld3, nv, vec);
    __syncthreads();
    W::nt(sw, L::lds, qa, sk, L::ldt);  // S (16, kCols)
    __syncwarp();
    float p[kHalf];
#pragma unroll
    for (int t = 0; t < kHalf; ++t) {
      const int j = half + 2 * t;
      p[t] = j < nv ? exp2f(sw[r * L::lds + j] * scale_log2 - lse2) : 0.0f;
    }
    __syncwarp();
    W::nt(sw, L::lds, da, sv, L::ldt);  // dP = dO V^T (16, kCols)
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kHalf; ++t) {
      const int j = half + 2 * t;
      dsw[r * L::ldp + j] = from_f32<T>(p[t] * (sw[r * L::lds + j] - dr) * scale);
    }
    __syncwarp();
    W::nn(dq, dsw, L::ldp, sk, L::ldt);  // dQ += dS K
  }

  __syncwarp();
  W::store(sw, L::lds, dq);
  __syncwarp();
  const int first = pos.row0 + warp * 16;
  store_rows<T, D>(dqkv + (Index(pos.b) * N + first) * ld3 + pos.h * D, ld3, sw, L::lds, N - first,
                   vec);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* drow,
                     int N, int H, int tiles, float scale, bool vec) {
  // dk, dv (B, N, D) at columns C + h*D, 2C + h*D of dqkv (B, N, 3C); block: (b, h), keys
  // [row0, row0 + 64); the warp computes the transposed tiles S^T, P^T, dP^T, dS^T (16 keys,
  // kCols queries).
  using L = Layout<T, D>;
  using W = Warp<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sk = reinterpret_cast<T*>(smem);                            // (kRows, ldt) keys
  T* sv = sk + kRows * L::ldt;                                   // (kRows, ldt) values
  T* sq = sv + kRows * L::ldt;                                   // (kCols, ldt) queries of the tile
  T* sdo = sq + kRows * L::ldt;                                  // (kCols, ldt) dO of the tile
  float* ss = reinterpret_cast<float*>(sdo + kRows * L::ldt);    // (kRows, lds) S^T, dP^T, dK, dV
  T* sp = reinterpret_cast<T*>(ss + kRows * L::lds);             // (kRows, ldp) P^T
  T* sds = sp + kRows * L::ldp;                                  // (kRows, ldp) dS^T
  float* slse = reinterpret_cast<float*>(sds + kRows * L::ldp);  // (kCols) lse, log2 units
  float* sdr = slse + kCols;                                     // (kCols) Drow
  const BlockPos pos(H, tiles);
  const int C = H * D, ld3 = 3 * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  const T* q = qkv + Index(pos.b) * N * ld3 + pos.h * D;  // (N, D), row stride 3C
  const T* k = q + C;
  const T* v = q + 2 * C;
  const T* dO = dout + Index(pos.b) * N * C + pos.h * D;  // (N, D), row stride C
  const float* lse_bh = lse + Index(pos.bh) * N;          // (N)
  const float* dr_bh = drow + Index(pos.bh) * N;          // (N)
  float* sw = ss + warp * 16 * L::lds;
  T* pw = sp + warp * 16 * L::ldp;
  T* dsw = sds + warp * 16 * L::ldp;
  const float scale_log2 = scale * kLog2e;

  load_tile<T, D>(sk, k + Index(pos.row0) * ld3, ld3, N - pos.row0, vec);
  load_tile<T, D>(sv, v + Index(pos.row0) * ld3, ld3, N - pos.row0, vec);
  typename W::Acc dk, dv;
  W::zero(dk);
  W::zero(dv);

  for (int i0 = 0; i0 < N; i0 += kCols) {
    const int nv = min(kCols, N - i0);  // valid queries in the tile
    __syncthreads();
    load_tile<T, D>(sq, q + Index(i0) * ld3, ld3, nv, vec);
    load_tile<T, D>(sdo, dO + Index(i0) * C, C, nv, vec);
    for (int t = threadIdx.x; t < kCols; t += kThreads) {
      slse[t] = t < nv ? lse_bh[i0 + t] * kLog2e : 0.0f;
      sdr[t] = t < nv ? dr_bh[i0 + t] : 0.0f;
    }
    __syncthreads();
    {
      typename W::Rows ka;
      W::load(ka, sk + warp * 16 * L::ldt, L::ldt);
      W::nt(sw, L::lds, ka, sq, L::ldt);  // S^T = K Q^T (16, kCols)
    }
    __syncwarp();
    float p[kHalf];
#pragma unroll
    for (int t = 0; t < kHalf; ++t) {
      const int i = half + 2 * t;
      p[t] = i < nv ? exp2f(sw[r * L::lds + i] * scale_log2 - slse[i]) : 0.0f;
      pw[r * L::ldp + i] = from_f32<T>(p[t]);
    }
    __syncwarp();
    {
      typename W::Rows va;
      W::load(va, sv + warp * 16 * L::ldt, L::ldt);
      W::nt(sw, L::lds, va, sdo, L::ldt);  // dP^T = V dO^T (16, kCols)
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kHalf; ++t) {
      const int i = half + 2 * t;
      dsw[r * L::ldp + i] = from_f32<T>(p[t] * (sw[r * L::lds + i] - sdr[i]) * scale);
    }
    __syncwarp();
    // Both products after dS: P lives in registers only across the dP product above.
    W::nn(dv, pw, L::ldp, sdo, L::ldt);  // dV += P^T dO
    W::nn(dk, dsw, L::ldp, sq, L::ldt);  // dK += dS^T Q
  }

  const int first = pos.row0 + warp * 16;
  T* dk_out = dqkv + (Index(pos.b) * N + first) * ld3 + C + pos.h * D;  // row stride 3C
  __syncwarp();
  W::store(sw, L::lds, dk);
  __syncwarp();
  store_rows<T, D>(dk_out, ld3, sw, L::lds, N - first, vec);
  __syncwarp();
  W::store(sw, L::lds, dv);
  __syncwarp();
  store_rows<T, D>(dk_out + C, ld3, sw, L::lds, N - first, vec);
}

// ---------------------------------------------------------------------------------------------
// Host side

}  // namespace

template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, Index B, Index N, Index H, Index D) {
  const int tiles = check_shape(B, N, H, D);
  const bool vec = aligned16(out) && aligned16(qkv);
  if constexpr (std::is_same_v<T, bf16>) {
    flash_mma_forward(out, lse, qkv, B, N, H, D, vec);
  } else {
    const float scale_log2 = kLog2e / std::sqrt(float(D));
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      constexpr size_t bytes = Layout<T, kD>::forward_bytes;
      launch_flash<flash_forward_kernel<T, kD>>(unsigned(B * H * tiles), bytes, out, lse, qkv,
                                                int(N), int(H), tiles, scale_log2, vec);
    });
  }
}

template <typename T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              Index B, Index N, Index H, Index D) {
  const int tiles = check_shape(B, N, H, D);
  const float scale = 1.0f / std::sqrt(float(D));
  const bool vec = aligned16(dqkv) && aligned16(dout) && aligned16(qkv);
  auto* drow = static_cast<float*>(scratch(size_t(B * H * N) * sizeof(float), kScratchFlash));
  flash_drow(drow, dout, out, B, N, H, D);
  if constexpr (std::is_same_v<T, bf16>) {
    flash_mma_backward(dqkv, dout, qkv, lse, drow, B, N, H, D, vec);
  } else {
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      constexpr size_t dkv_bytes = Layout<T, kD>::dkv_bytes, dq_bytes = Layout<T, kD>::dq_bytes;
      const unsigned grid = unsigned(B * H * tiles);
      launch_flash<flash_dkv_kernel<T, kD>>(grid, dkv_bytes, dqkv, dout, qkv, lse, drow, int(N),
                                            int(H), tiles, scale, vec);
      launch_flash<flash_dq_kernel<T, kD>>(grid, dq_bytes, dqkv, dout, qkv, lse, drow, int(N),
                                           int(H), tiles, scale, vec);
    });
  }
}

#define INSTANTIATE(T)                                                                             \
  template void flash_attention_forward<T>(T*, float*, const T*, Index, Index, Index, Index);      \
  template void flash_attention_backward<T>(T*, const T*, const T*, const T*, const float*, Index, \
                                            Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
