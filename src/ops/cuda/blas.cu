// cuBLASLt GEMM: one handle and one workspace for the process, a row-major front end, and a
// cache of the descriptors, layouts and heuristic choice per distinct GEMM (a ViT step makes
// hundreds of calls over a few dozen shapes; building them costs tens of microseconds a call).
#include <cublasLt.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ops/cuda/blas.cuh"
#include "ops/cuda/device.h"

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
// The bias epilogue reads the vector with wide loads: a less aligned bias is copied first.
constexpr uint32_t kBiasAlign = 16;

// Owners of cuBLASLt's opaque objects, so a call that throws between create and destroy (or a
// failed cache insert) cannot leak them.
struct DescDeleter {
  void operator()(cublasLtMatmulDesc_t p) const noexcept { cublasLtMatmulDescDestroy(p); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t p) const noexcept { cublasLtMatrixLayoutDestroy(p); }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreference_t p) const noexcept {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using DescPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DescDeleter>;
using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using PrefPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PrefDeleter>;

template <typename V>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v) {
  VIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)));
}
template <typename V>
void set_attr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const V& v) {
  VIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, a, &v, sizeof(v)));
}
template <typename V>
void set_attr(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const V& v) {
  VIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, a, &v, sizeof(v)));
}

// Everything that shapes the descriptors, layouts, preferences or the heuristic's choice, in
// the caller's row-major naming. Strides are 0 when batch == 1 (they are then ignored).
struct GemmKey {
  int tab, tc;  // cudaDataType_t of A/B and of C/D
  bool trans_a, trans_b;
  Index M, N, K, lda, ldb, ldc;
  Index batch, stride_a, stride_b, stride_c;
  uint32_t al_a, al_b, al_c;  // pointer (and batch stride) alignment in bytes, <= 256
  uint32_t al_bias;           // 0: no bias (or bias gradient) vector
  uint32_t beta_bits;         // beta == 0 lets cuBLASLt skip reading C
  int epilogue;               // cublasLtEpilogue_t
  Index ld_aux;               // the GELU epilogues' aux matrix (M, ld_aux); 0 without
  uint32_t al_aux;

  auto tie() const {
    return std::tie(tab, tc, trans_a, trans_b, M, N, K, lda, ldb, ldc, batch, stride_a, stride_b,
                    stride_c, al_a, al_b, al_c, al_bias, beta_bits, epilogue, ld_aux, al_aux);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

// A call's epilogue operands: the bias (input, N) or bias gradient (output, N), and the GELU
// epilogues' aux matrix (M, ld_aux): the pre-activation, written forward and read backward.
struct GemmExtras {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
  Index ld_aux = 0;
};

// One distinct GEMM, ready to run: has_algo == false sends it to the fallback kernel.
struct GemmPlan {
  DescPtr desc;
  LayoutPtr la, lb, lc;  // cuBLASLt's A (our B), B (our A), and C = D
  cublasLtMatmulHeuristicResult_t heur{};
  bool has_algo = false;
};

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // (kWorkspaceBytes), shared by every GEMM on stream()
  std::mutex mu;              // guards plans and each plan's bias pointer until its matmul
  std::map<GemmKey, GemmPlan> plans;

  Lt() = default;
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;
  ~Lt() {  // runs only when creation fails half-way; the process-wide one is never destroyed
    device_free(workspace);
    if (handle) cublasLtDestroy(handle);
  }
};

// Created on first use and kept for the process (the driver frees it at exit; destroying it
// from a static destructor could run after the CUDA runtime has shut down).
Lt& lt() {
  static Lt* s = [] {
    auto p = std::make_unique<Lt>();
    VIT_CUBLAS_CHECK(cublasLtCreate(&p->handle));
    p->workspace = device_alloc(kWorkspaceBytes);  // counted in the reported peak
    return p.release();
  }();
  return *s;
}

std::atomic<Index> g_fallbacks{0};
std::atomic<Index> g_epilogue_misses{0};

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

// (rows, cols) column-major with leading dimension ld, strided-batched when batch > 1.
LayoutPtr make_layout(cudaDataType_t type, Index rows, Index cols, Index ld, Index batch,
                      Index stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  VIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, type, uint64_t(rows), uint64_t(cols), ld));
  LayoutPtr l(raw);
  if (batch > 1) {
    set_attr(l.get(), CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(batch));
    set_attr(l.get(), CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t(stride));
  }
  return l;
}

