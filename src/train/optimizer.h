// AdamW over the one contiguous parameter buffer on the host: the moments and the step count
// around the fused update of src/ops/cpu/adamw.h.
#pragma once
#include <cstdint>
#include <vector>

#include "core/common.h"
#include "ops/cpu/adamw.h"

namespace vit {

template <typename T>
class AdamW {
 public:
  AdamW(Index n, Index num_decay, AdamWConfig cfg);
  // One update with learning rate `lr`. Returns the global grad norm before clipping.
  double step(T* params, const T* grads, double lr);
  Index num_steps() const { return step_; }

  std::vector<T> m;  // first moment, same layout as params
  std::vector<T> v;  // second moment
  Index step_ = 0;   // updates done (public for checkpoint save/restore)
  AdamWConfig cfg;
  Index num_decay;
};

}  // namespace vit
