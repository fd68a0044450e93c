// bf16 emulation of the CUDA attention (src/ops/cuda/attention.cu), written out rather than
// wrapped around the CPU op, because the CUDA op rounds intermediates that the CPU op keeps in
// fp32:
//  * forward: scores = scale * q k^T in fp32, fp32 softmax (max, sum of exp(s - max), times
//    1 / sum), the probabilities rounded to bf16 into att, and the P @ V GEMM reads those
//    rounded probabilities; out is rounded once.
//  * backward: dV = P^T dO and dP = dO V^T read the stored bf16 P; dP stays fp32; dS =
//    P * (dP - rowdot(P, dP)) * scale is rounded to bf16 and the dQ = dS K and dK = dS^T Q
//    GEMMs read the rounded dS; dq, dk, dv are rounded once.
// One (batch, head) pair per OpenMP iteration, its GEMMs reading q, k, v in place from the
// fp32 copy of qkv (OpenBLAS runs single-threaded inside the parallel region).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/emu/attention_head.h"
#include "ops/emu/ops.h"

namespace vit::emu {

namespace {

// Softmax of each row of p (N, N) in place, each probability rounded to bf16 as the CUDA
// kernel stores it: exp(s - max) * (1 / sum) in fp32, then one rounding.
void softmax_rows_rounded(float* p, Index N) {
  for (Index i = 0; i < N; ++i) {
    float* row = p + i * N;  // (N)
    const float mx = *std::max_element(row, row + N);
    float sum = 0.0f;
    for (Index j = 0; j < N; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (Index j = 0; j < N; ++j) row[j] = round_bf16(row[j] * inv);
  }
}

// Softmax backward times the score scale, in place: ds (N, N) holds dP on entry and the bf16
// rounded dS = P * (dP - rowdot(P, dP)) * scale on return; p (N, N) is the stored P.
void softmax_backward_rows_rounded(float* ds, const float* p, Index N, float scale) {
  for (Index i = 0; i < N; ++i) {
    const float* pr = p + i * N;  // (N)
    float* dr = ds + i * N;       // (N)
    float dot = 0.0f;
    for (Index j = 0; j < N; ++j) dot += pr[j] * dr[j];
    for (Index j = 0; j < N; ++j) dr[j] = round_bf16(pr[j] * (dr[j] - dot) * scale);
  }
}

}  // namespace

void attention_forward(bf16* out, bf16* att, const bf16* qkv, Index B, Index N, Index H, Index D) {
  const Index C = H * D, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(D));
  thread_local std::vector<float> qkv_buf, out_buf, p_buf;
  const float* qkv32 = widened(qkv_buf, qkv, B * N * C3);  // (B, N, 3C)
  out_buf.resize(size_t(B * N * C));
  float* out32 = out_buf.data();  // (B, N, C)
#pragma omp parallel
  {
    p_buf.resize(size_t(N * N));  // this thread's own buffer (thread_local)
    float* p = p_buf.data();      // (N, N) scores, then the probabilities as stored
#pragma omp for collapse(2) schedule(static)
    for (Index b = 0; b < B; ++b) {
      for (Index h = 0; h < H; ++h) {
        const AttentionHead hd(qkv32, nullptr, nullptr, b, h, N, H, D);
        const float *q = hd.q, *k = hd.k, *v = hd.v;
        cpu::gemm(false, true, N, N, D, scale, q, C3, k, C3, 0.0f, p, N);
        softmax_rows_rounded(p, N);
        bf16* a = att + (b * H + h) * N * N;                  // (N, N)
        for (Index i = 0; i < N * N; ++i) a[i] = bf16(p[i]);  // exact: p is already rounded
        float* o = out32 + b * N * C + h * D;                 // (N, D), row stride C
        cpu::gemm(false, false, N, D, N, 1.0f, p, N, v, C3, 0.0f, o, C);
      }
    }
  }
  convert(out, out32, B * N * C);
}

void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att, Index B,
                        Index N, Index H, Index D) {
  const Index C = H * D, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(D));
  thread_local std::vector<float> qkv_buf, dout_buf, dqkv_buf, p_buf, ds_buf;
  const float* qkv32 = widened(qkv_buf, qkv, B * N * C3);    // (B, N, 3C)
  const float* dout32 = widened(dout_buf, dout, B * N * C);  // (B, N, C)
  dqkv_buf.resize(size_t(B * N * C3));
  float* dqkv32 = dqkv_buf.data();  // (B, N, 3C)
#pragma omp parallel
  {
    // This thread's own buffers (thread_local): one head's P, and its dP, then dS.
    p_buf.resize(size_t(N * N));
    ds_buf.resize(size_t(N * N));
    float* p = p_buf.data();    // (N, N)
    float* ds = ds_buf.data();  // (N, N)
#pragma omp for collapse(2) schedule(static)
    for (Index b = 0; b < B; ++b) {
      for (Index h = 0; h < H; ++h) {
        const AttentionHead hd(qkv32, dqkv32, dout32, b, h, N, H, D);
        const float *q = hd.q, *k = hd.k, *v = hd.v, *dO = hd.dO;
        float *dq = hd.dq, *dk = hd.dk, *dv = hd.dv;
        const bf16* a = att + (b * H + h) * N * N;  // (N, N)
        for (Index i = 0; i < N * N; ++i) p[i] = float(a[i]);
        cpu::gemm(true, false, N, D, N, 1.0f, p, N, dO, C, 0.0f, dv, C3);  // dV = P^T dO
        cpu::gemm(false, true, N, N, D, 1.0f, dO, C, v, C3, 0.0f, ds, N);  // dP = dO V^T
        softmax_backward_rows_rounded(ds, p, N, scale);
        cpu::gemm(false, false, N, D, N, 1.0f, ds, N, k, C3, 0.0f, dq, C3);  // dQ = dS K
        cpu::gemm(true, false, N, D, N, 1.0f, ds, N, q, C3, 0.0f, dk, C3);   // dK = dS^T Q
      }
    }
  }
  convert(dqkv, dqkv32, B * N * C3);
}

}  // namespace vit::emu