// fp32 compute and scale: never TF32, so the fp32 mode matches the CPU reference to ~1e-6.
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our B and
// its B our A, each with its own transpose flag (as cblas does for CblasRowMajor).
DescPtr make_desc(const GemmKey& k, const GemmExtras& ex) {
  cublasLtMatmulDesc_t raw = nullptr;
  VIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DescPtr d(raw);
  set_attr(d.get(), CUBLASLT_MATMUL_DESC_TRANSA, k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attr(d.get(), CUBLASLT_MATMUL_DESC_TRANSB, k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (k.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    set_attr(d.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, cublasLtEpilogue_t(k.epilogue));
  // bias (N) runs along the rows of C^T; its type is C's (the default); the heuristic reads
  // the pointer's alignment, hence al_bias in the key. The same for the aux matrix, which is
  // C^T's shape with its own leading dimension.
  if (k.al_bias) set_attr(d.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, ex.bias);
  if (k.al_aux) {
    set_attr(d.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ex.aux);
    set_attr(d.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(k.ld_aux));
  }
  return d;
}

PrefPtr make_pref(const GemmKey& k) {
  cublasLtMatmulPreference_t raw = nullptr;
  VIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw));
  PrefPtr p(raw);
  set_attr(p.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
  // Split-K partial sums only in fp32 (the compute type): an in-place or output-type reduction
  // would round bf16 outputs once per partial instead of once.
  set_attr(p.get(), CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
           uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  set_attr(p.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.al_b);  // cuBLASLt's A = our B
  set_attr(p.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.al_a);
  set_attr(p.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.al_c);
  set_attr(p.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.al_c);
  return p;
}

// An epilogue the caller can do without (the GELU ones): where cuBLASLt refuses it, the call
// returns false and the caller runs separate ops.
bool optional_epilogue(const GemmKey& k) {
  return k.al_aux;
}

void report_no_algo(const GemmKey& k, cublasStatus_t st) {
  std::fprintf(stderr,
               "vitrain: cuBLASLt has no algorithm (%s) for GEMM M=%lld N=%lld K=%lld "
               "lda=%lld ldb=%lld ldc=%lld batch=%lld align A/B/C/bias=%u/%u/%u/%u epilogue %d; "
               "using %s (reported once per shape)\n",
               cublasLtGetStatusString(st), (long long)k.M, (long long)k.N, (long long)k.K,
               (long long)k.lda, (long long)k.ldb, (long long)k.ldc, (long long)k.batch, k.al_a,
               k.al_b, k.al_c, k.al_bias, k.epilogue,
               optional_epilogue(k) ? "the GEMM and the epilogue's work as separate ops"
                                    : "the fallback kernel");
}

// Descriptors, layouts and the heuristic's first choice for `k`. "Not supported" (or nothing
// found) is a plan too, without an algorithm; any other status is a bug and throws.
GemmPlan build_plan(const Lt& ctx, const GemmKey& k, const GemmExtras& ex) {
  GemmPlan plan;
  const auto tab = cudaDataType_t(k.tab), tc = cudaDataType_t(k.tc);
  // Column-major shapes as stored (before op): B is (N, K) or (K, N); A is (K, M) or (M, K).
  plan.la =
      make_layout(tab, k.trans_b ? k.K : k.N, k.trans_b ? k.N : k.K, k.ldb, k.batch, k.stride_b);
  plan.lb =
      make_layout(tab, k.trans_a ? k.M : k.K, k.trans_a ? k.K : k.M, k.lda, k.batch, k.stride_a);
  plan.lc = make_layout(tc, k.N, k.M, k.ldc, k.batch, k.stride_c);
  plan.desc = make_desc(k, ex);
  const PrefPtr pref = make_pref(k);
  int found = 0;
  // The heuristic's first algorithm only: timing its other candidates paid nothing on the device
  // and may change a GEMM's bits (an algorithm that splits K sums in another order).
  std::vector<cublasLtMatmulHeuristicResult_t> results(1);
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      ctx.handle, plan.desc.get(), plan.la.get(), plan.lb.get(), plan.lc.get(), plan.lc.get(),
      pref.get(), int(results.size()), results.data(), &found);
  // An epilogue the library refuses in any way (the GELU ones) runs as separate ops instead.
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && !optional_epilogue(k))
    VIT_CUBLAS_CHECK(st);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) plan.heur = results[0];
  plan.has_algo = st == CUBLAS_STATUS_SUCCESS && found > 0 &&
                  plan.heur.state == CUBLAS_STATUS_SUCCESS &&
                  plan.heur.workspaceSize <= kWorkspaceBytes;
  if (!plan.has_algo) report_no_algo(k, st == CUBLAS_STATUS_SUCCESS ? plan.heur.state : st);
  return plan;
}

