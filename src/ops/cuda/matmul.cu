// Linear layers as cuBLASLt GEMMs (bias in the epilogue); the bias gradient is a
// deterministic column sum (on 16-byte packs where it can, elementwise.cuh). The Linear before a
// tanh GELU (the mlp_tanh FFN's fc1) has it in the GEMM's epilogues in bf16: forward, and in the
// backward of the Linear after it (fc2's data gradient).
#include <type_traits>

#include "ops/cuda/blas.cuh"
#include "ops/cuda/elementwise.cuh"

namespace vit::cuda {

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, Index M, Index K,
                    Index Nout) {
  // out (M, Nout) = inp (M, K) @ weight (Nout, K)^T + bias (Nout)
  gemm<T, T>(false, true, M, Nout, K, 1.0f, inp, K, 0, weight, K, 0, 0.0f, out, Nout, 0, 1, bias);
}

template <typename T>
void matmul_gelu_forward(T* act, T* pre, const T* inp, const T* weight, const T* bias, Index M,
                         Index K, Index Hid) {
  // pre (M, Hid) = inp (M, K) @ weight (Hid, K)^T + bias; act (M, Hid) = gelu(pre)
  matmul_forward(pre, inp, weight, bias, M, K, Hid);
  gelu_forward(act, static_cast<const T*>(pre), M * Hid);
}

template <typename T>
void matmul_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                     const T* weight, Index M, Index K, Index Nout) {
  // dinp (M, K) = dout (M, Nout) @ weight (Nout, K)
  if (dinp)
    gemm<T, T>(false, false, M, K, Nout, 1.0f, dout, Nout, 0, weight, K, 0, 0.0f, dinp, K, 0);
  // dweight (Nout, K) += dout^T @ inp, straight into the fp32 gradient (beta = 1)
  if (dweight)
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
  // dpre (M, Hid) = gelu'(pre) * d(act), and fc1's bias gradient from dpre's column sums
  matmul_backward<T>(dact, nullptr, nullptr, dout, act, weight, M, Hid, Nout);
  gelu_backward_bias(dpre, dpre_bias, static_cast<const T*>(dact), pre, M, Hid);
}

namespace {

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
    if (gemm_gelu_tanh_aux<T>(true, M, Hid, K, inp, K, weight, K, act, Hid, bias, pre, Hid)) return;
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
    auto* sums = static_cast<T*>(scratch(size_t(Hid) * sizeof(T), kScratchGeluBiasGrad));
    if (gemm_dgelu_tanh_bgrad<T>(false, M, Hid, Nout, dout, Nout, weight, Hid, dpre, Hid, pre, Hid,
                                 sums)) {
      if (dpre_bias) {
        accumulate_bf16_kernel<<<grid_stride_blocks(Hid), kBlock, 0, stream()>>>(dpre_bias, sums,
                                                                                 Hid);
        VIT_CUDA_LAUNCHED();
      }
      return;
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
