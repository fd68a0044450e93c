// Linear layers as cuBLASLt GEMMs (bias in the epilogue); the bias gradient is a
// deterministic column sum (on 16-byte packs where it can, elementwise.cuh).
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

#define INSTANTIATE(T)                                                                             \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, Index, Index, Index);          \
  template void matmul_backward<T>(T*, float*, float*, const T*, const T*, const T*, Index, Index, \
                                   Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
