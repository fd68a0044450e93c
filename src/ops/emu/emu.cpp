// The generic bf16 emulation ops: widen every bf16 input to fp32 scratch, run the fp32 CPU
// reference op, write fp32 outputs (gradients, statistics, losses) straight through and round
// each bf16 output once. That is where the CUDA kernels of these ops round: each computes an
// output element in fp32 registers and stores it with one __float2bfloat16_rn. Outputs that
// accumulate into bf16 (LayerNorm's dinp, pooling's dx) are widened first, so the CPU op adds
// its fp32 share to the old value and the sum is rounded once, as the kernels do.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops/emu/ops.h"

namespace vit::emu {

namespace {

// Below this many elements a conversion stays on one thread (a parallel region costs more).
constexpr Index kParallelMin = Index(1) << 15;

// Per-thread fp32 scratch, reused from call to call (the model repeats the same shapes every
// step, so after the first step nothing is allocated). An op takes buffers in order through a
// Frame; they go back to the pool when the Frame ends. The inner vectors never move their
// storage when the pool grows, so earlier buffers of the same Frame stay valid.
struct Pool {
  std::vector<std::vector<float>> bufs;
  size_t top = 0;  // buffers in use
};
Pool& pool() {
  thread_local Pool p;
  return p;
}

class Frame {
 public:
  Frame() : base_(pool().top) {}
  ~Frame() { pool().top = base_; }
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  // Uninitialised fp32 buffer of n values.
  float* get(Index n) {
    Pool& p = pool();
    if (p.top == p.bufs.size()) p.bufs.emplace_back();
    std::vector<float>& v = p.bufs[p.top++];
    if (v.size() < size_t(n)) v.resize(size_t(n));
    return v.data();
  }
  // fp32 copy of src (n) (exact); nullptr stays nullptr (optional inputs such as the bias).
  const float* widen(const bf16* src, Index n) {
    if (!src) return nullptr;
    float* d = get(n);
    convert(d, src, n);
    return d;
  }
  // An fp32 input (the fp32 residual stream) is read where it is.
  const float* widen(const float* src, Index /*n*/) { return src; }
  // Where an op computes an output in fp32 before it is stored in dst (n): scratch for a bf16
  // dst (rounded once by the store), dst itself when it is fp32 (the stream: nothing to round,
  // and the store from it is a no-op).
  float* fp32_of(bf16* /*dst*/, Index n) { return get(n); }
  float* fp32_of(float* dst, Index /*n*/) { return dst; }

 private:
  size_t base_;
};

using UnaryOp = void (*)(float*, const float*, Index);
using BinaryOp = void (*)(float*, const float*, const float*, Index);

// out (n) = op(inp (n)): the elementwise forwards.
void unary(UnaryOp op, bf16* out, const bf16* inp, Index n) {
  Frame f;
  const float* inp32 = f.widen(inp, n);  // (n)
  float* out32 = f.get(n);               // (n)
  op(out32, inp32, n);
  convert(out, out32, n);
}

// dinp (n) = op(dout (n), inp (n)): the elementwise backwards.
void binary(BinaryOp op, bf16* dinp, const bf16* dout, const bf16* inp, Index n) {
  Frame f;
  const float* dout32 = f.widen(dout, n);  // (n)
  const float* inp32 = f.widen(inp, n);    // (n)
  float* dinp32 = f.get(n);                // (n)
  op(dinp32, dout32, inp32, n);
  convert(dinp, dinp32, n);
}

}  // namespace

void convert(bf16* dst, const float* src, Index n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (Index i = 0; i < n; ++i) dst[i] = bf16(src[i]);
}

void convert(float* dst, const bf16* src, Index n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (Index i = 0; i < n; ++i) dst[i] = float(src[i]);
}

void convert(float* dst, const float* src, Index n) {
  if (dst != src && n > 0) std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, Index M,
                    Index K, Index Nout) {
  // The bias joins the fp32 GEMM result before the one rounding (cuBLASLt's bias epilogue).
  Frame f;
  const float* inp32 = f.widen(inp, M * K);      // (M, K)
  const float* w32 = f.widen(weight, Nout * K);  // (Nout, K)
  const float* b32 = f.widen(bias, Nout);        // (Nout) or nullptr
  float* out32 = f.get(M * Nout);                // (M, Nout)
  cpu::matmul_forward(out32, inp32, w32, b32, M, K, Nout);
  convert(out, out32, M * Nout);
}

void matmul_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                     const bf16* weight, Index M, Index K, Index Nout) {
  Frame f;
  const float* dout32 = f.widen(dout, M * Nout);                  // (M, Nout)
  const float* inp32 = dweight ? f.widen(inp, M * K) : nullptr;   // (M, K)
  const float* w32 = dinp ? f.widen(weight, Nout * K) : nullptr;  // (Nout, K)
  float* dinp32 = dinp ? f.get(M * K) : nullptr;                  // (M, K)
  cpu::matmul_backward(dinp32, dweight, dbias, dout32, inp32, w32, M, K, Nout);
  if (dinp) convert(dinp, dinp32, M * K);
}

