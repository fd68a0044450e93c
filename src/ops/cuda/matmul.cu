// Linear layers as cuBLASLt GEMMs (bias in the epilogue); the bias gradient is a
// deterministic column sum (on 16-byte packs where it can, elementwise.cuh). The Linear before a
// tanh GELU (the mlp_tanh FFN's fc1) has it in the GEMM's epilogues in bf16: forward, and in the
// backward of the Linear after it (fc2's data gradient). With VIT_SM90_GEMM on a Hopper, bf16
// Linears run on our own GEMM (gemm_sm90.h) instead, the exact GELU's forward and backward (and
// fc1's bias gradient) in its epilogues.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "ops/cuda/blas.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/gemm_sm90.h"
#include "ops/cuda/route_counts.h"

namespace vit::cuda {

namespace {

std::atomic<Index> g_sm90_gemms{0};

// Whether VIT_SM90_GEMM turns the sm_90a GEMM on for `kind` (fwd: the forward, dgrad: the data
// gradient, wgrad: the weight gradient; gelu: only the two GEMMs with a GELU epilogue, fc1's
// forward and fc2's data gradient, where the fusion saves a pass even if the kernel is slower
// than cuBLASLt): "1" for all, or a comma-separated list of kinds (a bench times each kind
// apart), off when unset, empty or "0...".
bool sm90_on(const char* kind) {
  const char* env = std::getenv("VIT_SM90_GEMM");
  if (!env || env[0] == '\0' || env[0] == '0') return false;
  if (std::strcmp(env, "1") == 0) return true;
  const std::string list = std::string(",") + env + ",";
  return list.find(std::string(",") + kind + ",") != std::string::npos;
}
// The same for a GEMM with a GELU epilogue: its kind, or `gelu`.
bool sm90_gelu_on(const char* kind) {
  return sm90_on(kind) || sm90_on("gelu");
}

// Whether the sm_90a kernel was enqueued; if it was, the launch is checked and counted.
bool sm90_ran(bool launched) {
  if (!launched) return false;
  VIT_CUDA_LAUNCHED();
  g_sm90_gemms.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// The bf16 GEMM on the sm_90a kernel (gemm_sm90.h): false (nothing enqueued) unless
// VIT_SM90_GEMM turns `kind` on, the device is a Hopper and the operands fit.
template <typename T>
bool sm90_gemm(const char* kind, const sm90::GemmOperands& g) {
  if constexpr (std::is_same_v<T, bf16>) {
    const bool on = g.pre || g.aux ? sm90_gelu_on(kind) : sm90_on(kind);
    return on && sm90_ran(sm90::gemm(g, stream()));
  }
  return false;
}

// out (M, Nout) = inp (M, K) @ weight (Nout, K)^T + bias, and with pre set, pre = that and
// out = gelu(pre).
template <typename T>
bool sm90_linear(T* out, T* pre, const T* inp, const T* weight, const T* bias, Index M, Index K,
                 Index Nout) {
  if constexpr (std::is_same_v<T, bf16>)
    return sm90_gemm<T>("fwd", {inp, K, weight, K, false, out, Nout, bias, pre, nullptr, nullptr,
                                nullptr, M, Nout, K});
  return false;
}

// dinp (M, K) = dout (M, Nout) @ weight (Nout, K), and with gelu_in set (the GELU's input
// before this Linear), dinp = gelu'(gelu_in) * that, with dbias (K, or null) += its column sums.
template <typename T>
bool sm90_linear_dinp(T* dinp, const T* gelu_in, float* dbias, const T* dout, const T* weight,
                      Index M, Index K, Index Nout) {
  if constexpr (std::is_same_v<T, bf16>) {
    sm90::GemmOperands g{dout,    Nout,    weight, K,       true, dinp, K,   nullptr,
                         nullptr, gelu_in, dbias,  nullptr, M,    K,    Nout};
    if (dbias)  // the blocks' column sums (ceil(M / 128), K) fp32
      g.workspace = static_cast<float*>(
          scratch(size_t(sm90::gemm_workspace_floats(g)) * sizeof(float), kScratchColsum));
    return sm90_gemm<T>("dgrad", g);
  }
  return false;
}

// dweight (Nout, K) += dout (M, Nout)^T @ inp (M, K), fp32, split over the M tokens.
template <typename T>
bool sm90_linear_dweight(float* dweight, const T* dout, const T* inp, Index M, Index K,
                         Index Nout) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (!sm90_on("wgrad") || !sm90::gemm_available()) return false;
    sm90::WgradOperands w{dout, Nout, inp, K, dweight, K, M, Nout, K, nullptr};
    w.workspace = static_cast<float*>(
        scratch(size_t(sm90::wgrad_workspace_floats(w)) * sizeof(float), kScratchGemmSplit));
    return sm90_ran(sm90::wgrad(w, stream()));
  }
  return false;
}

// VIT_BIAS_GRAD_EPILOGUE=1: the bf16 Linears' bias gradients in the weight gradient's GEMM
// (cuBLASLt's BGRADB epilogue, blas.cuh) instead of a column-sum pass over dout (38.7 MB a
// Linear at ViT-S/16 b256; the passes of qkv, proj and fc2 ~0.4-0.8 ms a step). Opt-in (written
// 2026-11-28 without a GPU) until a device says whether the epilogue slows the GEMM more.
bool bias_grad_epilogue() {
  return env_opt_in("VIT_BIAS_GRAD_EPILOGUE");
}

// dweight (Nout, K) += dout^T @ inp and dbias (Nout) += the column sums of dout through the
// GEMM's epilogue (the sums into a scratch vector, then added by the column sums' finishing
// kernel over one chunk); false, nothing enqueued, where it does not run.
template <typename T>
bool weight_and_bias_grad(float* dweight, float* dbias, const T* dout, const T* inp, Index M,
                          Index K, Index Nout) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (!bias_grad_epilogue()) return false;
    auto* sums = static_cast<float*>(scratch(size_t(Nout) * sizeof(float), kScratchBiasGrad));
    if (!gemm_weight_grad_bgrad<T>(Nout, K, M, dout, inp, dweight, sums)) return false;
    colsum_finish_kernel<float><<<blocks_for(Nout), kBlock, 0, stream()>>>(dbias, sums, 1, Nout);
    VIT_CUDA_LAUNCHED();
    count_route(Route::kBiasGradEpilogue);
    return true;
  }
  return false;
}

}  // namespace

