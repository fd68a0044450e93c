// The CUDA backend policy (see src/backend/host.h for what a policy provides): CudaBackend<bf16>
// is the product (bf16 activations and weight copy, fp32 master weights, gradients, statistics,
// losses and AdamW moments); CudaBackend<bf16, float> the same with the residual stream and its
// gradient in fp32 (--fp32-residual, as PyTorch autocast); CudaBackend<float> is the fp32
// debugging mode, checked tightly against the CPU reference. Host code: compiled by the host
// compiler into the CUDA library.
#pragma once
#include <string>
#include <type_traits>
#include <vector>

#include "backend/host.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops.h"

namespace vit {

// T: activations and the weight copy; R: the residual stream (T, or float with T = bf16).
template <typename T, typename R = T>
struct CudaBackend {
  using Store = T;
  using Acc = float;
  using Res = R;
  static constexpr bool kHost = false;
  template <class U>
  using Buffer = cuda::DeviceBuffer<U>;
  static std::string name() {
    const bool fp32_residual = !std::is_same_v<T, float> && std::is_same_v<R, float>;
    return std::string(std::is_same_v<T, float> ? "cuda fp32" : "cuda bf16") +
           (fp32_residual ? ", fp32 residual" : "") + " (" + cuda::device_name() + ")";
  }
  static double peak_bytes() { return double(cuda::device_peak_bytes()); }
  static DeviceProps device_props() { return cuda::device_props(); }
  // CUDA graphs of the training pass (train/pass_graphs.h).
  struct GraphOps {
    using Graph = cuda::StreamGraph;
    static void begin_capture() { cuda::begin_capture(); }
    static Graph end_capture(std::string* why) { return cuda::end_capture(why); }
    static void abort_capture() { cuda::abort_capture(); }
    static uint64_t epoch() { return cuda::scratch_epoch(); }
  };

  static constexpr bool kFusedAttention = true;
  // The locality FFN's backward recomputes act1 = hswish(fc1) (ops/cuda/ops.h): no slot.
  static constexpr bool kLocalFfnStoresAct1 = false;
#define VIT_FORWARD_CUDA(name) VIT_FORWARD_OP(::vit::cuda, name)
  VIT_LAYER_OPS(VIT_FORWARD_CUDA)
  VIT_FORWARD_CUDA(flash_attention_forward)
  VIT_FORWARD_CUDA(flash_attention_backward)
  VIT_FORWARD_CUDA(gelu_backward_bias)
  VIT_FORWARD_CUDA(matmul_gelu_forward)
  VIT_FORWARD_CUDA(matmul_gelu_backward)
  VIT_FORWARD_CUDA(matmul_gelu_tanh_forward)
  VIT_FORWARD_CUDA(matmul_gelu_tanh_backward)
  VIT_FORWARD_CUDA(residual_layernorm_forward)
  VIT_FORWARD_CUDA(local_ffn_forward)
  VIT_FORWARD_CUDA(local_ffn_backward)
  VIT_FORWARD_CUDA(hswish_backward_bias)
  VIT_FORWARD_CUDA(resize_rows)
  VIT_FORWARD_CUDA(resize_cols)
  VIT_FORWARD_CUDA(normalize_u8)
  VIT_FORWARD_CUDA(apply_pixel_steps)
  VIT_FORWARD_CUDA(mix_images)
  VIT_FORWARD_CUDA(lowfreq_batch)
#undef VIT_FORWARD_CUDA

