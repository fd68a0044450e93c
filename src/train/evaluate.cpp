#include "train/evaluate.h"

#include <algorithm>
#include <numeric>

namespace vit {

EvalResult evaluate(Vit<float>& model, const data::ImageDataset& d, const data::BatchConfig& cfg,
                    Index batch, std::vector<float>* logits) {
  const ModelConfig& mc = model.config();
  const Index K = mc.num_classes, S = cfg.img_size;
  batch = std::min(batch, model.max_batch());
  std::vector<float> images(batch * d.channels * S * S), targets(batch * K);
  std::vector<Index> idx(batch);
  if (logits) logits->assign(d.n * K, 0.0f);
  EvalResult r;
  double loss_sum = 0;
  Index top1 = 0, top5 = 0;
  for (Index start = 0; start < d.n; start += batch) {
    const Index B = std::min(batch, d.n - start);
    std::iota(idx.begin(), idx.begin() + B, start);
    data::BatchConfig eval_cfg = cfg;
    eval_cfg.smoothing = 0;  // eval loss is the plain cross-entropy, as timm reports it
    data::make_batch(d, idx.data(), B, eval_cfg, false, 0, 0, images.data(), targets.data());
    loss_sum += double(model.forward(images.data(), targets.data(), B, false, 0)) * B;
    const float* z = model.logits();
    for (Index b = 0; b < B; ++b) {
      const float* row = z + b * K;
      const int label = d.labels[start + b];
      // Rank of the true class: number of classes with a strictly larger logit.
      Index rank = 0;
      for (Index k = 0; k < K; ++k) rank += row[k] > row[label];
      top1 += rank < 1;
      top5 += rank < 5;
      if (logits) std::copy(row, row + K, logits->begin() + (start + b) * K);
    }
  }
  r.n = d.n;
  if (d.n > 0) {
    r.loss = loss_sum / d.n;
    r.top1 = 100.0 * top1 / d.n;
    r.top5 = 100.0 * top5 / d.n;
  }
  return r;
}

}  // namespace vit