Index sm90_gemm_count() {
  return g_sm90_gemms.load(std::memory_order_relaxed);
}

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, Index M, Index K,
                    Index Nout) {
  // out (M, Nout) = inp (M, K) @ weight (Nout, K)^T + bias (Nout)
  if (sm90_linear<T>(out, nullptr, inp, weight, bias, M, K, Nout)) return;
  gemm<T, T>(false, true, M, Nout, K, 1.0f, inp, K, 0, weight, K, 0, 0.0f, out, Nout, 0, 1, bias);
}

template <typename T>
void matmul_gelu_forward(T* act, T* pre, const T* inp, const T* weight, const T* bias, Index M,
                         Index K, Index Hid) {
  // pre (M, Hid) = inp (M, K) @ weight (Hid, K)^T + bias; act (M, Hid) = gelu(pre)
  if (!gelu_fast() && sm90_linear<T>(act, pre, inp, weight, bias, M, K, Hid)) return;
  matmul_forward(pre, inp, weight, bias, M, K, Hid);
  gelu_forward(act, static_cast<const T*>(pre), M * Hid);
}

template <typename T>
void matmul_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                     const T* weight, Index M, Index K, Index Nout) {
  // dinp (M, K) = dout (M, Nout) @ weight (Nout, K)
  if (dinp && !sm90_linear_dinp<T>(dinp, nullptr, nullptr, dout, weight, M, K, Nout))
    gemm<T, T>(false, false, M, K, Nout, 1.0f, dout, Nout, 0, weight, K, 0, 0.0f, dinp, K, 0);
  // dweight (Nout, K) += dout^T @ inp, straight into the fp32 gradient (beta = 1), with dbias's
  // sums in its epilogue where VIT_BIAS_GRAD_EPILOGUE asks
  if (dweight && dbias && !sm90_on("wgrad") &&
      weight_and_bias_grad<T>(dweight, dbias, dout, inp, M, K, Nout))
    return;
  if (dweight && !sm90_linear_dweight<T>(dweight, dout, inp, M, K, Nout))
    gemm<T, float>(true, false, Nout, K, M, 1.0f, dout, Nout, 0, inp, K, 0, 1.0f, dweight, K, 0);
  // dbias (Nout) += column sums of dout
  if (dbias) colsum_rows_accumulate(dbias, dout, M, Nout);
}

