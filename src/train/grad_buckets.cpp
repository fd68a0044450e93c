#include "train/grad_buckets.h"

#include <algorithm>
#include <cstdlib>

namespace vit {

int grad_stage(const std::string& name, int depth) {
  if (name.rfind("blocks.", 0) == 0) {
    const int l = std::atoi(name.c_str() + 7);
    VIT_CHECK(l >= 0 && l < depth, "gradient buckets: no block for '" + name + "'");
    return l;
  }
  if (name.rfind("head.", 0) == 0 || name.rfind("norm.", 0) == 0 || name.rfind("fc_norm.", 0) == 0)
    return depth;
  return -1;
}

GradBuckets::GradBuckets(const ParamTable& table, int depth)
    : depth_(depth), by_stage_(size_t(depth + 2)) {
  std::vector<const ParamSpec*> specs;
  for (const auto& s : table.specs) specs.push_back(&s);
  std::sort(specs.begin(), specs.end(),
            [](const ParamSpec* a, const ParamSpec* b) { return a->offset < b->offset; });
  // Walk the buffer in order: a tensor of the same stage as its predecessor in the buffer
  // extends the predecessor's range (over the padding between them).
  int stage_of_last = -2;
  for (const ParamSpec* s : specs) {
    const int stage = grad_stage(s->name, depth);
    auto& ranges = by_stage_[size_t(stage + 1)];
    if (stage == stage_of_last)
      ranges.back().count = s->offset + s->numel() - ranges.back().offset;
    else
      ranges.push_back({s->offset, s->numel()});
    stage_of_last = stage;
  }
}

const std::vector<GradRange>& GradBuckets::at(int stage) const {
  VIT_CHECK(stage >= -1 && stage <= depth_, "gradient buckets: no stage " + std::to_string(stage));
  return by_stage_[size_t(stage + 1)];
}

}  // namespace vit
