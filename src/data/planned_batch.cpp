#include "data/planned_batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "data/augment.h"
#include "data/randaugment.h"
#include "data/source_batch.h"
#include "data/stage_clock.h"

namespace vit::data {

namespace {

// The table of one axis: outputs [offset, offset + S) of a resize from `in` to `full` pixels,
// with `first` relative to lo, the first input pixel any tap reads ([lo, hi) is what to ship).
struct AxisPlan {
  Index ksize = 1, lo = 0, hi = 0;
  std::vector<int32_t> first, count, k;  // (S), (S), (S, ksize)
};

AxisPlan plan_axis(Index in, Index full, Index offset, Index S, Interp interp) {
  AxisPlan a;
  a.first.resize(size_t(S));
  a.count.assign(size_t(S), 1);
  if (in == full) {  // PIL skips the pass: the unit table copies
    a.k.assign(size_t(S), int32_t(1) << kPilPrecision);
    for (Index i = 0; i < S; ++i) a.first[size_t(i)] = int32_t(offset + i);
  } else {
    const PilCoeffs c = pil_coeffs(in, full, interp);
    a.ksize = c.ksize;
    a.k.assign(size_t(S * c.ksize), 0);
    for (Index i = 0; i < S; ++i) {
      const Index o = offset + i;
      a.first[size_t(i)] = int32_t(c.first[size_t(o)]);
      a.count[size_t(i)] = int32_t(c.count[size_t(o)]);
      std::copy_n(c.k.begin() + o * c.ksize, c.ksize, a.k.begin() + i * c.ksize);
    }
  }
  a.lo = in;
  for (Index i = 0; i < S; ++i) {
    a.lo = std::min<Index>(a.lo, a.first[size_t(i)]);
    a.hi = std::max<Index>(a.hi, a.first[size_t(i)] + a.count[size_t(i)]);
  }
  for (int32_t& f : a.first) f -= int32_t(a.lo);
  return a;
}

int32_t append_table(const AxisPlan& a, std::vector<int32_t>& tables) {
  const size_t at = tables.size();
  VIT_CHECK(at <= size_t(INT32_MAX), "planned batch: resampling tables exceed 2^31 entries");
  tables.insert(tables.end(), a.first.begin(), a.first.end());
  tables.insert(tables.end(), a.count.begin(), a.count.end());
  tables.insert(tables.end(), a.k.begin(), a.k.end());
  return int32_t(at);
}

}  // namespace

void PlannedBatch::clear(Index channels, Index side) {
  C = channels;
  S = side;
  pixels.clear();
  tables.clear();
  samples.clear();
  scratch_bytes = 0;
  step_slots = 0;
  steps.clear();
  fill = PixelFill{};
  mix = BatchMix{};
  lowfreq = LowFreqPass{};
}

bool plannable(const Source& src, const BatchConfig& cfg, bool train) {
  // In-memory sets outside the timm pipeline take make_batch's own (pad-crop, float bilinear)
  // path, which is not a PIL resize.
  return !src.memory() || uses_timm_pipeline(cfg, train);
}

int32_t pixel_step_slots(const BatchConfig& cfg, const RandAugment* ra, bool train) {
  VIT_CHECK(!train || cfg.auto_augment.empty() == !ra,
            "planned batches: --aa needs its RandAugment (make_rand_augment)");
  if (!train) return 0;
  return ra ? ra->num_ops() : cfg.color_jitter > 0 ? 3 : 0;
}

std::vector<float> normalize_lut(const BatchConfig& cfg, Index C) {
  VIT_CHECK(Index(cfg.mean.size()) >= C && Index(cfg.std.size()) >= C,
            "normalize_lut: mean/std have fewer entries than the image has channels");
  std::vector<float> lut(size_t(C * 256));  // (C, 256)
  for (Index c = 0; c < C; ++c) {
    const float scale = 1.0f / (255.0f * cfg.std[size_t(c)]);
    const float bias = cfg.mean[size_t(c)] / cfg.std[size_t(c)];
    for (int v = 0; v < 256; ++v) {
      const uint8_t byte = uint8_t(v);
      lut[size_t(c * 256 + v)] = byte * scale - bias;  // timm_sample's expression
    }
  }
  return lut;
}

namespace {

// A sample's plan before any pixel is read: timm_sample's draws, in its order, the resampling
// tables, and the part of the (h, w) source image they read.
struct SampleDraw {
  AxisPlan hx, vy;
  CropBox box{};
  Interp interp{};
  bool flip = false;
  ErasePlan erase;
  std::vector<PixelStep> steps;  // (slots)
  Rect region() const {
    return Rect{int(box.top + vy.lo), int(box.left + hx.lo), int(vy.hi - vy.lo),
                int(hx.hi - hx.lo)};
  }
};

SampleDraw draw_sample(Index h, Index w, Index S, const BatchConfig& cfg, const RandAugment* ra,
                       bool train, int32_t slots, Rng& rng) {
  SampleDraw d;
  d.box = CropBox{0, 0, h, w};
  d.steps.resize(size_t(slots));
  // Where the output comes from: a box of src resized to (full_h, full_w), of which the S x S
  // window at (off_y, off_x) is kept (off 0 and full S, except for the eval centre crop).
  Index full_h = S, full_w = S, off_y = 0, off_x = 0;
  if (train) {  // timm_sample's draws, in its order
    if (cfg.rrc)
      d.box = sample_rrc(rng, h, w, cfg.scale_lo, cfg.scale_hi, cfg.ratio_lo, cfg.ratio_hi);
    d.interp = train_interp(cfg.interpolation, rng);
    d.flip = cfg.hflip > 0 && rng.uniform() < cfg.hflip;
    if (ra)
      ra->plan(rng, S, S, d.steps.data());
    else if (slots)
      plan_color_jitter(rng, cfg.color_jitter, S, S, d.steps.data());
    if (cfg.reprob > 0) d.erase = draw_erasing(rng, S, S, cfg.reprob);
  } else {
    d.interp = parse_interp(cfg.eval_interpolation);
    const CenterCrop cc = eval_center_crop(h, w, S, cfg.eval_crop_pct);
    full_h = cc.resized_h;
    full_w = cc.resized_w;
    off_y = cc.top;
    off_x = cc.left;
  }
  d.hx = plan_axis(d.box.width, full_w, off_x, S, d.interp);
  d.vy = plan_axis(d.box.height, full_h, off_y, S, d.interp);
  return d;
}

// Appends the drawn sample; its source pixels are the region of the planar (C, ph, pw) image
// px at (top, left) (the whole image, or only the region when that is what was decoded).
void add_sample(const SampleDraw& d, const uint8_t* px, Index C, Index ph, Index pw, Index top,
                Index left, PlannedBatch& batch) {
  const Rect r = d.region();
  VIT_CHECK(top + r.height <= ph && left + r.width <= pw,
            "planned batch: the sample's pixels do not cover its crop");
  ResizeSample s;
  s.bh = r.height;
  s.bw = r.width;
  s.pixels = int64_t(batch.pixels.size());
  s.rows = batch.scratch_bytes;
  s.h_table = append_table(d.hx, batch.tables);
  s.h_ksize = int32_t(d.hx.ksize);
  s.v_table = append_table(d.vy, batch.tables);
  s.v_ksize = int32_t(d.vy.ksize);
  s.flip = d.flip ? 1 : 0;
  s.erase = d.erase;
  batch.steps.insert(batch.steps.end(), d.steps.begin(), d.steps.end());
  batch.pixels.resize(batch.pixels.size() + size_t(C * s.bh * s.bw));
  uint8_t* crop = batch.pixels.data() + s.pixels;  // (C, bh, bw)
  for (Index c = 0; c < C; ++c)
    for (Index y = 0; y < s.bh; ++y)
      std::copy_n(px + (c * ph + top + y) * pw + left, s.bw, crop + (c * s.bh + y) * s.bw);
  batch.scratch_bytes += int64_t(C) * s.bh * batch.S;
  batch.samples.push_back(s);
}

// The batch's per-batch settings from its first sample; every later one must agree.
int32_t begin_sample(Index C, const BatchConfig& cfg, const RandAugment* ra, bool train,
                     PlannedBatch& batch) {
  VIT_CHECK(C == batch.C, fmt::format("plan_sample: {} channels, the batch has {}", C, batch.C));
  const int32_t slots = pixel_step_slots(cfg, ra, train);
  if (batch.size() == 0) {
    batch.step_slots = slots;
    if (ra) batch.fill = ra->fill();
  }
  VIT_CHECK(slots == batch.step_slots, "plan_sample: samples of one batch differ in their ops");
  return slots;
}

}  // namespace

void plan_sample(const uint8_t* src, Index C, Index h, Index w, const BatchConfig& cfg,
                 const RandAugment* ra, bool train, Rng& rng, PlannedBatch& batch) {
  const int32_t slots = begin_sample(C, cfg, ra, train, batch);
  const SampleDraw d = draw_sample(h, w, batch.S, cfg, ra, train, slots, rng);
  const Rect r = d.region();
  add_sample(d, src, C, h, w, r.top, r.left, batch);
}

void make_planned_batch(const Source& src, const Index* indices, Index B, const BatchConfig& cfg,
                        bool train, uint64_t seed, uint64_t epoch, PlannedBatch& batch,
                        float* targets, int32_t* labels) {
  VIT_CHECK(plannable(src, cfg, train),
            "planned batches: an in-memory set's pad-and-crop path runs on the CPU");
  const Index K = src.num_classes(), C = src.channels();
  batch.clear(C, cfg.img_size);
  const std::unique_ptr<RandAugment> ra = make_rand_augment(cfg, train);
  const int min_side = decode_min_side(cfg, train);
  Planar px;
  for (Index b = 0; b < B; ++b) {
    const int32_t slots = begin_sample(C, cfg, ra.get(), train, batch);
    // The sample is drawn once its decoded size is known, and only the pixels its crop reads
    // are decoded. The slot's own stream (as make_source_batch), drawn afresh for each sample
    // tried, so a replaced sample draws what make_source_batch would.
    const uint64_t sample_seed = mix_seed(seed, epoch, uint64_t(indices[b]));
    SampleDraw d;
    const RegionPicker pick = [&](int h, int w) {
      StageScope clock(Stage::Augment);
      Rng rng(sample_seed);
      d = draw_sample(h, w, batch.S, cfg, ra.get(), train, slots, rng);
      return d.region();
    };
    const Index used = read_region_or_replace(src, indices[b] % src.size(), min_side, pick, px);
    VIT_CHECK(px.c == C, fmt::format("sample {} has {} channels, expected {}", used, px.c, C));
    {
      StageScope clock(Stage::Augment);
      add_sample(d, px.px.data(), C, px.h, px.w, 0, 0, batch);
    }
    const int32_t label = src.label(used);
    smoothed_one_hot(label, K, cfg.smoothing, targets + b * K);
    if (labels) labels[b] = label;
  }
}

}  // namespace vit::data