// The plan for `k`, built on first use (caller holds ctx.mu).
GemmPlan& plan_for(Lt& ctx, const GemmKey& k, const GemmExtras& ex) {
  auto it = ctx.plans.find(k);
  if (it == ctx.plans.end()) it = ctx.plans.emplace(k, build_plan(ctx, k, ex)).first;
  return it->second;
}

// Row-major operands must fit their leading dimensions; cuBLASLt would only say "invalid value".
void check_lds(bool trans_a, bool trans_b, Index M, Index N, Index K, Index lda, Index ldb,
               Index ldc) {
  VIT_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
            "cuda::gemm: a leading dimension is smaller than its row");
}

// bias (N) itself when 16-byte aligned, else a copy in an aligned scratch slot (enqueued on
// stream(), so the GEMM that follows reads it in order).
template <typename TC>
const TC* epilogue_bias(const TC* bias, Index N) {
  if (!bias || alignment(bias, 0, 1) >= kBiasAlign) return bias;
  auto* copy = static_cast<TC*>(scratch(size_t(N) * sizeof(TC), kScratchGemmBias));
  VIT_CUDA_CHECK(
      cudaMemcpyAsync(copy, bias, size_t(N) * sizeof(TC), cudaMemcpyDeviceToDevice, stream()));
  return copy;
}

// Plain SIMT GEMM, one thread per output element, fp32 accumulation: the fallback when
// cuBLASLt offers no algorithm (gemm_simt). Rounds to TC once, after alpha, beta * C and the
// bias, as the cuBLASLt epilogue does.
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

uint32_t float_bits(float x) {
  uint32_t u;
  static_assert(sizeof(u) == sizeof(x));
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

}  // namespace

Index gemm_fallback_count() {
  return g_fallbacks.load();
}
Index gelu_epilogue_miss_count() {
  return g_epilogue_misses.load();
}
void reset_gemm_fallback_count() {
  g_fallbacks.store(0);
  g_epilogue_misses.store(0);
}

