// Evaluation of a model on a data split: mean loss, top-1 and top-5 accuracy (percent), and
// optionally the logits of every sample in data-set order.
#pragma once
#include <vector>

#include "data/batch.h"
#include "model/vit.h"

namespace vit {

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;
  Index n = 0;
};

// `logits` (n, K), if not null, receives every sample's logits.
EvalResult evaluate(Vit<float>& model, const data::ImageDataset& d, const data::BatchConfig& cfg,
                    Index batch, std::vector<float>* logits = nullptr);

}  // namespace vit
