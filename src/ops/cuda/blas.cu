// cuBLASLt GEMM: one handle and one workspace for the process, a row-major front end.
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "ops/cuda/blas.cuh"

namespace vit::cuda {

namespace {

#define VIT_CUBLAS_CHECK(call)                                                         \
  do {                                                                                 \
    const cublasStatus_t vit_st_ = (call);                                             \
    if (vit_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      throw Error(std::string("cuBLASLt error: ") + cublasLtGetStatusString(vit_st_) + \
                  " (" #call " at " __FILE__ ":" + std::to_string(__LINE__) + ")");    \
  } while (0)

// 32 MiB: what NVIDIA recommends for Hopper kernels (split-K and stream-K need it).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// Created on first use and kept for the process (the driver frees it at exit; destroying it
// from a static destructor could run after the CUDA runtime has shut down).
Lt& lt() {
  static Lt* s = [] {
    auto* p = new Lt;
    VIT_CUBLAS_CHECK(cublasLtCreate(&p->handle));
    VIT_CUDA_CHECK(cudaMalloc(&p->workspace, kWorkspaceBytes));
    return p;
  }();
  return *s;
}

template <typename T>
constexpr cudaDataType_t data_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

// Largest power of two (<= 256) dividing the address and, for batches, the batch stride: the
// heuristic assumes 256-byte operands unless told, and one head of a (B, N, 3C) qkv buffer or a
// parameter inside the contiguous buffer is often less aligned than that.
uint32_t alignment(const void* p, Index stride_bytes, Index batch) {
  uint64_t a = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) a |= uint64_t(stride_bytes);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t type, Index rows, Index cols, Index ld, Index batch, Index stride) {
    VIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld));
    if (batch > 1) {
      const int32_t count = int32_t(batch);
      const int64_t offset = stride;
      VIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &count, sizeof(count)));
      VIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof(offset)));
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(l); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

template <typename TC>
__global__ void add_bias_kernel(TC* c, const TC* bias, Index M, Index N, Index ldc, Index stride_c,
                                Index batch) {
  // c (batch, M, ldc) row-major; bias (N) broadcast over rows
  const Index total = batch * M * N;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total;
       i += Index(gridDim.x) * blockDim.x) {
    const Index n = i % N, m = (i / N) % M, b = i / (N * M);
    TC* p = c + b * stride_c + m * ldc + n;
    *p = from_f32<TC>(to_f32(*p) + to_f32(bias[n]));
  }
}

// Plain SIMT GEMM, one thread per output element, fp32 accumulation: the fallback when
// cuBLASLt offers no algorithm (odd alignments), and the cross-check VIT_GEMM_FALLBACK=1 forces.
template <typename TAB, typename TC>
__global__ void gemm_fallback_kernel(bool trans_a, bool trans_b, Index M, Index N, Index K,
                                     float alpha, const TAB* A, Index lda, Index stride_a,
                                     const TAB* B, Index ldb, Index stride_b, float beta, TC* C,
                                     Index ldc, Index stride_c, Index batch, const TC* bias) {
  // C[i] (M, ldc) = alpha * op(A[i]) (M, K) @ op(B[i]) (K, N) + beta * C[i] + bias (N)
  VIT_GRID_STRIDE(idx, batch * M * N) {
    const Index n = idx % N, m = (idx / N) % M, i = idx / (M * N);
    const TAB* a = A + i * stride_a;
    const TAB* b = B + i * stride_b;
    float acc = 0.0f;
    for (Index k = 0; k < K; ++k)
      acc += to_f32(trans_a ? a[k * lda + m] : a[m * lda + k]) *
             to_f32(trans_b ? b[n * ldb + k] : b[k * ldb + n]);
    TC* c = C + i * stride_c + m * ldc + n;
    float v = alpha * acc;
    if (beta != 0.0f) v += beta * to_f32(*c);  // beta == 0: C is not read (as in cuBLAS)
    if (bias) v += to_f32(bias[n]);
    *c = from_f32<TC>(v);
  }
}

bool force_fallback() {
  static const bool on = [] {
    const char* e = std::getenv("VIT_GEMM_FALLBACK");
    return e && *e && *e != '0';
  }();
  return on;
}

}  // namespace