namespace {

// The key of a call (its shapes, types, alignments and epilogue).
template <typename TAB, typename TC>
GemmKey make_key(bool trans_a, bool trans_b, Index M, Index N, Index K, const TAB* A, Index lda,
                 Index stride_a, const TAB* B, Index ldb, Index stride_b, float beta, TC* C,
                 Index ldc, Index stride_c, Index batch, const GemmExtras& ex) {
  GemmKey key{};
  key.tab = data_type<TAB>();
  key.tc = data_type<TC>();
  key.trans_a = trans_a;
  key.trans_b = trans_b;
  key.M = M;
  key.N = N;
  key.K = K;
  key.lda = lda;
  key.ldb = ldb;
  key.ldc = ldc;
  key.batch = batch;
  key.stride_a = stride_a;
  key.stride_b = stride_b;
  key.stride_c = stride_c;
  key.al_a = alignment(A, stride_a * Index(sizeof(TAB)), batch);
  key.al_b = alignment(B, stride_b * Index(sizeof(TAB)), batch);
  key.al_c = alignment(C, stride_c * Index(sizeof(TC)), batch);
  key.al_bias = ex.bias ? alignment(ex.bias, 0, 1) : 0u;
  key.beta_bits = float_bits(beta);
  key.epilogue = int(ex.epilogue);
  key.ld_aux = ex.aux ? ex.ld_aux : 0;
  key.al_aux = ex.aux ? alignment(ex.aux, 0, 1) : 0u;
  return key;
}

// Runs the GEMM through cuBLASLt with the epilogue of `ex`; false (nothing enqueued) where
// cuBLASLt has no algorithm for it.
template <typename TAB, typename TC>
bool gemm_lt(bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const TAB* A,
             Index lda, Index stride_a, const TAB* B, Index ldb, Index stride_b, float beta, TC* C,
             Index ldc, Index stride_c, Index batch, const GemmExtras& ex) {
  const GemmKey key = make_key(trans_a, trans_b, M, N, K, A, lda, stride_a, B, ldb, stride_b, beta,
                               C, ldc, stride_c, batch, ex);
  Lt& ctx = lt();
  std::lock_guard<std::mutex> lock(ctx.mu);
  GemmPlan& plan = plan_for(ctx, key, ex);
  if (!plan.has_algo) return false;
  // The per-call attributes: the bias and aux addresses (same alignment as when the plan was
  // built).
  if (ex.bias) set_attr(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, ex.bias);
  if (ex.aux) set_attr(plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ex.aux);
  const cublasStatus_t st = cublasLtMatmul(
      ctx.handle, plan.desc.get(), &alpha, B, plan.la.get(), A, plan.lb.get(), &beta, C,
      plan.lc.get(), C, plan.lc.get(), &plan.heur.algo, ctx.workspace, kWorkspaceBytes, stream());
  if (st != CUBLAS_STATUS_SUCCESS && optional_epilogue(key) &&
      (st == CUBLAS_STATUS_INVALID_VALUE || st == CUBLAS_STATUS_NOT_SUPPORTED)) {
    // An optional epilogue refused at launch (nothing enqueued): this shape runs as separate
    // ops from now on.
    report_no_algo(key, st);
    plan.has_algo = false;
    return false;
  }
  VIT_CUBLAS_CHECK(st);
  return true;
}

// The GELU epilogues' aux matrix must have a leading dimension divisible by 8 (cuBLASLt).
bool gelu_epilogue_fits(Index ld_aux, Index N) {
  return ld_aux % 8 == 0 && ld_aux >= N;
}

}  // namespace

template <typename TAB, typename TC>
void gemm_simt(bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const TAB* A,
               Index lda, Index stride_a, const TAB* B, Index ldb, Index stride_b, float beta,
               TC* C, Index ldc, Index stride_c, Index batch, const TC* bias) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  if (batch == 1) stride_a = stride_b = stride_c = 0;
  gemm_fallback_kernel<<<grid_stride_blocks(batch * M * N), kBlock, 0, stream()>>>(
      trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c,
      batch, bias);
  VIT_CUDA_LAUNCHED();
}

template <typename TAB, typename TC>
void gemm(bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const TAB* A,
          Index lda, Index stride_a, const TAB* B, Index ldb, Index stride_b, float beta, TC* C,
          Index ldc, Index stride_c, Index batch, const TC* bias) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  VIT_CHECK(K > 0, "cuda::gemm: K must be positive");
  check_lds(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (batch == 1) stride_a = stride_b = stride_c = 0;
  GemmExtras ex;
  ex.bias = epilogue_bias(bias, N);
  if (ex.bias) ex.epilogue = CUBLASLT_EPILOGUE_BIAS;
  if (!gemm_lt(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
               stride_c, batch, ex)) {
    ++g_fallbacks;
    gemm_simt(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
              stride_c, batch, bias);
  }
}