  template <class U>
  static void zero(U* p, Index n) {
    cuda::zero_bytes(p, size_t(n) * sizeof(U));
  }
  template <class U>
  static void copy(U* dst, const U* src, Index n) {
    cuda::copy_bytes(dst, src, size_t(n) * sizeof(U));
  }
  // Host <-> device of the same element type (parameters, moments, statistics, drop-path
  // scales, logits). Uploads are asynchronous; downloads synchronise, so they belong at log,
  // eval and checkpoint points.
  template <class U>
  static void upload(U* dst, const U* host, Index n) {
    cuda::upload_bytes(dst, host, size_t(n) * sizeof(U));
  }
  template <class U>
  static void download(U* host, const U* src, Index n) {
    cuda::download_bytes(host, src, size_t(n) * sizeof(U));
  }
  // bf16 logits to the host: widened on the device into a scratch copy first.
  static void download(float* host, const cuda::bf16* src, Index n) {
    static Buffer<float> wide;  // grows to the largest (B, K) once, then stays
    if (wide.size() < size_t(n)) wide = Buffer<float>{size_t(n)};
    cuda::convert(wide.data(), src, n);
    download(host, wide.data(), n);
  }
  static void convert(T* dst, const float* src, Index n) {
    cuda::convert(dst, src, n);
  }
  // A training batch to the device through pinned buffer `slot` (see cuda::upload_input).
  static void upload_input(float* images, const float* host_images, Index n_images, float* targets,
                           const float* host_targets, Index n_targets, int slot) {
    const cuda::InputCopy copies[2] = {
        {images, host_images, size_t(n_images) * sizeof(float)},
        {targets, host_targets, host_targets ? size_t(n_targets) * sizeof(float) : 0}};
    cuda::upload_input(copies, 2, slot);
  }
  // n host arrays to device buffers through pinned buffer `slot` (a planned batch's crops,
  // tables, lookup table and targets).
  static void upload_input_n(void* const* dst, const void* const* host, const size_t* bytes, int n,
                             int slot) {
    std::vector<cuda::InputCopy> copies;
    for (int i = 0; i < n; ++i) copies.push_back({dst[i], host[i], bytes[i]});
    cuda::upload_input(copies.data(), n, slot);
  }
  static void input_released(int slot) {
    cuda::input_released(slot);
  }
  static void synchronize() {
    cuda::synchronize();
  }
  using Marks = cuda::StreamMarks;

  static void loss_accumulate(double* stats, const float* losses, Index B) {
    cuda::loss_accumulate(stats, losses, B);
  }
  static void close_update_loss(double* stats, int micro_batches) {
    cuda::close_update_loss(stats, micro_batches);
  }
  // Model EMA after an update, decided on the device (not after a skipped one).
  static void ema_update(float* ema, const float* params, const double* stats, Index n,
                         double decay) {
    cuda::ema_update(ema, params, stats + kApply, n, decay);
  }
  static void swap(float* a, float* b, Index n) {
    cuda::swap_buffers(a, b, n);
  }
  // Grad norm and the skip verdict on the device, then one fused AdamW kernel (it returns at
  // once for a skipped update) that also writes the bf16 copy; the clip scale is computed on
  // the device from the norm (no host sync per step). Whether the update was applied is known
  // only on the device: returns true.
  // ZeRO-1 on the device (see HostMemory::sharded_adamw): every rank's sum of squares over
  // NCCL, the root, the verdict and AdamW on the block, all on the device; the bf16 copy is the
  // caller's (after the all-gather). Whether the update was applied is known only on the
  // device: returns true (an all-gather of unchanged blocks is harmless).
  static bool sharded_adamw(float* params, float* m, float* v, const float* grads, double* stats,
                            Index n, Index num_decay, const AdamWConfig& cfg, double lr, Index step,
                            Comm& comm) {
    cuda::grad_sum_of_squares(stats + kGradNorm, grads, n);
    comm.allreduce_sum(stats + kGradNorm, 1);
    cuda::sqrt_in_place(stats + kGradNorm);
    cuda::judge_update(stats);
    cuda::adamw_step<T>(params, static_cast<T*>(nullptr), m, v, grads, stats + kGradNorm,
                        stats + kApply, n, num_decay, cfg, lr, step);
    return true;
  }
  static bool adamw_step(float* params, Store* lowp, float* m, float* v, const float* grads,
                         double* stats, Index n, Index num_decay, const AdamWConfig& cfg, double lr,
                         Index step) {
    cuda::global_grad_norm(stats + kGradNorm, grads, n);
    cuda::judge_update(stats);
    cuda::adamw_step<T>(params, std::is_same_v<T, float> ? nullptr : lowp, m, v, grads,
                        stats + kGradNorm, stats + kApply, n, num_decay, cfg, lr, step);
    return true;
  }
};

}  // namespace vit
