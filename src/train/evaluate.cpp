#include "train/evaluate.h"

#include <algorithm>

#include "data/loader.h"

namespace vit {

EvalResult evaluate(Engine& model, const data::Source& d, const data::BatchConfig& cfg, Index batch,
                    std::vector<float>* logits, int workers, Comm* comm) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  VIT_CHECK(world == 1 || !logits, "evaluate: logits are not gathered across ranks");
  const ModelConfig& mc = model.config();
  const Index K = mc.num_classes, S = cfg.img_size, n = d.size(), Kd = d.num_classes();
  batch = std::min(batch, model.max_batch());
  std::vector<float> images(batch * d.channels() * S * S);  // (B, C, S, S)
  std::vector<float> targets(batch * std::max(K, Kd));      // (B, K)
  std::vector<int32_t> labels(batch);
  std::vector<float> z(batch * K), losses(batch);  // (B, K), (B)
  if (logits) logits->assign(n * K, 0.0f);
  data::BatchConfig eval_cfg = cfg;
  eval_cfg.smoothing = 0;  // eval loss is the plain cross-entropy, as timm reports it
  EvalResult r;
  if (n == 0) return r;
  data::LoaderOptions lo;
  lo.workers = workers;
  lo.stride = world;
  data::Loader loader(d, batch, false, 0, lo);
  double loss_sum = 0;
  Index top1 = 0, top5 = 0;
  for (Index k = rank; k < loader.batches_per_epoch(); k += world) {
    const Index B = loader.batch_samples(k), start = k * batch;
    loader.load(0, k, eval_cfg, images.data(), targets.data(), labels.data());
    data::widen_targets(targets.data(), B, Kd, K);
    model.infer(images.data(), targets.data(), B, z.data(), losses.data());
    double batch_loss = 0;
    for (Index b = 0; b < B; ++b) batch_loss += losses[b];
    loss_sum += batch_loss;
    for (Index b = 0; b < B; ++b) {
      const float* row = z.data() + b * K;
      const int label = labels[b];
      // Rank of the true class: number of classes with a strictly larger logit.
      Index rank = 0;
      for (Index k2 = 0; k2 < K; ++k2) rank += row[k2] > row[label];
      top1 += rank < 1;
      top5 += rank < 5;
      if (logits) std::copy(row, row + K, logits->begin() + (start + b) * K);
    }
  }
  if (world > 1) {
    double sums[3] = {loss_sum, double(top1), double(top5)};  // counts are exact in a double
    comm->allreduce_sum(sums, 3);
    loss_sum = sums[0];
    top1 = Index(sums[1]);
    top5 = Index(sums[2]);
  }
  r.n = n;
  r.loss = loss_sum / n;
  r.top1 = 100.0 * top1 / n;
  r.top5 = 100.0 * top5 / n;
  return r;
}

}  // namespace vit
