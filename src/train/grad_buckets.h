// Data parallel: which ranges of the gradient buffer are final at each point of the backward
// pass, so their all-reduce can start while the pass goes on (overlapping communication with
// the layers still to run). The pass finishes the head (and final norm) first, then blocks
// depth-1 down to 0, then the embedding (patchify or conv stem, position embedding, class
// token): stage depth, depth-1, ..., 0, -1.
#pragma once
#include <string>
#include <vector>

#include "core/common.h"
#include "model/params.h"

namespace vit {

struct GradRange {
  Index offset = 0, count = 0;  // elements [offset, offset + count) of the table's buffer
};

// The stage after which a parameter's gradient is final: l for "blocks.l.*", depth for the
// head and the final norm, -1 for the embedding's tensors.
int grad_stage(const std::string& name, int depth);

class GradBuckets {
 public:
  GradBuckets() = default;
  GradBuckets(const ParamTable& table, int depth);
  // The ranges that become final at `stage` (depth down to -1), in buffer order; runs of
  // tensors adjacent in the buffer merged, the alignment padding between them included (it
  // is zero in every gradient). Together, over all stages, every tensor exactly once.
  const std::vector<GradRange>& at(int stage) const;
  int depth() const { return depth_; }

 private:
  int depth_ = 0;
  std::vector<std::vector<GradRange>> by_stage_;  // [stage + 1]
};

}  // namespace vit
