// Evaluation of a model on a data split: mean loss, top-1 and top-5 accuracy (percent), and
// optionally the logits of every sample in data-set order.
#pragma once
#include <vector>

#include "data/batch.h"
#include "data/source.h"
#include "dist/comm.h"
#include "train/engine.h"

namespace vit {

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;
  Index n = 0;
};

// `logits` (n, K), if not null, receives every sample's logits. Streamed sources are decoded by
// `workers` loader threads (0 = all cores); an unreadable sample counts as its replacement
// (data/source_batch.h), with the replacement's label. With `comm` (data parallel, every rank
// holding the same weights) rank r evaluates batches r, r + W, ... and the sums are all-reduced:
// every rank gets the result (no logits then).
EvalResult evaluate(Engine& model, const data::Source& d, const data::BatchConfig& cfg, Index batch,
                    std::vector<float>* logits = nullptr, int workers = 0, Comm* comm = nullptr);

}  // namespace vit
