#include "train/eval_probe.h"

#include <algorithm>
#include <chrono>

#include "data/loader.h"

namespace vit {

std::vector<double> time_eval_batches(Engine& model, const data::Source& d,
                                      const data::BatchConfig& cfg, Index batch, int batches,
                                      int workers) {
  const ModelConfig& mc = model.config();
  const Index K = mc.num_classes, S = cfg.img_size, Kd = d.num_classes();
  batch = std::min(batch, model.max_batch());
  std::vector<double> times;
  if (d.size() == 0 || batches < 1) return times;
  std::vector<float> images(batch * d.channels() * S * S);  // (B, C, S, S)
  std::vector<float> targets(batch * std::max(K, Kd));      // (B, K)
  std::vector<float> z(batch * K), losses(batch);           // (B, K), (B)
  data::BatchConfig eval_cfg = cfg;
  eval_cfg.smoothing = 0;
  data::LoaderOptions lo;
  lo.workers = workers;
  lo.prefetch = batches;  // nothing built past the batches timed
  const Index all = (d.size() + batch - 1) / batch;
  lo.batches_per_epoch = std::min<Index>(batches, all);
  data::Loader loader(d, batch, false, 0, lo);
  for (Index k = 0; k < loader.batches_per_epoch(); ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    const Index B = loader.batch_samples(k);
    loader.load(0, k, eval_cfg, images.data(), targets.data());
    data::widen_targets(targets.data(), B, Kd, K);
    model.infer(images.data(), targets.data(), B, z.data(), losses.data());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return times;
}

}  // namespace vit
