// The work of the model's op calls, for the op profile's rates (core/profile.h): GEMM flops
// (a multiply-add is 2) and the bytes an op must move at least (each input read once, each
// output written once; accumulated outputs read and written). S is the storage type, R the
// residual stream's (S, or fp32 with --fp32-residual); gradients and statistics are 4-byte fp32.
#pragma once
#include "core/common.h"
#include "core/profile.h"

namespace vit {

template <class S, class R = S>
struct ModelOpWork {
  static constexpr double kS = sizeof(S), kR = sizeof(R);
  // out (M, N) = inp (M, K) @ W (N, K)^T + b.
  static OpWork matmul_forward(Index M, Index K, Index N) {
    return {2.0 * M * K * N, kS * double(M * K + N * K + M * N)};
  }
  // dinp (M, K) = dout W (skipped without dinp) and dW (N, K) += dout^T inp, fp32.
  static OpWork matmul_backward(Index M, Index K, Index N, bool dinp = true) {
    const double products = dinp ? 2.0 : 1.0;
    return {2.0 * products * M * K * N,
            kS * double(M * N + (dinp ? 2 : 1) * M * K + N * K) + 8.0 * double(N * K)};
  }
  // `tensors` tensors of n elements, each read or written once.
  static OpWork elementwise(Index n, int tensors) { return {0.0, kS * double(n) * tensors}; }
  // The same where `stream` of the tensors are the residual stream (or its gradient) and
  // `others` are activations.
  static OpWork stream(Index n, int stream, int others) {
    return {0.0, (kR * stream + kS * others) * double(n)};
  }
  // The attention core over (B, H) heads of N tokens and head dim D: S = Q K^T and P V are
  // 2 B H N^2 D flops each. The backward has four such products (dV, dP, dQ, dK), the fused one
  // a fifth (it recomputes S). Bytes: qkv and out or dqkv and dout (B, N, C) tensors, plus
  // the probabilities (B, H, N, N) when they are stored (unfused) or the fp32 lse (fused).
  static OpWork attention(Index B, Index N, Index H, Index D, int products, int bnc_tensors,
                          bool fused) {
    const double heads = double(B * H), bnc = double(B * N * H * D);
    const double state = fused ? 4.0 * heads * N : kS * heads * N * N;
    return {2.0 * products * heads * N * N * D, kS * bnc * bnc_tensors + state};
  }
  // Depthwise 3x3 over the (B, gh * gw, M) grid: 9 multiply-adds per output; the backward
  // twice that (dinp and dweight).
  static OpWork dwconv(Index B, Index grid_tokens, Index M, int products, int tensors) {
    const double n = double(B * grid_tokens * M);
    return {2.0 * 9 * products * n, kS * n * tensors};
  }
};

}  // namespace vit
