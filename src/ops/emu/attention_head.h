// Shared by the emulated attention ops (attention.cpp, flash_attention.cpp): widening bf16
// buffers into reusable fp32 ones, and one (batch, head)'s views into the fp32 copies.
#pragma once
#include <vector>

#include "core/bf16.h"
#include "core/common.h"
#include "ops/emu/ops.h"

namespace vit::emu {

// buf resized to n and filled with src (n) widened (exact). thread_local buffers passed in
// here are reused from call to call.
inline float* widened(std::vector<float>& buf, const bf16* src, Index n) {
  buf.resize(size_t(n));
  convert(buf.data(), src, n);
  return buf.data();
}

// Head h of sample b: q, k, v (N, D) at row stride 3C in qkv (B, N, 3C); the same columns of
// dqkv when given; dO (N, D) at row stride C in dout (B, N, C) when given.
struct AttentionHead {
  const float *q, *k, *v;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const float* dO = nullptr;
  AttentionHead(const float* qkv, float* dqkv, const float* dout, Index b, Index h, Index N,
                Index H, Index D) {
    const Index C = H * D, at = b * N * 3 * C + h * D;
    q = qkv + at;
    k = q + C;
    v = q + 2 * C;
    if (dqkv) {
      dq = dqkv + at;
      dk = dq + C;
      dv = dq + 2 * C;
    }
    if (dout) dO = dout + b * N * C + h * D;
  }
};

}  // namespace vit::emu