void matmul_gelu_tanh_forward(bf16* act, bf16* pre, const bf16* inp, const bf16* weight,
                              const bf16* bias, Index M, Index K, Index Hid) {
  Frame f;
  const float* inp32 = f.widen(inp, M * K);     // (M, K)
  const float* w32 = f.widen(weight, Hid * K);  // (Hid, K)
  const float* b32 = f.widen(bias, Hid);        // (Hid) or nullptr
  float* pre32 = f.get(M * Hid);                // (M, Hid)
  float* act32 = f.get(M * Hid);                // (M, Hid)
  cpu::matmul_forward(pre32, inp32, w32, b32, M, K, Hid);
  cpu::gelu_tanh_forward(act32, static_cast<const float*>(pre32), M * Hid);
  convert(pre, pre32, M * Hid);
  convert(act, act32, M * Hid);
}

void matmul_gelu_tanh_backward(bf16* dpre, float* dpre_bias, float* dweight, float* dbias,
                               bf16* /*dact*/, const bf16* dout, const bf16* act, const bf16* pre,
                               const bf16* weight, Index M, Index Hid, Index Nout) {
  matmul_backward(nullptr, dweight, dbias, dout, act, weight, M, Hid, Nout);
  Frame f;
  const float* dout32 = f.widen(dout, M * Nout);   // (M, Nout)
  const float* w32 = f.widen(weight, Nout * Hid);  // (Nout, Hid)
  const float* pre32 = f.widen(pre, M * Hid);      // (M, Hid)
  float* prod32 = f.get(M * Hid);                  // (M, Hid) dout @ weight
  float* dpre32 = f.get(M * Hid);                  // (M, Hid)
  cpu::matmul_backward(prod32, static_cast<float*>(nullptr), static_cast<float*>(nullptr), dout32,
                       static_cast<const float*>(nullptr), w32, M, Hid, Nout);
  cpu::gelu_tanh_backward(dpre32, static_cast<const float*>(prod32), pre32, M * Hid);
  convert(dpre, dpre32, M * Hid);
  if (!dpre_bias) return;
  float* sums = f.get(Hid);  // (Hid)
  std::fill(sums, sums + Hid, 0.0f);
  cpu::matmul_backward(static_cast<float*>(nullptr), static_cast<float*>(nullptr), sums,
                       static_cast<const float*>(dpre32), static_cast<const float*>(nullptr),
                       static_cast<const float*>(nullptr), M, Index(1), Hid);
  for (Index i = 0; i < Hid; ++i) dpre_bias[i] += float(bf16(sums[i]));
}

template <class X>
void layernorm_forward(bf16* out, float* mean, float* rstd, const X* inp, const bf16* weight,
                       const bf16* bias, Index R, Index C, float eps) {
  Frame f;
  const float* inp32 = f.widen(inp, R * C);  // (R, C)
  const float* w32 = f.widen(weight, C);     // (C)
  const float* b32 = f.widen(bias, C);       // (C)
  float* out32 = f.get(R * C);               // (R, C)
  cpu::layernorm_forward(out32, mean, rstd, inp32, w32, b32, R, C, eps);
  convert(out, out32, R * C);
}

