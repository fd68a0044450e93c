// bf16 emulation of the fused attention (src/ops/cuda/flash_attention.cu): the same tiles and
// the same rounding points, fp32 in between, so the CUDA bf16 model can be compared with the
// emulation step by step. What the kernels do, per (batch, head):
//  * forward, per query row, over key tiles of kFlashTile: s = (q . k) * log2(e) / sqrt(D);
//    the running max m' = max(m, max s); alpha = exp2(m - m'); p = exp2(s - m') in fp32; the
//    running sum l = l * alpha + sum(p) of the UNROUNDED p; O = O * alpha + round(p) @ V.
//    out = round(O * (1 / l)); lse = (m + log2 l) * ln 2.
//  * backward: Drow = rowsum(dO * out) over the stored bf16 values; p = exp2(s - lse log2 e)
//    recomputed in fp32; dV = round(p)^T dO; dP = dO V^T (fp32); dS = round(p (dP - Drow)
//    scale); dQ = dS K, dK = dS^T Q; dq, dk, dv rounded once.
// Only the fp32 summation order differs from the kernels (tensor-core tile sums there,
// OpenBLAS here). One (batch, head) pair per OpenMP iteration; OpenBLAS runs single-threaded
// inside the parallel region.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/attention_choice.h"
#include "ops/cpu/blas.h"
#include "ops/emu/attention_head.h"
#include "ops/emu/ops.h"

namespace vit::emu {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// One head's forward. s (N, N) holds the raw scores q k^T on entry (clobbered); pt (N, T)
// and pv (N, D) are scratch; o (N, D), row stride ldo, receives out in fp32; lse (N).
void flash_head_forward(float* o, Index ldo, float* lse, float* s, float* pt, float* pv,
                        const float* v, Index ldv, Index N, Index D, float scale_log2) {
  // Per query row: running max (log2 units), running sum, this tile's rescale factor.
  std::vector<float> m(size_t(N), -INFINITY), l(size_t(N), 0.0f), alpha(size_t(N), 0.0f);
  for (Index i = 0; i < N; ++i)
    for (Index d = 0; d < D; ++d) o[i * ldo + d] = 0.0f;
  for (Index j0 = 0; j0 < N; j0 += kFlashTile) {
    const Index nv = std::min(kFlashTile, N - j0);  // keys in this tile
    for (Index i = 0; i < N; ++i) {
      float* row = s + i * N + j0;  // (nv) this tile's scores of query i
      float mt = -INFINITY;
      for (Index t = 0; t < nv; ++t) {
        row[t] *= scale_log2;
        mt = std::max(mt, row[t]);
      }
      const float mn = std::max(m[i], mt);
      alpha[i] = std::exp2(m[i] - mn);  // 0 on the first tile
      float sum = 0.0f;
      for (Index t = 0; t < nv; ++t) {
        const float p = std::exp2(row[t] - mn);
        sum += p;
        pt[i * nv + t] = round_bf16(p);  // the tensor-core operand
      }
      l[i] = l[i] * alpha[i] + sum;
      m[i] = mn;
    }
    cpu::gemm(false, false, N, D, nv, 1.0f, pt, nv, v + j0 * ldv, ldv, 0.0f, pv, D);  // P V
    for (Index i = 0; i < N; ++i)
      for (Index d = 0; d < D; ++d) o[i * ldo + d] = o[i * ldo + d] * alpha[i] + pv[i * D + d];
  }
  for (Index i = 0; i < N; ++i) {
    const float inv = 1.0f / l[i];
    for (Index d = 0; d < D; ++d) o[i * ldo + d] *= inv;
    lse[i] = (m[i] + std::log2(l[i])) * kLn2;
  }
}

}  // namespace

