#include "data/source_batch.h"

#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "core/rng.h"
#include "data/randaugment.h"
#include "data/stage_clock.h"

namespace vit::data {

int decode_min_side(const BatchConfig& cfg, bool train) {
  if (!train && cfg.eval_crop_pct > 0)
    return int(std::ceil(double(cfg.img_size) / cfg.eval_crop_pct - 1e-9));
  return cfg.img_size;
}

namespace {
// read(i) on sample idx, or the next readable one after it; returns the index read.
template <class Read>
Index first_readable(const Source& src, Index idx, const Read& read) {
  const Index n = src.size();
  for (Index tries = 0; tries < n; ++tries, idx = (idx + 1) % n) {
    if (src.known_unreadable(idx)) continue;
    try {
      read(idx);
      return idx;
    } catch (const Error& e) {
      src.report_unreadable(idx, e.what());
    }
  }
  throw Error(fmt::format("none of the {} images of the data set is readable", n));
}
}  // namespace

Index read_or_replace(const Source& src, Index idx, int min_side, Planar& px) {
  return first_readable(src, idx, [&](Index i) { src.read(i, min_side, px); });
}

Index read_region_or_replace(const Source& src, Index idx, int min_side, const RegionPicker& pick,
                             Planar& px) {
  return first_readable(src, idx, [&](Index i) { src.read_region(i, min_side, pick, px); });
}

void make_source_batch(const Source& src, const Index* indices, Index B, const BatchConfig& cfg,
                       bool train, uint64_t seed, uint64_t epoch, float* images, float* targets,
                       int32_t* labels) {
  const Index K = src.num_classes(), C = src.channels(), S = cfg.img_size;
  if (const ImageDataset* d = src.memory()) {
    make_batch(*d, indices, B, cfg, train, seed, epoch, images, targets);
    if (labels)
      for (Index b = 0; b < B; ++b) labels[b] = d->labels[size_t(indices[b] % d->n)];
    return;
  }
  const std::unique_ptr<RandAugment> ra = make_rand_augment(cfg, train);
  const int min_side = decode_min_side(cfg, train);
  Planar px;
  for (Index b = 0; b < B; ++b) {
    // The slot's own stream, so a replaced sample is not a copy of its other occurrence. The
    // crop is drawn from it once the decoded size is known, and only the crop is decoded.
    const uint64_t sample_seed = mix_seed(seed, epoch, uint64_t(indices[b]));
    Index h = 0, w = 0;
    CropBox part;
    const RegionPicker pick = [&](int ph, int pw) {
      h = ph;
      w = pw;
      part = timm_sample_reads(h, w, cfg, train, Rng(sample_seed));
      return Rect{int(part.top), int(part.left), int(part.height), int(part.width)};
    };
    const Index used = read_region_or_replace(src, indices[b] % src.size(), min_side, pick, px);
    VIT_CHECK(px.c == C, fmt::format("sample {} has {} channels, expected {}", used, px.c, C));
    Rng rng(sample_seed);
    {
      StageScope clock(Stage::Augment);
      timm_sample_part(px.px.data(), C, h, w, part, cfg, ra.get(), train, rng,
                       images + b * C * S * S);
    }
    const int32_t label = src.label(used);
    smoothed_one_hot(label, K, cfg.smoothing, targets + b * K);
    if (labels) labels[b] = label;
  }
}

}  // namespace vit::data
