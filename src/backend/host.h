// Backend policies for the model and the engine: which types a backend stores and accumulates
// in, how its memory is allocated and copied, and which op namespace computes. The model's
// forward/backward (src/model/vit.h) and the engine (src/train/engine.h) are written once over
// such a policy. This file holds the host backends:
//  * CpuBackend<float>: the reference; CpuBackend<double>: finite-difference checks.
//  * EmuBackend: the CPU bf16 emulation. Activations and the weight copy are stored as bf16 and
//    rounded exactly where the CUDA bf16 backend rounds (src/ops/emu); master weights,
//    gradients, statistics, losses and AdamW moments stay fp32. CI runs the mixed-precision
//    orchestration with it; the GPU test compares the CUDA bf16 model against it.
// A policy provides: Store (activations, weight copy), Acc (master weights, gradients, stats,
// losses, targets, moments), Res (the residual stream and its gradient: Store, or fp32 where
// a bf16 backend keeps the stream in fp32), Buffer<U> (an owning array with data() and size()), the
// memory functions below, the layer ops of src/ops/cpu/ops.h under the same names, and the training
// helpers loss_accumulate / adamw_step.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/bf16.h"
#include "core/common.h"
#include "dist/comm.h"
#include "ops/attention_choice.h"
#include "ops/kernel_plan.h"
#include "ops/cpu/adamw.h"
#include "ops/cpu/ema.h"
#include "ops/cpu/ops.h"
#include "ops/emu/ops.h"

namespace vit {

// The layer ops every backend forwards to its op namespace.
// clang-format off
#define VIT_LAYER_OPS(X) \
  X(matmul_forward) \
  X(matmul_backward) \
  X(layernorm_forward) \
  X(layernorm_backward) \
  X(attention_forward) \
  X(attention_backward) \
  X(gelu_forward) \
  X(gelu_backward) \
  X(gelu_tanh_forward) \
  X(gelu_tanh_backward) \
  X(hswish_forward) \
  X(hswish_backward) \
  X(relu_forward) \
  X(relu_backward) \
  X(dwconv3x3_forward) \
  X(dwconv3x3_backward) \
  X(im2patches) \
  X(im2col3x3s2) \
  X(col2im3x3s2) \
  X(embed_tokens_forward) \
  X(embed_tokens_backward) \
  X(residual_forward) \
  X(residual_backward) \
  X(pool_forward) \
  X(pool_backward) \
  X(cross_entropy_forward) \
  X(cross_entropy_backward)
// clang-format on

#define VIT_FORWARD_OP(ns, name) \
  template <class... A>          \
  static void name(A... a) {     \
    ns::name(a...);              \
  }

// The host backends' StreamMarks (ops/cuda/device.h): they run each op as it is called, so the
// host clock at record() is the time the work enqueued so far took.
class HostMarks {
 public:
  void record() { t_.push_back(std::chrono::steady_clock::now()); }
  std::vector<double> seconds() const {
    std::vector<double> s;
    for (const auto& t : t_) s.push_back(std::chrono::duration<double>(t - t_.front()).count());
    return s;
  }
  void clear() { t_.clear(); }

 private:
  std::vector<std::chrono::steady_clock::time_point> t_;
};

// Memory of the host backends: plain host arrays, copies are memcpy or elementwise conversion.
struct HostMemory {
  static constexpr bool kHost = true;
  // What the kernel plan's rules see (a host: the emulation chooses as the GPU does).
  static DeviceProps device_props() { return {}; }
  template <class U>
  using Buffer = std::vector<U>;

  template <class U>
  static void zero(U* p, Index n) {
    std::fill(p, p + n, U{});
  }
  // dst (n) = src (n), both in the backend's memory.
  template <class U>
  static void copy(U* dst, const U* src, Index n) {
    if (n > 0) std::memcpy(dst, src, size_t(n) * sizeof(U));
  }
  // Host -> backend and backend -> host, converting element by element (exact or rounding).
  template <class D, class S>
  static void upload(D* dst, const S* host, Index n) {
    if constexpr (std::is_same_v<D, S>)
      copy(dst, host, n);
    else
      for (Index i = 0; i < n; ++i) dst[i] = D(host[i]);
  }
  template <class D, class S>
  static void download(D* host, const S* src, Index n) {
    upload(host, src, n);
  }
  static void synchronize() {}
  using Marks = HostMarks;