template <class X>
void layernorm_backward(std::type_identity_t<X>* dinp, float* dweight, float* dbias,
                        const bf16* dout, const X* inp, const bf16* weight, const float* mean,
                        const float* rstd, Index R, Index C) {
  Frame f;
  const float* dout32 = f.widen(dout, R * C);  // (R, C)
  const float* inp32 = f.widen(inp, R * C);    // (R, C)
  const float* w32 = f.widen(weight, C);       // (C)
  // (R, C): the old gradient (zeros when dinp is not wanted: the CPU op always adds into one),
  // plus this op's fp32 share, rounded once below when the stream is bf16.
  float* dinp32 = dinp ? f.fp32_of(dinp, R * C) : f.get(R * C);
  if (dinp)
    convert(dinp32, dinp, R * C);
  else
    std::fill(dinp32, dinp32 + R * C, 0.0f);
  cpu::layernorm_backward(dinp32, dweight, dbias, dout32, inp32, w32, mean, rstd, R, C);
  if (dinp) convert(dinp, dinp32, R * C);
}

void gelu_forward(bf16* out, const bf16* inp, Index n) {
  unary(&cpu::gelu_forward<float>, out, inp, n);
}

void gelu_backward(bf16* dinp, const bf16* dout, const bf16* inp, Index n) {
  binary(&cpu::gelu_backward<float>, dinp, dout, inp, n);
}

void gelu_tanh_forward(bf16* out, const bf16* inp, Index n) {
  unary(&cpu::gelu_tanh_forward<float>, out, inp, n);
}

void gelu_tanh_backward(bf16* dinp, const bf16* dout, const bf16* inp, Index n) {
  binary(&cpu::gelu_tanh_backward<float>, dinp, dout, inp, n);
}

void hswish_forward(bf16* out, const bf16* inp, Index n) {
  unary(&cpu::hswish_forward<float>, out, inp, n);
}

void hswish_backward(bf16* dinp, const bf16* dout, const bf16* inp, Index n) {
  binary(&cpu::hswish_backward<float>, dinp, dout, inp, n);
}

void relu_forward(bf16* out, const bf16* inp, Index n) {
  unary(&cpu::relu_forward<float>, out, inp, n);
}

void relu_backward(bf16* dinp, const bf16* dout, const bf16* inp, Index n) {
  binary(&cpu::relu_backward<float>, dinp, dout, inp, n);
}

void dwconv3x3_forward(bf16* out, const bf16* inp, const bf16* weight, Index B, Index N,
                       Index prefix, Index gh, Index gw, Index C) {
  VIT_CHECK(N - prefix == gh * gw, "dwconv3x3: N - prefix must equal gh * gw");
  Frame f;
  const float* inp32 = f.widen(inp, B * N * C);  // (B, N, C)
  const float* w32 = f.widen(weight, C * 9);     // (C, 1, 3, 3)
  float* out32 = f.get(B * N * C);               // (B, N, C)
  cpu::dwconv3x3_forward(out32, inp32, w32, B, N, prefix, gh, gw, C);
  convert(out, out32, B * N * C);
}

void dwconv3x3_backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp,
                        const bf16* weight, Index B, Index N, Index prefix, Index gh, Index gw,
                        Index C) {
  VIT_CHECK(N - prefix == gh * gw, "dwconv3x3: N - prefix must equal gh * gw");
  Frame f;
  const float* dout32 = f.widen(dout, B * N * C);                    // (B, N, C)
  const float* inp32 = dweight ? f.widen(inp, B * N * C) : nullptr;  // (B, N, C)
  const float* w32 = f.widen(weight, C * 9);                         // (C, 1, 3, 3)
  float* dinp32 = dinp ? f.get(B * N * C) : nullptr;                 // (B, N, C)
  cpu::dwconv3x3_backward(dinp32, dweight, dout32, inp32, w32, B, N, prefix, gh, gw, C);
  if (dinp) convert(dinp, dinp32, B * N * C);
}

