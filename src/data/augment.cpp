#include "data/augment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace vit::data {

Interp parse_interp(const std::string& name) {
  if (name == "bilinear") return Interp::Bilinear;
  if (name == "bicubic") return Interp::Bicubic;
  throw Error(fmt::format("unknown interpolation '{}' (expected bilinear or bicubic)", name));
}

Interp train_interp(const std::string& name, Rng& rng) {
  if (name == "random") return rng.uniform() < 0.5 ? Interp::Bilinear : Interp::Bicubic;
  return parse_interp(name);
}

namespace {

// Python's random.randint(lo, hi): inclusive on both ends.
Index randint(Rng& rng, Index lo, Index hi) {
  return lo + Index(rng.below(uint64_t(hi - lo + 1)));
}
// Python's round(): half to even (the default FP rounding mode).
Index pyround(double v) {
  return Index(std::nearbyint(v));
}

double filter_value(Interp f, double x) {
  x = std::fabs(x);
  if (f == Interp::Bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  const double a = -0.5;  // PIL's bicubic
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

constexpr int kPrecision = kPilPrecision;

}  // namespace

PilCoeffs pil_coeffs(Index in_size, Index out_size, Interp f) {
  const double scale = double(in_size) / double(out_size);
  const double fscale = std::max(scale, 1.0);  // widen the filter when down-scaling
  const double support = (f == Interp::Bilinear ? 1.0 : 2.0) * fscale;
  PilCoeffs c;
  c.ksize = Index(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.k.assign(out_size * c.ksize, 0);
  std::vector<double> w(c.ksize);
  for (Index o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    const Index lo = std::max<Index>(Index(center - support + 0.5), 0);
    const Index hi = std::min<Index>(Index(center + support + 0.5), in_size);
    double sum = 0.0;
    for (Index x = 0; x < hi - lo; ++x)
      sum += (w[x] = filter_value(f, (x + lo - center + 0.5) / fscale));
    for (Index x = 0; x < hi - lo; ++x) {
      const double v = (sum != 0.0 ? w[x] / sum : w[x]) * double(1 << kPrecision);
      c.k[o * c.ksize + x] = int32_t(v < 0 ? -0.5 + v : 0.5 + v);
    }
    c.first[o] = lo;
    c.count[o] = hi - lo;
  }
  return c;
}

namespace {

uint8_t clip8(int32_t acc) {
  return uint8_t(std::clamp(acc >> kPrecision, 0, 255));
}

}  // namespace

CropBox sample_rrc(Rng& rng, Index H, Index W, double scale_lo, double scale_hi, double ratio_lo,
                   double ratio_hi) {
  const double area = double(H) * double(W);
  const double lr0 = std::log(ratio_lo), lr1 = std::log(ratio_hi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (scale_lo + (scale_hi - scale_lo) * rng.uniform());
    const double aspect = std::exp(lr0 + (lr1 - lr0) * rng.uniform());
    const Index w = pyround(std::sqrt(target * aspect)), h = pyround(std::sqrt(target / aspect));
    if (0 < w && w <= W && 0 < h && h <= H) {  // torchvision's test
      const Index top = randint(rng, 0, H - h), left = randint(rng, 0, W - w);
      return {top, left, h, w};
    }
  }
  // Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = double(W) / double(H);
  Index w = W, h = H;
  if (in_ratio < std::min(ratio_lo, ratio_hi))
    h = pyround(w / std::min(ratio_lo, ratio_hi));
  else if (in_ratio > std::max(ratio_lo, ratio_hi))
    w = pyround(h * std::max(ratio_lo, ratio_hi));
  return {(H - h) / 2, (W - w) / 2, h, w};
}

void resize_pil(const uint8_t* src, Index C, Index H, Index W, const CropBox& box, uint8_t* dst,
                Index oh, Index ow, Interp interp) {
  // torchvision resized_crop on PIL crops first, so the filter never reads outside the box.
  const Index bh = box.height, bw = box.width;
  const bool need_h = ow != bw, need_v = oh != bh;
  const PilCoeffs ch = need_h ? pil_coeffs(bw, ow, interp) : PilCoeffs{};
  const PilCoeffs cv = need_v ? pil_coeffs(bh, oh, interp) : PilCoeffs{};
  const Index tw = need_h ? ow : bw;
  std::vector<uint8_t> tmp(bh * tw);              // (bh, tw) one channel after the horizontal pass
  std::vector<int32_t> acc(ow);                   // (ow) one output row of the vertical pass
  std::vector<uint8_t> tr(need_h ? bw * bh : 0);  // (bw, bh) the box of one channel, transposed
  std::vector<int32_t> col(need_h ? bh : 0);      // (bh) one output column of the horizontal pass
  for (Index c = 0; c < C; ++c) {
    const uint8_t* plane = src + c * H * W;
    if (!need_h) {
      for (Index y = 0; y < bh; ++y) {
        const uint8_t* row = plane + (box.top + y) * W + box.left;
        std::copy(row, row + tw, tmp.data() + y * tw);
      }
    } else {
      // The horizontal pass on the transposed box, so that it too accumulates whole contiguous
      // rows (vectorised) instead of gathering a few taps per output pixel.
      for (Index y = 0; y < bh; ++y) {
        const uint8_t* row = plane + (box.top + y) * W + box.left;
        for (Index x = 0; x < bw; ++x) tr[x * bh + y] = row[x];
      }
      for (Index x = 0; x < tw; ++x) {
        std::fill(col.begin(), col.end(), 1 << (kPrecision - 1));
        const int32_t* k = ch.k.data() + x * ch.ksize;
        for (Index t = 0; t < ch.count[x]; ++t) {
          const uint8_t* r = tr.data() + (ch.first[x] + t) * bh;
          const int32_t w = k[t];
          for (Index y = 0; y < bh; ++y) col[y] += r[y] * w;
        }
        for (Index y = 0; y < bh; ++y) tmp[y * tw + x] = clip8(col[y]);
      }
    }
    uint8_t* out = dst + c * oh * ow;
    if (!need_v) {
      std::copy(tmp.begin(), tmp.begin() + oh * ow, out);
      continue;
    }
    // Row-wise accumulation: the same integer sums as PIL's per-pixel loop (exact, so the order
    // does not matter), but the inner loop runs along a contiguous row and vectorises.
    for (Index y = 0; y < oh; ++y) {
      std::fill(acc.begin(), acc.end(), 1 << (kPrecision - 1));
      const int32_t* k = cv.k.data() + y * cv.ksize;
      for (Index t = 0; t < cv.count[y]; ++t) {
        const uint8_t* r = tmp.data() + (cv.first[y] + t) * tw;
        const int32_t w = k[t];
        for (Index x = 0; x < ow; ++x) acc[x] += r[x] * w;
      }
      for (Index x = 0; x < ow; ++x) out[y * ow + x] = clip8(acc[x]);
    }
  }
}

void hflip(uint8_t* img, Index C, Index H, Index W) {
  for (Index r = 0; r < C * H; ++r) std::reverse(img + r * W, img + (r + 1) * W);
}

void adjust_brightness(uint8_t* img, Index C, Index H, Index W, double factor) {
  apply_pixel_step(make_pixel_step(RaOp::Brightness, factor, false, H, W), img, C, H, W, {});
}

void adjust_contrast(uint8_t* img, Index C, Index H, Index W, double factor) {
  apply_pixel_step(make_pixel_step(RaOp::Contrast, factor, false, H, W), img, C, H, W, {});
}

void adjust_saturation(uint8_t* img, Index C, Index H, Index W, double factor) {
  apply_pixel_step(make_pixel_step(RaOp::Color, factor, false, H, W), img, C, H, W, {});
}

void plan_color_jitter(Rng& rng, double strength, Index H, Index W, PixelStep steps[3]) {
  int order[3] = {0, 1, 2};
  for (int i = 2; i > 0; --i) std::swap(order[i], order[rng.below(uint64_t(i + 1))]);
  double f[3];
  for (double& v : f) v = std::max(0.0, 1.0 - strength + 2.0 * strength * rng.uniform());
  constexpr RaOp kOp[3] = {RaOp::Brightness, RaOp::Contrast, RaOp::Color};
  for (int k = 0; k < 3; ++k) steps[k] = make_pixel_step(kOp[order[k]], f[order[k]], false, H, W);
}

void color_jitter(Rng& rng, uint8_t* img, Index C, Index H, Index W, double strength) {
  PixelStep steps[3];
  plan_color_jitter(rng, strength, H, W, steps);
  for (const PixelStep& s : steps) apply_pixel_step(s, img, C, H, W, {});
}

ErasePlan draw_erasing(Rng& rng, Index H, Index W, double probability) {
  ErasePlan e;
  if (rng.uniform() >= probability) return e;
  const double area = double(H) * double(W);
  const double lr0 = std::log(0.3), lr1 = std::log(1.0 / 0.3);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (0.02 + (1.0 / 3.0 - 0.02) * rng.uniform());
    const double aspect = std::exp(lr0 + (lr1 - lr0) * rng.uniform());
    const Index h = pyround(std::sqrt(target * aspect)), w = pyround(std::sqrt(target / aspect));
    if (w < W && h < H) {
      e.top = int32_t(randint(rng, 0, H - h));
      e.left = int32_t(randint(rng, 0, W - w));
      e.h = int32_t(h);
      e.w = int32_t(w);
      e.key = rng.next();
      return e;
    }
  }
  return e;
}

void apply_erasing(const ErasePlan& e, float* img, Index C, Index H, Index W) {
  const float* table = erase_noise_table().data();
  for (Index c = 0; c < C; ++c)
    for (Index y = 0; y < e.h; ++y)
      for (Index x = 0; x < e.w; ++x)
        img[(c * H + e.top + y) * W + e.left + x] =
            erase_noise(table, e.key, uint64_t((c * e.h + y) * e.w + x));
}

void random_erasing(Rng& rng, float* img, Index C, Index H, Index W, double probability) {
  apply_erasing(draw_erasing(rng, H, W, probability), img, C, H, W);
}

CenterCrop eval_center_crop(Index H, Index W, Index size, double crop_pct) {
  if (crop_pct <= 0) return {size, size, 0, 0};
  const Index scale = Index(std::floor(double(size) / crop_pct));
  // torchvision Resize(int): shorter side -> scale, longer side truncated proportionally.
  const Index rh = H <= W ? scale : Index(double(scale) * H / W);
  const Index rw = H <= W ? Index(double(scale) * W / H) : scale;
  return {rh, rw, pyround((rh - size) / 2.0), pyround((rw - size) / 2.0)};
}

void eval_resize_crop(const uint8_t* src, Index C, Index H, Index W, uint8_t* dst, Index size,
                      double crop_pct, Interp interp) {
  const CenterCrop cc = eval_center_crop(H, W, size, crop_pct);
  const Index rh = cc.resized_h, rw = cc.resized_w;
  std::vector<uint8_t> resized(C * rh * rw);  // (C, rh, rw)
  resize_pil(src, C, H, W, {0, 0, H, W}, resized.data(), rh, rw, interp);
  for (Index c = 0; c < C; ++c)
    for (Index y = 0; y < size; ++y)
      std::copy_n(resized.data() + (c * rh + cc.top + y) * rw + cc.left, size,
                  dst + (c * size + y) * size);
}

namespace {
// Marsaglia-Tsang gamma variate; shape < 1 boosted by U^(1/a).
double sample_gamma(Rng& rng, double a) {
  if (a < 1.0) return sample_gamma(rng, a + 1.0) * std::pow(rng.uniform() + 1e-300, 1.0 / a);
  const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = rng.normal();
    double v = 1.0 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = rng.uniform();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u + 1e-300) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}
}  // namespace

double sample_beta(Rng& rng, double a) {
  const double x = sample_gamma(rng, a), y = sample_gamma(rng, a);
  return x + y > 0 ? x / (x + y) : 0.5;
}

BatchMix MixupResult::batch_mix() const {
  BatchMix m;
  m.lam = cutmix ? 1.0f : float(lam);
  m.cutmix = cutmix ? 1 : 0;
  m.y0 = int32_t(y0), m.y1 = int32_t(y1), m.x0 = int32_t(x0), m.x1 = int32_t(x1);
  return m;
}

MixupResult draw_mixup(const MixupConfig& cfg, Index B, Index S, uint64_t seed, uint64_t epoch,
                       uint64_t batch_index) {
  MixupResult r;
  const bool mix = cfg.mixup_alpha > 0, cut = cfg.cutmix_alpha > 0;
  if ((!mix && !cut) || B < 2) return r;
  Rng rng(mix_seed(seed ^ 0x6d69787570ULL, epoch, batch_index));
  if (rng.uniform() >= cfg.prob) return r;
  r.cutmix = cut && (!mix || rng.uniform() < cfg.switch_prob);
  r.lam = sample_beta(rng, r.cutmix ? cfg.cutmix_alpha : cfg.mixup_alpha);
  if (r.cutmix) {
    const double cut_ratio = std::sqrt(1.0 - r.lam);
    const Index ch = Index(S * cut_ratio), cw = Index(S * cut_ratio);
    const Index cy = Index(rng.below(uint64_t(S))), cx = Index(rng.below(uint64_t(S)));
    r.y0 = std::clamp<Index>(cy - ch / 2, 0, S);
    r.y1 = std::clamp<Index>(cy + ch / 2, 0, S);
    r.x0 = std::clamp<Index>(cx - cw / 2, 0, S);
    r.x1 = std::clamp<Index>(cx + cw / 2, 0, S);
    r.lam = 1.0 - double((r.y1 - r.y0) * (r.x1 - r.x0)) / double(S * S);  // timm correct_lam
  }
  return r;
}

void mix_images(const BatchMix& mix, float* images, Index B, Index C, Index S) {
  if (mix.none()) return;
  // Pairs (b, B-1-b) together, in place (timm mixes with a flipped copy); an odd batch's
  // middle sample mixes with itself.
  for (Index b = 0; b <= (B - 1) / 2; ++b) {
    float* own = images + b * C * S * S;                // (C, S, S)
    float* partner = images + (B - 1 - b) * C * S * S;  // (C, S, S)
    for (Index c = 0; c < C; ++c)
      for (Index y = 0; y < S; ++y)
        for (Index x = 0; x < S; ++x) {
          const Index i = (c * S + y) * S + x;
          const float a = own[i], o = partner[i];
          if (mix.cutmix) {
            if (mix.in_box(y, x)) own[i] = o, partner[i] = a;
          } else {
            own[i] = mix_value(a, o, mix.lam);
            partner[i] = mix_value(o, a, mix.lam);
          }
        }
  }
}

void mix_targets(const MixupResult& r, float* targets, Index B, Index K) {
  if (r.lam == 1.0) return;
  const float l = float(r.lam);
  for (Index b = 0; b <= (B - 1) / 2; ++b)
    for (Index k = 0; k < K; ++k) {
      float& own = targets[b * K + k];
      float& partner = targets[(B - 1 - b) * K + k];
      const float a = own, o = partner;
      own = mix_value(a, o, l);
      partner = mix_value(o, a, l);
    }
}

MixupResult apply_mixup(const MixupConfig& cfg, float* images, float* targets, Index B, Index C,
                        Index S, Index K, uint64_t seed, uint64_t epoch, uint64_t batch_index) {
  const MixupResult r = draw_mixup(cfg, B, S, seed, epoch, batch_index);
  mix_images(r.batch_mix(), images, B, C, S);
  mix_targets(r, targets, B, K);
  return r;
}

}  // namespace vit::data