  // The engine's loss bookkeeping in its step statistics (StepStat, fp64): the micro-batch's
  // mean loss (B) adds to the pending update's.
  template <class A>
  static void loss_accumulate(double* stats, const A* losses, Index B) {
    double sum = 0;
    for (Index i = 0; i < B; ++i) sum += double(losses[i]);
    stats[kLossPending] += sum / double(B);
  }
  static void close_update_loss(double* stats, int micro_batches) {
    ::vit::close_update_loss(stats, micro_batches);
  }
  // Model EMA after an update (not after a skipped one: stats[kApply] == 0).
  template <class A>
  static void ema_update(A* ema, const A* params, const double* stats, Index n, double decay) {
    if (stats[kApply] != 0) cpu::ema_update(ema, params, n, decay);
  }
  template <class A>
  static void swap(A* a, A* b, Index n) {
    std::swap_ranges(a, a + n, b);
  }
  // ZeRO-1's update of this rank's block (params, grads (n); m, v its moments): the global
  // grad norm from every rank's sum of squares, the verdict on the global loss and norm, then
  // AdamW on the block. Returns whether the update was applied (the same on every rank).
  template <class A>
  static bool sharded_adamw(A* params, A* m, A* v, const A* grads, double* stats, Index n,
                            Index num_decay, const AdamWConfig& cfg, double lr, Index step,
                            Comm& comm) {
    double sq = grad_sum_of_squares(grads, n);
    comm.allreduce_sum(&sq, 1);
    stats[kGradNorm] = std::sqrt(sq);
    judge_update(stats);
    if (stats[kApply] == 0) return false;
    cpu::adamw_update(params, m, v, grads, n, num_decay, cfg, lr, step,
                      clip_scale(cfg, stats[kGradNorm]));
    return true;
  }
};

// The CUDA backend's residual_layernorm_forward (a residual add and the LayerNorm of its sum in
// one pass, with the two calls' bits) as the two calls of the host policy P.
template <class P>
struct ComposedResidualNorm {
  template <class X, class S, class A>
  static void residual_layernorm_forward(X* stream, S* out, A* mean, A* rstd, const X* x,
                                         const S* branch, const S* gamma, const A* sample_scale,
                                         const S* weight, const S* bias, Index B, Index N, Index C,
                                         A eps) {
    P::residual_forward(stream, x, branch, gamma, sample_scale, B, N, C);
    P::layernorm_forward(out, mean, rstd, static_cast<const X*>(stream), weight, bias, B * N, C,
                         eps);
  }
};

// The CUDA backend's fused locality-FFN middle (h-swish, depthwise 3x3, h-swish; ops/cuda/ops.h)
// as the host policy P's separate ops, with the same results: the backward overwrites dact2
// (scratch for d(act1)).
template <class P>
struct ComposedLocalFfn {
  static constexpr bool kLocalFfnStoresAct1 = true;  // the conv's backward reads it
  template <class S>
  static void local_ffn_forward(S* act1, S* dw, S* act2, const S* fc1, const S* weight, Index B,
                                Index N, Index prefix, Index gh, Index gw, Index M) {
    P::hswish_forward(act1, fc1, B * N * M);
    P::dwconv3x3_forward(dw, static_cast<const S*>(act1), weight, B, N, prefix, gh, gw, M);
    P::hswish_forward(act2, static_cast<const S*>(dw), B * N * M);
  }
  template <class S, class A>
  static void local_ffn_backward(S* dfc1, A* dweight, S* dact2, const S* dw, const S* act1,
                                 const S* fc1, const S* weight, Index B, Index N, Index prefix,
                                 Index gh, Index gw, Index M) {
    S* ddw = dfc1;  // (B, N, M) scratch until the last op writes dfc1
    P::hswish_backward(ddw, static_cast<const S*>(dact2), dw, B * N * M);
    P::dwconv3x3_backward(dact2, dweight, static_cast<const S*>(ddw), act1, weight, B, N, prefix,
                          gh, gw, M);
    P::hswish_backward(dfc1, static_cast<const S*>(dact2), fc1, B * N * M);
  }
};

// The CUDA backend's Linear + GELU pairs (fc1 of the mlp and mlp_tanh FFNs with its GELU; fc2's
// backward through that GELU, with fc1's bias gradient: one GEMM each with the GELU's forward or
// backward in its epilogue on the GPU, the tanh form's in cuBLASLt's, the exact one's in the
// sm_90a GEMM's; ops/cuda/ops.h) as the host policy P's separate ops: the GEMM's output rounded
// before the GELU, as the epilogues round it, and fc1's bias gradient the column sums of the
// stored dpre as matmul_backward forms them (the bits of calling them one by one).
template <class P>
struct ComposedMatmulGelu {
  template <class S>
  static void matmul_gelu_forward(S* act, S* pre, const S* inp, const S* weight, const S* bias,
                                  Index M, Index K, Index Hid) {
    P::matmul_forward(pre, inp, weight, bias, M, K, Hid);
    P::gelu_forward(act, static_cast<const S*>(pre), M * Hid);
  }
  template <class S>
  static void matmul_gelu_tanh_forward(S* act, S* pre, const S* inp, const S* weight, const S* bias,
                                       Index M, Index K, Index Hid) {
    P::matmul_forward(pre, inp, weight, bias, M, K, Hid);
    P::gelu_tanh_forward(act, static_cast<const S*>(pre), M * Hid);
  }
  template <class... Args>
  static void matmul_gelu_backward(Args... args) {
    backward<false>(args...);
  }
  template <class... Args>
  static void matmul_gelu_tanh_backward(Args... args) {
    backward<true>(args...);
  }