template <typename T>
void matmul_gelu_backward(T* dpre, float* dpre_bias, float* dweight, float* dbias, T* dact,
                          const T* dout, const T* act, const T* pre, const T* weight, Index M,
                          Index Hid, Index Nout) {
  // dweight (Nout, Hid) += dout (M, Nout)^T @ act (M, Hid); dbias (Nout) += column sums of dout
  matmul_backward<T>(nullptr, dweight, dbias, dout, act, weight, M, Hid, Nout);
  // dpre (M, Hid) = gelu'(pre) * bf16(dout @ weight) in the GEMM's epilogue, and fc1's bias
  // gradient from the stored dpre's column sums, per row block in the epilogue too
  if (!gelu_fast() && sm90_linear_dinp<T>(dpre, pre, dpre_bias, dout, weight, M, Hid, Nout)) return;
  matmul_backward<T>(dact, nullptr, nullptr, dout, act, weight, M, Hid, Nout);
  gelu_backward_bias(dpre, dpre_bias, static_cast<const T*>(dact), pre, M, Hid);
}

namespace {

// The GELU epilogues (bf16 only) unless VIT_GELU_EPILOGUE=0 (the separate ops, for the bench).
bool gelu_epilogue_on() {
  return env_switch_on("VIT_GELU_EPILOGUE");
}

__global__ void accumulate_bf16_kernel(float* dst, const bf16* src, Index n) {
  // dst (n) += src (n)
  VIT_GRID_STRIDE(i, n) dst[i] += __bfloat162float(src[i]);
}

}  // namespace

template <typename T>
void matmul_gelu_tanh_forward(T* act, T* pre, const T* inp, const T* weight, const T* bias, Index M,
                              Index K, Index Hid) {
  // pre (M, Hid) = inp (M, K) @ weight (Hid, K)^T + bias; act (M, Hid) = gelu_tanh(pre)
  if constexpr (std::is_same_v<T, bf16>) {
    if (gelu_epilogue_on() &&
        gemm_gelu_tanh_aux<T>(true, M, Hid, K, inp, K, weight, K, act, Hid, bias, pre, Hid))
      return;
  }
  matmul_forward(pre, inp, weight, bias, M, K, Hid);
  gelu_tanh_forward(act, static_cast<const T*>(pre), M * Hid);
}

template <typename T>
void matmul_gelu_tanh_backward(T* dpre, float* dpre_bias, float* dweight, float* dbias, T* dact,
                               const T* dout, const T* act, const T* pre, const T* weight, Index M,
                               Index Hid, Index Nout) {
  if (M <= 0 || Hid <= 0) return;  // nothing to add (the epilogue would leave its sums unwritten)
  // dweight (Nout, Hid) += dout (M, Nout)^T @ act (M, Hid); dbias (Nout) += column sums of dout
  matmul_backward<T>(nullptr, dweight, dbias, dout, act, weight, M, Hid, Nout);
  if constexpr (std::is_same_v<T, bf16>) {
    // dpre (M, Hid) = gelu_tanh'(pre) * (dout @ weight (Nout, Hid)) in the GEMM's epilogue, with
    // its column sums in T (Hid, in scratch), added to the fp32 gradient
    if (gelu_epilogue_on()) {
      auto* sums = static_cast<T*>(scratch(size_t(Hid) * sizeof(T), kScratchGeluBiasGrad));
      if (gemm_dgelu_tanh_bgrad<T>(false, M, Hid, Nout, dout, Nout, weight, Hid, dpre, Hid, pre,
                                   Hid, sums)) {
        if (dpre_bias) {
          accumulate_bf16_kernel<<<grid_stride_blocks(Hid), kBlock, 0, stream()>>>(dpre_bias, sums,
                                                                                   Hid);
          VIT_CUDA_LAUNCHED();
        }
        return;
      }
    }
  }
  // The separate ops: d(act) (M, Hid) into dact, then the GELU's backward with the bias sums.
  matmul_backward<T>(dact, nullptr, nullptr, dout, act, weight, M, Hid, Nout);
  gelu_tanh_backward_bias(dpre, dpre_bias, static_cast<const T*>(dact), pre, M, Hid);
}

#define INSTANTIATE(T)                                                                             \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, Index, Index, Index);          \
  template void matmul_backward<T>(T*, float*, float*, const T*, const T*, const T*, Index, Index, \
                                   Index);                                                         \
  template void matmul_gelu_forward<T>(T*, T*, const T*, const T*, const T*, Index, Index, Index); \
  template void matmul_gelu_backward<T>(T*, float*, float*, float*, T*, const T*, const T*,        \
                                        const T*, const T*, Index, Index, Index);                  \
  template void matmul_gelu_tanh_forward<T>(T*, T*, const T*, const T*, const T*, Index, Index,    \
                                            Index);                                                \
  template void matmul_gelu_tanh_backward<T>(T*, float*, float*, float*, T*, const T*, const T*,   \
                                             const T*, const T*, Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