void im2patches(bf16* patches, const bf16* img, Index B, Index Cin, Index Himg, Index Wimg,
                Index P) {
  // A copy: widening and rounding back is exact.
  const Index np = B * (Himg / P) * (Wimg / P) * Cin * P * P;
  Frame f;
  const float* img32 = f.widen(img, B * Cin * Himg * Wimg);  // (B, Cin, Himg, Wimg)
  float* patches32 = f.get(np);                              // (B, gh*gw, Cin*P*P)
  cpu::im2patches(patches32, img32, B, Cin, Himg, Wimg, P);
  convert(patches, patches32, np);
}

void im2col3x3s2(bf16* cols, const bf16* inp, Index B, Index H, Index W, Index C, bool nchw) {
  // A copy: widening and rounding back is exact.
  const Index n_in = B * H * W * C, n_cols = B * ((H + 1) / 2) * ((W + 1) / 2) * C * 9;
  Frame f;
  const float* inp32 = f.widen(inp, n_in);  // (B, H, W, C) or (B, C, H, W)
  float* cols32 = f.get(n_cols);            // (B, Ho, Wo, C*9)
  cpu::im2col3x3s2(cols32, inp32, B, H, W, C, nchw);
  convert(cols, cols32, n_cols);
}

void col2im3x3s2(bf16* dinp, const bf16* dcols, Index B, Index H, Index W, Index C) {
  // Up to four taps summed in fp32 in (kh, kw) order, then one rounding (as conv_stem.cu).
  const Index n_in = B * H * W * C, n_cols = B * ((H + 1) / 2) * ((W + 1) / 2) * C * 9;
  Frame f;
  const float* dcols32 = f.widen(dcols, n_cols);  // (B, Ho, Wo, C*9)
  float* dinp32 = f.get(n_in);                    // (B, H, W, C)
  cpu::col2im3x3s2(dinp32, dcols32, B, H, W, C);
  convert(dinp, dinp32, n_in);
}

template <class X>
void embed_tokens_forward(X* x, const bf16* patch_out, const bf16* cls, const bf16* pos, Index B,
                          Index N, Index prefix, Index C) {
  Frame f;
  const float* patch32 = f.widen(patch_out, B * (N - prefix) * C);  // (B, N - prefix, C)
  const float* cls32 = f.widen(cls, C);                             // (C) or nullptr
  const float* pos32 = f.widen(pos, N * C);                         // (N, C)
  float* x32 = f.get(B * N * C);                                    // (B, N, C)
  cpu::embed_tokens_forward(x32, patch32, cls32, pos32, B, N, prefix, C);
  convert(x, x32, B * N * C);
}

template <class X>
void embed_tokens_backward(bf16* dpatch_out, float* dcls, float* dpos, const X* dx, Index B,
                           Index N, Index prefix, Index C) {
  Frame f;
  const float* dx32 = f.widen(dx, B * N * C);                            // (B, N, C)
  float* dpatch32 = dpatch_out ? f.get(B * (N - prefix) * C) : nullptr;  // (B, N - prefix, C)
  cpu::embed_tokens_backward(dpatch32, dcls, dpos, dx32, B, N, prefix, C);
  if (dpatch_out) convert(dpatch_out, dpatch32, B * (N - prefix) * C);
}

template <class X>
void residual_forward(X* out, const X* x, const bf16* branch, const bf16* gamma,
                      const float* sample_scale, Index B, Index S, Index C) {
  Frame f;
  // (B, S, C): x widened (an fp32 x copied into out unless out is x), then the sum in place
  // (the CPU op allows out == x); out may alias x because x is read in full before out is
  // written.
  float* sum32 = f.fp32_of(out, B * S * C);
  convert(sum32, x, B * S * C);
  const float* branch32 = f.widen(branch, B * S * C);  // (B, S, C)
  const float* gamma32 = f.widen(gamma, C);            // (C) or nullptr
  cpu::residual_forward(sum32, sum32, branch32, gamma32, sample_scale, B, S, C);
  convert(out, sum32, B * S * C);
}