 private:
  template <bool kTanh, class S, class A>
  static void backward(S* dpre, A* dpre_bias, A* dweight, A* dbias, S* dact, const S* dout,
                       const S* act, const S* pre, const S* weight, Index M, Index Hid,
                       Index Nout) {
    P::matmul_backward(dact, dweight, dbias, dout, act, weight, M, Hid, Nout);
    if constexpr (kTanh)
      P::gelu_tanh_backward(dpre, static_cast<const S*>(dact), pre, M * Hid);
    else
      P::gelu_backward(dpre, static_cast<const S*>(dact), pre, M * Hid);
    if (dpre_bias)
      P::matmul_backward(static_cast<S*>(nullptr), static_cast<A*>(nullptr), dpre_bias,
                         static_cast<const S*>(dpre), static_cast<const S*>(nullptr),
                         static_cast<const S*>(nullptr), M, Index(1), Hid);
  }
};

template <typename T>
struct CpuBackend : HostMemory,
                    ComposedResidualNorm<CpuBackend<T>>,
                    ComposedLocalFfn<CpuBackend<T>>,
                    ComposedMatmulGelu<CpuBackend<T>> {
  using Store = T;
  using Acc = T;
  using Res = T;
  static constexpr bool kFusedAttention = false;  // the reference saves the probabilities
  static const char* name() { return sizeof(T) == 8 ? "cpu fp64" : "cpu"; }
#define VIT_FORWARD_CPU(name) VIT_FORWARD_OP(::vit::cpu, name)
  VIT_LAYER_OPS(VIT_FORWARD_CPU)
#undef VIT_FORWARD_CPU
  // One AdamW update, unless the update's loss (in stats) or grad norm is not finite; stats
  // receive the grad norm and the verdict (see StepStat). `lowp` is unused (the forward reads
  // the master weights themselves). Returns whether the update was applied.
  static bool adamw_step(Acc* params, Store* /*lowp*/, Acc* m, Acc* v, const Acc* grads,
                         double* stats, Index n, Index num_decay, const AdamWConfig& cfg, double lr,
                         Index step) {
    stats[kGradNorm] = global_grad_norm(grads, n);
    judge_update(stats);
    if (stats[kApply] == 0) return false;
    cpu::adamw_update(params, m, v, grads, n, num_decay, cfg, lr, step,
                      clip_scale(cfg, stats[kGradNorm]));
    return true;
  }
};

// R: the residual stream's storage, bf16 (EmuBackend) or fp32 (EmuBackendFp32Residual, the
// emulation of --fp32-residual).
template <class R>
struct EmuBackendOf : HostMemory,
                      ComposedResidualNorm<EmuBackendOf<R>>,
                      ComposedLocalFfn<EmuBackendOf<R>>,
                      ComposedMatmulGelu<EmuBackendOf<R>> {
  using Store = bf16;
  using Acc = float;
  using Res = R;
  static constexpr bool kFusedAttention = true;  // as the CUDA backend
  static const char* name() {
    return std::is_same_v<R, float> ? "cpu bf16 emulation, fp32 residual" : "cpu bf16 emulation";
  }
#define VIT_FORWARD_EMU(name) VIT_FORWARD_OP(::vit::emu, name)
  VIT_LAYER_OPS(VIT_FORWARD_EMU)
  VIT_FORWARD_EMU(flash_attention_forward)
  VIT_FORWARD_EMU(flash_attention_backward)
  VIT_FORWARD_EMU(matmul_gelu_tanh_forward)
  VIT_FORWARD_EMU(matmul_gelu_tanh_backward)
#undef VIT_FORWARD_EMU
  // dst (n) = src (n) rounded to bf16: the weight copy from the master weights.
  static void convert(Store* dst, const Acc* src, Index n) {
    emu::convert(dst, src, n);
  }
  // The fp32 update, then the bf16 copy the forward reads: round to nearest even, as the
  // CUDA kernel writes it.
  static bool adamw_step(Acc* params, Store* lowp, Acc* m, Acc* v, const Acc* grads, double* stats,
                         Index n, Index num_decay, const AdamWConfig& cfg, double lr, Index step) {
    if (!CpuBackend<float>::adamw_step(params, nullptr, m, v, grads, stats, n, num_decay, cfg, lr,
                                       step))
      return false;
#pragma omp parallel for simd schedule(static)
    for (Index i = 0; i < n; ++i) lowp[i] = bf16(params[i]);
    return true;
  }
};

using EmuBackend = EmuBackendOf<bf16>;
using EmuBackendFp32Residual = EmuBackendOf<float>;

}  // namespace vit