void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, Index B, Index N, Index H,
                             Index D) {
  const Index C = H * D, C3 = 3 * C;
  const float scale_log2 = kLog2e / std::sqrt(float(D));
  thread_local std::vector<float> qkv_buf, out_buf, s_buf, pt_buf, pv_buf;
  const float* qkv32 = widened(qkv_buf, qkv, B * N * C3);  // (B, N, 3C)
  out_buf.resize(size_t(B * N * C));
  float* out32 = out_buf.data();  // (B, N, C)
#pragma omp parallel
  {
    // This thread's own buffers (thread_local): scores, one tile's P, its P V.
    s_buf.resize(size_t(N * N));
    pt_buf.resize(size_t(N * std::min(N, kFlashTile)));
    pv_buf.resize(size_t(N * D));
#pragma omp for collapse(2) schedule(static)
    for (Index b = 0; b < B; ++b) {
      for (Index h = 0; h < H; ++h) {
        const AttentionHead a(qkv32, nullptr, nullptr, b, h, N, H, D);
        cpu::gemm(false, true, N, N, D, 1.0f, a.q, C3, a.k, C3, 0.0f, s_buf.data(), N);
        flash_head_forward(out32 + b * N * C + h * D, C, lse + (b * H + h) * N, s_buf.data(),
                           pt_buf.data(), pv_buf.data(), a.v, C3, N, D, scale_log2);
      }
    }
  }
  convert(out, out32, B * N * C);
}

void flash_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, Index B, Index N, Index H, Index D) {
  const Index C = H * D, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(D));
  const float scale_log2 = scale * kLog2e;
  thread_local std::vector<float> qkv_buf, dout_buf, out_buf, dqkv_buf, p_buf, pr_buf, ds_buf;
  const float* qkv32 = widened(qkv_buf, qkv, B * N * C3);    // (B, N, 3C)
  const float* dout32 = widened(dout_buf, dout, B * N * C);  // (B, N, C)
  const float* out32 = widened(out_buf, out, B * N * C);     // (B, N, C)
  dqkv_buf.resize(size_t(B * N * C3));
  float* dqkv32 = dqkv_buf.data();  // (B, N, 3C)
#pragma omp parallel
  {
    // This thread's own buffers (thread_local): P in fp32, P rounded, dP then dS.
    p_buf.resize(size_t(N * N));
    pr_buf.resize(size_t(N * N));
    ds_buf.resize(size_t(N * N));
    float *p = p_buf.data(), *pr = pr_buf.data(), *ds = ds_buf.data();  // (N, N) each
#pragma omp for collapse(2) schedule(static)
    for (Index b = 0; b < B; ++b) {
      for (Index h = 0; h < H; ++h) {
        const AttentionHead hd(qkv32, dqkv32, dout32, b, h, N, H, D);
        const float *q = hd.q, *k = hd.k, *v = hd.v, *dO = hd.dO;
        float *dq = hd.dq, *dk = hd.dk, *dv = hd.dv;
        const float* o = out32 + b * N * C + h * D;                        // (N, D), row stride C
        const float* lse_bh = lse + (b * H + h) * N;                       // (N)
        cpu::gemm(false, true, N, N, D, 1.0f, q, C3, k, C3, 0.0f, p, N);   // S = Q K^T
        cpu::gemm(false, true, N, N, D, 1.0f, dO, C, v, C3, 0.0f, ds, N);  // dP = dO V^T
        for (Index i = 0; i < N; ++i) {
          float drow = 0.0f;
          for (Index d = 0; d < D; ++d) drow += dO[i * C + d] * o[i * C + d];
          const float lse2 = lse_bh[i] * kLog2e;
          for (Index j = 0; j < N; ++j) {
            const Index e = i * N + j;
            p[e] = std::exp2(p[e] * scale_log2 - lse2);
            pr[e] = round_bf16(p[e]);
            ds[e] = round_bf16(p[e] * (ds[e] - drow) * scale);
          }
        }
        cpu::gemm(true, false, N, D, N, 1.0f, pr, N, dO, C, 0.0f, dv, C3);   // dV = P^T dO
        cpu::gemm(false, false, N, D, N, 1.0f, ds, N, k, C3, 0.0f, dq, C3);  // dQ = dS K
        cpu::gemm(true, false, N, D, N, 1.0f, ds, N, q, C3, 0.0f, dk, C3);   // dK = dS^T Q
      }
    }
  }
  convert(dqkv, dqkv32, B * N * C3);
}

}  // namespace vit::emu