namespace {

// One GEMM with an optional epilogue (C = op(A) @ op(B) + beta C, alpha 1, not batched; the
// epilogue operands of `ex`): false where it does not run, counted as a miss (the caller then
// runs separate ops).
template <typename TAB, typename TC>
bool gemm_optional_epilogue(bool trans_a, bool trans_b, Index M, Index N, Index K, const TAB* A,
                            Index lda, const TAB* B, Index ldb, float beta, TC* C, Index ldc,
                            const GemmExtras& ex, bool operands_fit) {
  check_lds(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  const bool ran = operands_fit && gemm_lt(trans_a, trans_b, M, N, K, 1.0f, A, lda, 0, B, ldb, 0,
                                           beta, C, ldc, 0, 1, ex);
  if (!ran) ++g_epilogue_misses;
  return ran;
}

}  // namespace

template <typename T>
bool gemm_gelu_tanh_aux(bool trans_b, Index M, Index N, Index K, const T* A, Index lda, const T* B,
                        Index ldb, T* C, Index ldc, const T* bias, T* aux, Index ld_aux) {
  if (M <= 0 || N <= 0) return true;
  VIT_CHECK(K > 0 && bias && aux, "cuda::gemm_gelu_tanh_aux: K > 0, a bias and aux");
  GemmExtras ex;
  ex.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  ex.bias = epilogue_bias(bias, N);
  ex.aux = aux;
  ex.ld_aux = ld_aux;
  return gemm_optional_epilogue(false, trans_b, M, N, K, A, lda, B, ldb, 0.0f, C, ldc, ex,
                                gelu_epilogue_fits(ld_aux, N));
}

template <typename T>
bool gemm_dgelu_tanh_bgrad(bool trans_b, Index M, Index N, Index K, const T* A, Index lda,
                           const T* B, Index ldb, T* C, Index ldc, const T* aux, Index ld_aux,
                           T* dbias) {
  if (M <= 0 || N <= 0) return true;
  VIT_CHECK(K > 0 && aux && dbias, "cuda::gemm_dgelu_tanh_bgrad: K > 0, aux and a bias gradient");
  GemmExtras ex;
  ex.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
  ex.bias = dbias;  // an output here: written by the epilogue, so it cannot be a copy
  ex.aux = aux;
  ex.ld_aux = ld_aux;
  return gemm_optional_epilogue(
      false, trans_b, M, N, K, A, lda, B, ldb, 0.0f, C, ldc, ex,
      alignment(dbias, 0, 1) >= kBiasAlign && gelu_epilogue_fits(ld_aux, N));
}

#define INSTANTIATE_SIMT(TAB, TC)                                                             \
  template void gemm_simt<TAB, TC>(bool, bool, Index, Index, Index, float, const TAB*, Index, \
                                   Index, const TAB*, Index, Index, float, TC*, Index, Index, \
                                   Index, const TC*);
INSTANTIATE_SIMT(float, float)
INSTANTIATE_SIMT(bf16, bf16)
INSTANTIATE_SIMT(bf16, float)
template void gemm<float, float>(bool, bool, Index, Index, Index, float, const float*, Index, Index,
                                 const float*, Index, Index, float, float*, Index, Index, Index,
                                 const float*);
template void gemm<bf16, bf16>(bool, bool, Index, Index, Index, float, const bf16*, Index, Index,
                               const bf16*, Index, Index, float, bf16*, Index, Index, Index,
                               const bf16*);
template void gemm<bf16, float>(bool, bool, Index, Index, Index, float, const bf16*, Index, Index,
                                const bf16*, Index, Index, float, float*, Index, Index, Index,
                                const float*);
template bool gemm_gelu_tanh_aux<bf16>(bool, Index, Index, Index, const bf16*, Index, const bf16*,
                                       Index, bf16*, Index, const bf16*, bf16*, Index);
template bool gemm_dgelu_tanh_bgrad<bf16>(bool, Index, Index, Index, const bf16*, Index,
                                          const bf16*, Index, bf16*, Index, const bf16*, Index,
                                          bf16*);

}  // namespace vit::cuda
