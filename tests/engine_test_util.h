// Shared by the engine tests (test_engine.cpp, test_cuda_model.cpp): a random training batch
// and the engine options they use.
#pragma once
#include <string>
#include <vector>

#include "core/rng.h"
#include "train/engine.h"

namespace vit::test {

struct Batch {
  std::vector<float> images, targets;  // (B, Cin, S, S), (B, K)
};

// Normal images; soft targets with 0.9 extra on one random class per sample.
inline Batch random_batch(const ModelConfig& c, Index B, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.images.resize(B * c.in_chans * c.img_size * c.img_size);
  for (auto& x : b.images) x = float(rng.normal());
  b.targets.assign(B * c.num_classes, 0.02f);
  for (Index i = 0; i < B; ++i) b.targets[i * c.num_classes + rng.below(c.num_classes)] += 0.9f;
  return b;
}

// Clipping on, so the clip path runs on every backend.
inline EngineOptions engine_options(const std::string& device, const std::string& precision,
                                    const ModelConfig& c, Index B) {
  EngineOptions o;
  o.device = device;
  o.precision = precision;
  o.cfg = c;
  o.max_batch = B;
  o.adamw.clip_grad = 1.0;
  return o;
}

}  // namespace vit::test
