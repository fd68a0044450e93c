#include "data/batch.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "core/rng.h"
#include "data/augment.h"
#include "data/randaugment.h"

namespace vit::data {

std::vector<Index> epoch_order(Index n, uint64_t seed, uint64_t epoch) {
  std::vector<Index> order(n);
  std::iota(order.begin(), order.end(), Index(0));
  Rng rng(mix_seed(seed, 0x0e0c, epoch));
  for (Index i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(uint64_t(i + 1))]);
  return order;
}

std::vector<Index> epoch_order_repeated(Index n, uint64_t seed, uint64_t epoch, int repeats) {
  VIT_CHECK(repeats >= 1, "repeated augmentation: repeats must be >= 1");
  std::vector<Index> order = epoch_order(n, seed, epoch);
  if (repeats == 1) return order;
  std::vector<Index> out;  // (n) virtual indices
  out.reserve(size_t(n));
  for (Index i = 0; Index(out.size()) < n; ++i)
    for (int r = 0; r < repeats && Index(out.size()) < n; ++r) out.push_back(order[i] + r * n);
  return out;
}

namespace {
// Bilinear sample (align_corners=False) of one channel plane (h, w) at output pixel (y, x) of
// an (oh, ow) resize; out-of-range source coordinates clamp to the border.
float bilinear(const uint8_t* plane, Index h, Index w, Index oh, Index ow, Index y, Index x) {
  const float sy = std::max(0.0f, (y + 0.5f) * float(h) / float(oh) - 0.5f);
  const float sx = std::max(0.0f, (x + 0.5f) * float(w) / float(ow) - 0.5f);
  const Index y0 = std::min<Index>(Index(sy), h - 1), x0 = std::min<Index>(Index(sx), w - 1);
  const Index y1 = std::min<Index>(y0 + 1, h - 1), x1 = std::min<Index>(x0 + 1, w - 1);
  const float fy = sy - y0, fx = sx - x0;
  const float top = plane[y0 * w + x0] * (1 - fx) + plane[y0 * w + x1] * fx;
  const float bot = plane[y1 * w + x0] * (1 - fx) + plane[y1 * w + x1] * fx;
  return top * (1 - fy) + bot * fy;
}
}  // namespace

bool uses_timm_pipeline(const BatchConfig& cfg, bool train) {
  if (!train) return cfg.eval_crop_pct > 0;
  return cfg.rrc || cfg.color_jitter > 0 || cfg.reprob > 0 || !cfg.auto_augment.empty();
}

std::unique_ptr<RandAugment> make_rand_augment(const BatchConfig& cfg, bool train) {
  if (!train || cfg.auto_augment.empty()) return nullptr;
  return std::make_unique<RandAugment>(parse_rand_augment(cfg.auto_augment, cfg.magnitude_override),
                                       fill_mean_pixel(cfg.mean), cfg.interpolation);
}

void timm_sample(const uint8_t* src, Index C, Index h, Index w, const BatchConfig& cfg,
                 const RandAugment* ra, bool train, Rng& rng, float* dst) {
  timm_sample_part(src, C, h, w, CropBox{0, 0, h, w}, cfg, ra, train, rng, dst);
}

CropBox timm_sample_reads(Index h, Index w, const BatchConfig& cfg, bool train, Rng rng) {
  if (train && cfg.rrc)
    return sample_rrc(rng, h, w, cfg.scale_lo, cfg.scale_hi, cfg.ratio_lo, cfg.ratio_hi);
  return CropBox{0, 0, h, w};
}

void timm_sample_part(const uint8_t* src, Index C, Index h, Index w, const CropBox& part,
                      const BatchConfig& cfg, const RandAugment* ra, bool train, Rng& rng,
                      float* dst) {
  const bool whole = part.top == 0 && part.left == 0 && part.height == h && part.width == w;
  VIT_CHECK(whole || (train && cfg.rrc),
            "timm_sample_part: only a training crop reads part of the image");
  const Index S = cfg.img_size;
  std::vector<uint8_t> img(C * S * S);  // (C, S, S)
  if (!train) {
    if (cfg.eval_crop_pct > 0)
      eval_resize_crop(src, C, h, w, img.data(), S, cfg.eval_crop_pct,
                       parse_interp(cfg.eval_interpolation));
    else
      resize_pil(src, C, h, w, CropBox{0, 0, h, w}, img.data(), S, S,
                 parse_interp(cfg.eval_interpolation));
  } else {
    const CropBox box =
        cfg.rrc ? sample_rrc(rng, h, w, cfg.scale_lo, cfg.scale_hi, cfg.ratio_lo, cfg.ratio_hi)
                : CropBox{0, 0, h, w};
    VIT_CHECK(box.top >= part.top && box.left >= part.left &&
                  box.top + box.height <= part.top + part.height &&
                  box.left + box.width <= part.left + part.width,
              "timm_sample_part: the crop reads outside the part of the image given");
    const Interp interp = train_interp(cfg.interpolation, rng);
    // The box in the part's coordinates: the resize reads only the box, so the result is the
    // whole image's.
    const CropBox in_part{box.top - part.top, box.left - part.left, box.height, box.width};
    resize_pil(src, C, part.height, part.width, in_part, img.data(), S, S, interp);
    if (cfg.hflip > 0 && rng.uniform() < cfg.hflip) hflip(img.data(), C, S, S);
    if (ra)
      ra->apply(rng, img.data(), C, S, S);
    else if (cfg.color_jitter > 0)
      color_jitter(rng, img.data(), C, S, S, cfg.color_jitter);
  }
  for (Index c = 0; c < C; ++c) {
    const float scale = 1.0f / (255.0f * cfg.std[c]), bias = cfg.mean[c] / cfg.std[c];
    for (Index i = 0; i < S * S; ++i) dst[c * S * S + i] = img[c * S * S + i] * scale - bias;
  }
  if (train && cfg.reprob > 0) random_erasing(rng, dst, C, S, S, cfg.reprob);
}