template <typename TAB, typename TC>
void gemm(bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const TAB* A,
          Index lda, Index stride_a, const TAB* B, Index ldb, Index stride_b, float beta, TC* C,
          Index ldc, Index stride_c, Index batch, const TC* bias) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  VIT_CHECK(K > 0, "cuda::gemm: K must be positive");
  auto fallback = [&] {
    gemm_fallback_kernel<<<grid_stride_blocks(batch * M * N), kBlock, 0, stream()>>>(
        trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
        stride_c, batch, bias);
    VIT_CUDA_LAUNCHED();
  };
  if (force_fallback()) return fallback();
  Lt& ctx = lt();
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and
  // reuse each one's transpose flag (as cblas does for CblasRowMajor).
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // on B
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // on A
  const cudaDataType_t tab = data_type<TAB>(), tc = data_type<TC>();
  // Column-major shapes as stored (before op): B is (N, K) or (K, N); A is (K, M) or (M, K).
  Layout la(tab, trans_b ? K : N, trans_b ? N : K, ldb, batch, stride_b);
  Layout lb(tab, trans_a ? M : K, trans_a ? K : M, lda, batch, stride_a);
  Layout lc(tc, N, M, ldc, batch, stride_c);

  cublasLtMatmulDesc_t desc = nullptr;
  // fp32 compute: never TF32, so the fp32 mode matches the CPU reference to ~1e-6.
  VIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  VIT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  VIT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // The bias epilogue wants a 16-byte aligned vector; otherwise a separate kernel adds it.
  const bool epilogue_bias = bias && alignment(bias, 0, 1) >= 16;
  if (epilogue_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;  // bias (rows of C^T) = (N)
    VIT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    VIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof(bias)));
  }

  cublasLtMatmulPreference_t pref = nullptr;
  VIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  VIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al_a = alignment(B, stride_b * Index(sizeof(TAB)), batch);
  const uint32_t al_b = alignment(A, stride_a * Index(sizeof(TAB)), batch);
  const uint32_t al_c = alignment(C, stride_c * Index(sizeof(TC)), batch);
  VIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  VIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  VIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  VIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));

  // TODO(perf): cache the heuristic's choice per shape; it costs tens of microseconds a call.
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(ctx.handle, desc, la.l, lb.l, lc.l,
                                                            lc.l, pref, 1, &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hst != CUBLAS_STATUS_SUCCESS || found == 0) {
    // Correct but slow; said once per process so a model shape that hits it gets noticed.
    cublasLtMatmulDescDestroy(desc);
    static bool told = false;
    if (!told)
      std::fprintf(stderr,
                   "vitrain: cuBLASLt has no algorithm (%s) for GEMM M=%lld N=%lld K=%lld "
                   "lda=%lld ldb=%lld ldc=%lld batch=%lld align A/B/C=%u/%u/%u; using the "
                   "fallback kernel (reported once)\n",
                   cublasLtGetStatusString(hst), (long long)M, (long long)N, (long long)K,
                   (long long)lda, (long long)ldb, (long long)ldc, (long long)batch, al_b, al_a,
                   al_c);
    told = true;
    return fallback();
  }
  const cublasStatus_t st =
      cublasLtMatmul(ctx.handle, desc, &alpha, B, la.l, A, lb.l, &beta, C, lc.l, C, lc.l,
                     &heur.algo, ctx.workspace, kWorkspaceBytes, stream());
  cublasLtMatmulDescDestroy(desc);
  VIT_CUBLAS_CHECK(st);
  if (bias && !epilogue_bias) {
    add_bias_kernel<<<grid_stride_blocks(batch * M * N), kBlock, 0, stream()>>>(C, bias, M, N, ldc,
                                                                                stride_c, batch);
    VIT_CUDA_LAUNCHED();
  }
}

template void gemm<float, float>(bool, bool, Index, Index, Index, float, const float*, Index, Index,
                                 const float*, Index, Index, float, float*, Index, Index, Index,
                                 const float*);
template void gemm<bf16, bf16>(bool, bool, Index, Index, Index, float, const bf16*, Index, Index,
                               const bf16*, Index, Index, float, bf16*, Index, Index, Index,
                               const bf16*);
template void gemm<bf16, float>(bool, bool, Index, Index, Index, float, const bf16*, Index, Index,
                                const bf16*, Index, Index, float, float*, Index, Index, Index,
                                const float*);

}  // namespace vit::cuda
