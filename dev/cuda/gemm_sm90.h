// The Hopper (sm_90a) wgmma GEMM with fused epilogues (gemm_sm90_kernels.cuh), as a library of
// its own built for sm_90a alone (CMakeLists.txt: wgmma exists on no other target). Host code
// only; it reports whether it ran, and the caller (matmul.cu) checks the launch and otherwise
// runs cuBLASLt. Opt-in for now (VIT_SM90_GEMM=1): written on a machine without a GPU.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/common.h"

namespace vit::cuda::sm90 {

// out (M, N; ldc) = A (M, K; lda) @ op(B) + bias (N, or null), rounded once to bf16, where op(B)
// is B^T for B (N, K; ldb) (a Linear's forward) or B for B (K, N; ldb) with trans_b (its data
// gradient). With `pre` (M, N; ldc) set: pre = that, and out = gelu(pre) (the exact erf GELU
// of the rounded pre, as the separate GELU kernel computes it). With `aux` (M, N; ldc) set
// instead, the GELU's input: out = gelu'(aux) * bf16(A @ op(B)), the separate ops' bits; and
// with dbias (N) set too, dbias += the column sums of out as stored, summed by the GEMM's blocks
// into `workspace` (gemm_workspace_floats) and then over them in order: deterministic.
struct GemmOperands {
  const __nv_bfloat16* a;
  Index lda;
  const __nv_bfloat16* b;
  Index ldb;
  bool trans_b;
  __nv_bfloat16* out;
  Index ldc;
  const __nv_bfloat16* bias;
  __nv_bfloat16* pre;
  const __nv_bfloat16* aux;
  float* dbias;
  float* workspace;
  Index M, N, K;
};

// The fp32 workspace the column sums need: ceil(M / 128) x N floats, or 0 without dbias.
Index gemm_workspace_floats(const GemmOperands& g);

// Whether this device runs the kernel: compute capability 9.0 and the driver's tensor-map
// encoder found (once per process).
bool gemm_available();
// Whether the operands fit the kernel: a and b 16-byte aligned with lda, ldb multiples of 8
// (the tensor map's 16-byte strides), out, pre and aux 4-byte aligned with ldc even, not both
// pre and aux, dbias only with aux and a workspace, M, N, K > 0, the tiles within an int and
// sizes within the map's limits.
bool gemm_fits(const GemmOperands& g);
// Enqueues the GEMM on `stream` when available and the operands fit; false (nothing enqueued)
// otherwise. The caller checks the launch (cudaGetLastError).
bool gemm(const GemmOperands& g, cudaStream_t stream);

// A Linear's weight gradient: dweight (Nout, K; ldw) += dout (R, Nout; ld_dout)^T @ inp (R, K;
// ld_inp) over R tokens, in fp32 from bf16 operands. R is long and the output tiles few, so
// the kernel splits the tokens (wgrad_splits: two blocks an SM) into fp32 partial sums in
// `workspace` (wgrad_workspace_floats), then adds them in split order: deterministic.
struct WgradOperands {
  const __nv_bfloat16* dout;
  Index ld_dout;
  const __nv_bfloat16* inp;
  Index ld_inp;
  float* dweight;
  Index ldw;
  Index R, Nout, K;
  float* workspace;
};
Index wgrad_splits(const WgradOperands& w);
Index wgrad_workspace_floats(const WgradOperands& w);
// dout and inp 16-byte aligned with strides a multiple of 8, K even, a workspace, sizes in range.
bool wgrad_fits(const WgradOperands& w);
// Enqueues it when available and the operands fit; false (nothing enqueued) otherwise.
bool wgrad(const WgradOperands& w, cudaStream_t stream);

// A diagnostic for the device test, below the GEMM: the bytes one TMA box lands as in shared
// memory, copied out (box_rows x 128 bytes into out). The box is 64 columns x box_rows rows at
// column c0, row c1 of the row-major (rows, cols; ld) matrix src, with the GEMM's 128-byte
// swizzle and zeros outside the matrix. False (nothing enqueued) where gemm_available() is.
bool probe_tma_box(unsigned char* out, const __nv_bfloat16* src, Index rows, Index cols, Index ld,
                   int box_rows, int c0, int c1, cudaStream_t stream);

}  // namespace vit::cuda::sm90
