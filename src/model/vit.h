// The ViT: forward and backward over the whole model, llm.c style (explicit per-layer calls into
// the CPU ops, activations kept in one preallocated arena). Templated on the float type so the
// same code trains in fp32 and is checked by finite differences in fp64.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace vit {

template <typename T>
class Vit {
 public:
  Vit(const ModelConfig& cfg, Index max_batch);
  ~Vit();
  Vit(const Vit&) = delete;
  Vit& operator=(const Vit&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  Index max_batch() const { return max_batch_; }

  std::vector<T> params;  // (table().total) contiguous, layout of the parameter table
  std::vector<T> grads;   // (table().total) same layout; accumulated by backward()

  ModelView<T> param_view() { return bind_view(table_, cfg_, params.data()); }

  // images (B, Cin, S, S) NCHW, normalised. targets (B, K) soft targets or nullptr (inference).
  // When `train` is true, stochastic depth draws its per-sample masks from `seed`.
  // Returns the mean loss over the B samples (0 when targets == nullptr).
  T forward(const T* images, const T* targets, Index B, bool train, uint64_t seed);
  // Accumulates d(loss_scale * sum_b loss_b)/d(params) into grads. With loss_scale = 1 / B the
  // gradient is that of the mean loss; 1 / (B * accum) for gradient accumulation.
  void backward(T loss_scale);
  void zero_grad();

  const T* logits() const;  // (B, K) of the last forward
  const T* losses() const;  // (B) per-sample losses of the last forward

 private:
  struct Acts;
  ModelConfig cfg_;
  ParamTable table_;
  Index max_batch_;
  Index batch_ = 0;
  bool has_targets_ = false;
  const T* images_ = nullptr;
  const T* targets_ = nullptr;
  std::unique_ptr<Acts> acts_;
};

}  // namespace vit