template <class X>
void residual_backward(bf16* dbranch, float* dgamma, const X* dout, const bf16* branch,
                       const bf16* gamma, const float* sample_scale, Index B, Index S, Index C) {
  Frame f;
  const float* dout32 = f.widen(dout, B * S * C);                         // (B, S, C)
  const float* branch32 = dgamma ? f.widen(branch, B * S * C) : nullptr;  // (B, S, C)
  const float* gamma32 = f.widen(gamma, C);                               // (C) or nullptr
  float* dbranch32 = dbranch ? f.get(B * S * C) : nullptr;                // (B, S, C)
  cpu::residual_backward(dbranch32, dgamma, dout32, branch32, gamma32, sample_scale, B, S, C);
  if (dbranch) convert(dbranch, dbranch32, B * S * C);
}

template <class X>
void pool_forward(X* out, const X* x, Index B, Index N, Index prefix, Index C, bool avg) {
  Frame f;
  const float* x32 = f.widen(x, B * N * C);  // (B, N, C)
  float* out32 = f.fp32_of(out, B * C);      // (B, C)
  cpu::pool_forward(out32, x32, B, N, prefix, C, avg);
  convert(out, out32, B * C);
}

template <class X>
void pool_backward(X* dx, const X* dout, Index B, Index N, Index prefix, Index C, bool avg) {
  // dx accumulates: rows the op does not touch round back to themselves (bf16 stream).
  Frame f;
  float* dx32 = f.fp32_of(dx, B * N * C);  // (B, N, C)
  convert(dx32, dx, B * N * C);
  const float* dout32 = f.widen(dout, B * C);  // (B, C)
  cpu::pool_backward(dx32, dout32, B, N, prefix, C, avg);
  convert(dx, dx32, B * N * C);
}

void cross_entropy_forward(float* losses, float* probs, const bf16* logits, const float* targets,
                           Index B, Index K) {
  Frame f;
  const float* logits32 = f.widen(logits, B * K);  // (B, K)
  cpu::cross_entropy_forward(losses, probs, logits32, targets, B, K);
}

void cross_entropy_backward(bf16* dlogits, const float* probs, const float* targets, float dloss,
                            Index B, Index K) {
  Frame f;
  float* dlogits32 = f.get(B * K);  // (B, K)
  cpu::cross_entropy_backward(dlogits32, probs, targets, dloss, B, K);
  convert(dlogits, dlogits32, B * K);
}

// The residual-stream ops for both stream types (bf16 and fp32, see ops.h).
#define VIT_EMU_RESIDUAL_OPS(X)                                                                  \
  template void layernorm_forward<X>(bf16*, float*, float*, const X*, const bf16*, const bf16*,  \
                                     Index, Index, float);                                       \
  template void layernorm_backward<X>(X*, float*, float*, const bf16*, const X*, const bf16*,    \
                                      const float*, const float*, Index, Index);                 \
  template void embed_tokens_forward<X>(X*, const bf16*, const bf16*, const bf16*, Index, Index, \
                                        Index, Index);                                           \
  template void embed_tokens_backward<X>(bf16*, float*, float*, const X*, Index, Index, Index,   \
                                         Index);                                                 \
  template void residual_forward<X>(X*, const X*, const bf16*, const bf16*, const float*, Index, \
                                    Index, Index);                                               \
  template void residual_backward<X>(bf16*, float*, const X*, const bf16*, const bf16*,          \
                                     const float*, Index, Index, Index);                         \
  template void pool_forward<X>(X*, const X*, Index, Index, Index, Index, bool);                 \
  template void pool_backward<X>(X*, const X*, Index, Index, Index, Index, bool);
VIT_EMU_RESIDUAL_OPS(bf16)
VIT_EMU_RESIDUAL_OPS(float)
#undef VIT_EMU_RESIDUAL_OPS

}  // namespace vit::emu
