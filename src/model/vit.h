// The ViT: forward and backward over the whole model, llm.c style (explicit per-layer calls into
// the ops, activations in one preallocated arena). Written once over a backend policy
// (src/backend/host.h, src/backend/cuda.h): the same orchestration trains in fp32 on the CPU,
// checks itself by finite differences in fp64, emulates bf16 on the CPU, and runs on the GPU.
//
// Buffers live in the backend's memory (host arrays or device memory). Every pointer argument
// below is backend memory. The parameter buffers and the arena are sized for the largest image
// size of the run (max_img_size), so changing the size (curriculum) never moves a pointer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/host.h"
#include "model/arena.h"
#include "model/config.h"
#include "model/params.h"
#include "ops/kernel_plan.h"

namespace vit {

template <class Backend>
class VitModel {
 public:
  using Store = typename Backend::Store;  // activations and the weight copy the forward reads
  using Acc = typename Backend::Acc;      // master weights, gradients, statistics, losses
  using Res = typename Backend::Res;      // the residual stream and its gradient
  template <class U>
  using Buffer = typename Backend::template Buffer<U>;

  // max_img_size: the largest image size this model will be switched to (0 = cfg.img_size).
  // `plan`: the kernel plan whose attention choice the model's buffers follow (null: the active
  // plan, or the rules under default options). `capacity_multiple`: the parameter buffers'
  // length is rounded up to a multiple of it (ZeRO-1: world x 64, its equal padded blocks).
  VitModel(const ModelConfig& cfg, Index max_batch, int max_img_size = 0,
           KernelPlan* plan = nullptr, Index capacity_multiple = 1);
  ~VitModel();
  VitModel(const VitModel&) = delete;
  VitModel& operator=(const VitModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  Index max_batch() const { return max_batch_; }
  int max_img_size() const { return max_img_size_; }
  size_t arena_bytes() const { return plan_.total_bytes(); }
  // Whether attention runs fused (no (B, H, N, N) probabilities; src/ops/attention_choice.h).
  bool fused_attention() const { return fused_attention_; }

  // Switches to another image size (a multiple of the patch size, at most max_img_size). The
  // table is rebuilt; the buffers stay. The caller remaps the parameters (resize_model).
  void set_img_size(int size);

  Buffer<Acc> params;  // (capacity) master weights, layout of table() in the first table().total
  Buffer<Acc> grads;   // (capacity) same layout; accumulated by backward()

  // The weights the forward reads: params itself when Store == Acc, else the low-precision copy
  // (which adamw_step writes, and sync_weights() refreshes after params were written directly).
  Store* weights();
  void sync_weights();

  // images (B, Cin, S, S) NCHW, normalised. targets (B, K) soft targets or nullptr (inference).
  // When `train` is true, stochastic depth draws its per-sample masks from `seed`.
  void forward(const Store* images, const Acc* targets, Index B, bool train, uint64_t seed);
  // forward() in two parts, for a pass replayed as a CUDA graph: begin_pass() keeps the pass's
  // batch, targets and mode and uploads the stochastic-depth scales (host work, outside the
  // graph); forward_ops() enqueues the device work only (the part a graph captures).
  void begin_pass(const Acc* targets, Index B, bool train, uint64_t seed);
  void forward_ops(const Store* images);
  // Accumulates d(loss_scale * sum_b loss_b)/d(params) into grads. With loss_scale = 1 / B the
  // gradient is that of the mean loss; 1 / (B * accum) for gradient accumulation.
  // grads_final(stage), where given, is called as parts of the gradient become final (enqueued,
  // on the GPU): depth after the head and final norm, l after block l, -1 after the embedding
  // (train/grad_buckets.h maps the stages to buffer ranges: data parallel starts their sums).
  void backward(Acc loss_scale, const std::function<void(int)>& grads_final = {});
  void zero_grad();

  // Mean loss over the last forward's B samples, read to the host (a device sync on the GPU).
  double mean_loss() const;
  const Store* logits() const;  // (B, K) of the last forward
  const Acc* losses() const;    // (B) per-sample losses of the last forward

 private:
  struct Acts;
  void plan_arena();
  void rebind();
  void forward_block(int l, Index B, const Acc* s1, const Acc* s2);
  void residual_norm_forward(Res* stream, const Res* x, const Store* branch, const Store* gamma,
                             const Acc* sample_scale, Store* ln, Acc* mean, Acc* rstd,
                             const Store* norm_w, const Store* norm_b, Index B, Index N);
  void backward_block(int l, Index B, const Acc* s1, const Acc* s2);
  void backward_embedding(Index B);
  void draw_drop_path(Index B, uint64_t seed);
  void attention_forward(int l, Index B);
  void attention_backward(int l, Index B);

  ModelConfig cfg_;
  ParamTable table_;
  Index max_batch_;
  int max_img_size_;
  bool fused_attention_;  // decided once: the arena holds the state of one kind
  Index capacity_ = 0;    // elements of params / grads / weight copy (zeros past the table)
  Buffer<Store> lowp_;    // (capacity) the weight copy when Store != Acc
  ArenaPlan plan_;
  Buffer<std::byte> arena_;
  std::unique_ptr<Acts> acts_;
  ModelView<Store> w_;               // into weights()
  ModelView<Acc> g_;                 // into grads
  std::vector<Acc> drop_path_host_;  // (L, 2, B) sample scales drawn on the host
  Index batch_ = 0;
  bool has_targets_ = false;
  bool drop_path_active_ = false;
  const Acc* targets_ = nullptr;
};

// The CPU reference model (fp32 training, fp64 finite differences): params and grads are
// std::vector<T>.
template <typename T>
using Vit = VitModel<CpuBackend<T>>;

}  // namespace vit