void smoothed_one_hot(int32_t label, Index K, double smoothing, float* targets) {
  const float off = K > 1 ? float(smoothing / K) : 0.0f;
  const float on = float(1.0 - smoothing) + off;
  for (Index k = 0; k < K; ++k) targets[k] = off;
  targets[label] = on;
}

void widen_targets(float* targets, Index B, Index from_k, Index to_k) {
  if (from_k == to_k) return;
  for (Index b = B - 1; b >= 0; --b) {  // back to front: rows only move to higher addresses
    std::copy_backward(targets + b * from_k, targets + (b + 1) * from_k,
                       targets + b * to_k + from_k);
    std::fill(targets + b * to_k + from_k, targets + (b + 1) * to_k, 0.0f);
  }
}

void make_batch(const ImageDataset& d, const Index* indices, Index B, const BatchConfig& cfg,
                bool train, uint64_t seed, uint64_t epoch, float* images, float* targets) {
  if (uses_timm_pipeline(cfg, train)) {
    const Index K = d.num_classes, S = cfg.img_size;
    const float off = K > 1 ? float(cfg.smoothing / K) : 0.0f;
    const float on = float(1.0 - cfg.smoothing) + off;
    const std::unique_ptr<RandAugment> ra = make_rand_augment(cfg, train);
#pragma omp parallel for schedule(static)
    for (Index b = 0; b < B; ++b) {
      const Index idx = indices[b] % d.n;  // (virtual index: see epoch_order_repeated)
      Rng rng(mix_seed(seed, epoch, uint64_t(indices[b])));
      const Index C = d.channels, h = d.height, w = d.width;
      timm_sample(d.pixels.data() + idx * C * h * w, C, h, w, cfg, ra.get(), train, rng,
                  images + b * C * S * S);
      float* t = targets + b * K;
      for (Index k = 0; k < K; ++k) t[k] = off;
      t[d.labels[idx]] = on;
    }
    return;
  }
  const Index C = d.channels, h = d.height, w = d.width, S = cfg.img_size, K = d.num_classes;
  const float off = K > 1 ? float(cfg.smoothing / K) : 0.0f;
  const float on = float(1.0 - cfg.smoothing) + off;
#pragma omp parallel for schedule(static)
  for (Index b = 0; b < B; ++b) {
    const Index idx = indices[b] % d.n;  // (virtual index: see epoch_order_repeated)
    Rng rng(mix_seed(seed, epoch, uint64_t(indices[b])));
    const int pad = train ? cfg.crop_padding : 0;
    // Random crop offset in the zero-padded source (in source pixels), and flip.
    const Index dy = pad ? Index(rng.below(2 * pad + 1)) - pad : 0;
    const Index dx = pad ? Index(rng.below(2 * pad + 1)) - pad : 0;
    const bool flip = train && cfg.hflip > 0 && rng.uniform() < cfg.hflip;
    const uint8_t* src = d.pixels.data() + idx * C * h * w;
    float* dst = images + b * C * S * S;  // (C, S, S)
    for (Index c = 0; c < C; ++c) {
      const uint8_t* plane = src + c * h * w;
      const float scale = 1.0f / (255.0f * cfg.std[c]), bias = cfg.mean[c] / cfg.std[c];
      for (Index y = 0; y < S; ++y)
        for (Index x = 0; x < S; ++x) {
          const Index xs = flip ? S - 1 - x : x;
          float v;
          if (S == h && S == w) {
            const Index yy = y + dy, xx = xs + dx;
            v = (yy < 0 || yy >= h || xx < 0 || xx >= w) ? 0.0f : plane[yy * w + xx];
          } else {
            // Resize first, then shift by the crop offset scaled to the output size.
            const Index yy = y + dy * S / h, xx = xs + dx * S / w;
            v = (yy < 0 || yy >= S || xx < 0 || xx >= S) ? 0.0f
                                                         : bilinear(plane, h, w, S, S, yy, xx);
          }
          dst[(c * S + y) * S + x] = v * scale - bias;
        }
    }
    float* t = targets + b * K;
    for (Index k = 0; k < K; ++k) t[k] = off;
    t[d.labels[idx]] = on;
  }
}

}  // namespace vit::data
