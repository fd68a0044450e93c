// The uint8 image ops of timm's training pipeline that run after the resize and flip:
// RandAugment's ops and colour jitter's brightness / contrast / saturation, with PIL's
// arithmetic. A sample's ops are drawn on the host as PixelSteps (data/randaugment.h,
// data/augment.h: plan_color_jitter), so the same steps can run in the CPU pipeline
// (apply_pixel_step, core/pixel_step.cpp) and as batched ops on a planned batch
// (src/ops/{cpu,cuda}/pixel_steps: the --augment-on-device path).
// The per-pixel arithmetic below is shared by both backends; the files that use it compile
// without fused multiply-add contraction (-ffp-contract=off, nvcc --fmad=false), so the CPU
// and the GPU round every double and float operation alike and give the same bytes. The
// resampling's multiply-adds are fused explicitly (fma: one rounding on both; the CPU keeps the
// speed of its FMA units).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/common.h"
#include "core/host_device.h"

namespace vit {

enum class RaOp : int32_t {
  AutoContrast,
  Equalize,
  Invert,
  Rotate,
  Posterize,
  Solarize,
  SolarizeAdd,
  Color,
  Contrast,
  Brightness,
  Sharpness,
  ShearX,
  ShearY,
  TranslateXRel,
  TranslateYRel,
  PosterizeIncreasing,
  SolarizeIncreasing,
  ColorIncreasing,
  ContrastIncreasing,
  BrightnessIncreasing,
  SharpnessIncreasing
};

// The fill of geometric ops outside the source, per channel (a grey image uses v[0]).
struct PixelFill {
  uint8_t v[3] = {128, 128, 128};
};

// One op of one sample. Plain data: it travels to the device in the planned batch.
struct PixelStep {
  static constexpr int32_t kNone = -1;
  int32_t op = kNone;   // RaOp, or kNone (RandAugment's probability test said no)
  int32_t bicubic = 0;  // geometric ops: 1 bicubic, 0 bilinear sampling
  double arg = 0;       // the op's argument: factor, threshold, bits (ra_level_arg)
  double m[6] = {};     // geometric ops: PIL's inverse affine matrix (output -> source)

  VIT_HOST_DEVICE bool geometric() const {
    return op == int32_t(RaOp::Rotate) || op == int32_t(RaOp::ShearX) ||
           op == int32_t(RaOp::ShearY) || op == int32_t(RaOp::TranslateXRel) ||
           op == int32_t(RaOp::TranslateYRel);
  }
};

// The step of op with argument arg on an (H, W) image: the affine matrix of geometric ops
// (PIL Image.rotate / Image.transform(AFFINE) as timm calls them).
PixelStep make_pixel_step(RaOp op, double arg, bool bicubic, Index H, Index W);

// img (C, H, W) uint8, in place: the CPU implementation (the reference of the batched ops).
void apply_pixel_step(const PixelStep& step, uint8_t* img, Index C, Index H, Index W,
                      const PixelFill& fill);

// ---- Per-pixel arithmetic shared with the CUDA twin ----

// PIL L conversion (ITU-R 601-2 luma in 16-bit fixed point).
VIT_HOST_DEVICE inline uint8_t pil_luma(uint8_t r, uint8_t g, uint8_t b) {
  return uint8_t((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

// PIL Image.blend(degenerate, img, alpha) (ImageEnhance): float lerp truncated to uint8.
VIT_HOST_DEVICE inline uint8_t pil_blend(uint8_t deg, uint8_t v, float alpha) {
  const float t = float(deg) + alpha * (float(v) - float(deg));
  return t <= 0.0f ? 0 : t >= 255.0f ? 255 : uint8_t(t);
}

// The table value of byte i of a pointwise op that needs no image statistics (invert,
// posterize, solarize, solarize-add).
VIT_HOST_DEVICE inline uint8_t pointwise_value(int32_t op, double arg, int i) {
  switch (RaOp(op)) {
    case RaOp::Invert:
      return uint8_t(255 - i);
    case RaOp::Posterize:
    case RaOp::PosterizeIncreasing: {
      const int bits = int(arg);  // PIL's mask ~(2^(8 - bits) - 1) keeps nothing below 1 bit
      return bits >= 8 ? uint8_t(i) : bits <= 0 ? 0 : uint8_t(i & ~((1 << (8 - bits)) - 1));
    }
    case RaOp::Solarize:
    case RaOp::SolarizeIncreasing:
      return uint8_t(i < arg ? i : 255 - i);
    case RaOp::SolarizeAdd: {
      const int v = i + int(arg);
      return uint8_t(i < 128 ? (v < 255 ? v : 255) : i);
    }
    default:
      return uint8_t(i);
  }
}

// PIL ImageOps.autocontrast (cutoff 0) of byte i in a channel spanning [lo, hi], hi > lo.
VIT_HOST_DEVICE inline uint8_t autocontrast_value(int lo, int hi, int i) {
  const double scale = 255.0 / (hi - lo), offset = -lo * scale;
  const int v = int(i * scale + offset);
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

// PIL ImageOps.equalize's table from a channel's histogram (256 counts); false: PIL leaves the
// channel as it is (one distinct value, or too few pixels outside the last bin).
VIT_HOST_DEVICE inline bool equalize_table(const int64_t* hist, uint8_t* lut) {
  int64_t total = 0, last = 0, nonzero = 0;
  for (int i = 0; i < 256; ++i)
    if (hist[i]) total += hist[i], last = hist[i], ++nonzero;
  if (nonzero <= 1) return false;
  const int64_t step = (total - last) / 256;
  if (!step) return false;
  int64_t n = step / 2;
  for (int i = 0; i < 256; ++i) {
    const int64_t v = n / step;
    lut[i] = uint8_t(v < 255 ? v : 255);
    n += hist[i];
  }
  return true;
}

// PIL ImageFilter.SMOOTH (3x3, centre 5, others 1, /13) at an interior pixel of plane (H, W).
VIT_HOST_DEVICE inline uint8_t smooth_value(const uint8_t* plane, Index W, Index y, Index x) {
  int s = 4 * plane[y * W + x];
  for (Index dy = -1; dy <= 1; ++dy)
    for (Index dx = -1; dx <= 1; ++dx) s += plane[(y + dy) * W + x + dx];
  // PIL rounds s / 13 half away from zero; s >= 0 and s / 13 is never within 1/26 of a tie, so
  // that is (2 s + 13) div 26, in integers (vectorises).
  return uint8_t((2 * s + 13) / 26);
}

// PIL's geometric bicubic: cubic convolution with a = -1 through samples at -1, 0, 1, 2.
VIT_HOST_DEVICE inline double pil_cubic4(double v1, double v2, double v3, double v4, double d) {
  const double p2 = -v1 + v3, p3 = fma(2.0, v1 - v2, v3) - v4, p4 = -v1 + v2 - v3 + v4;
  return fma(d, fma(d, fma(d, p4, p3), p2), v2);
}

// Where output pixel (y, x) of an (H, W) image samples its source under PIL
// Image.transform(AFFINE, m): the pixel centre maps to (m0 x' + m1 y' + m2, m3 x' + m4 y' + m5);
// outside the source the pixel is the fill. The same for every channel.
struct AffineTap {
  bool inside;
  Index x0, y0;   // the source pixel at or before the sample point
  double dx, dy;  // the sample point's offset from it
};

VIT_HOST_DEVICE inline AffineTap affine_tap(const PixelStep& s, Index H, Index W, Index y,
                                            Index x) {
  const double xo = x + 0.5, yo = y + 0.5;
  double xi = fma(s.m[0], xo, fma(s.m[1], yo, s.m[2]));
  double yi = fma(s.m[3], xo, fma(s.m[4], yo, s.m[5]));
  AffineTap t{xi >= 0.0 && xi < W && yi >= 0.0 && yi < H, 0, 0, 0.0, 0.0};
  if (!t.inside) return t;
  xi -= 0.5;
  yi -= 0.5;
  t.x0 = Index(floor(xi));
  t.y0 = Index(floor(yi));
  t.dx = xi - t.x0;
  t.dy = yi - t.y0;
  return t;
}

// The sample of plane (H, W) at an inside tap: bilinear or PIL's bicubic, edge pixels repeated,
// truncated to uint8 as PIL does.
VIT_HOST_DEVICE inline uint8_t affine_sample(const uint8_t* plane, Index H, Index W,
                                             const AffineTap& t, bool bicubic) {
  auto clamp_x = [W](Index x) { return x < 0 ? 0 : x > W - 1 ? W - 1 : x; };
  auto row = [plane, H, W](Index y) { return plane + (y < 0 ? 0 : y > H - 1 ? H - 1 : y) * W; };
  double v;
  if (!bicubic) {
    const Index xa = clamp_x(t.x0), xb = clamp_x(t.x0 + 1);
    const uint8_t *r0 = row(t.y0), *r1 = row(t.y0 + 1);
    const double top = fma(double(r0[xb]) - double(r0[xa]), t.dx, double(r0[xa]));
    const double bot = fma(double(r1[xb]) - double(r1[xa]), t.dx, double(r1[xa]));
    v = fma(bot - top, t.dy, top);
  } else {
    const Index x0 = clamp_x(t.x0 - 1), x1 = clamp_x(t.x0), x2 = clamp_x(t.x0 + 1),
                x3 = clamp_x(t.x0 + 2);
    auto across = [&](Index y) {  // the cubic along x in source row y
      const uint8_t* r = row(y);
      return pil_cubic4(r[x0], r[x1], r[x2], r[x3], t.dx);
    };
    v = pil_cubic4(across(t.y0 - 1), across(t.y0), across(t.y0 + 1), across(t.y0 + 2), t.dy);
  }
  return uint8_t(v <= 0.0 ? 0.0 : v >= 255.0 ? 255.0 : v);
}

// PIL ImageEnhance.Contrast's mean: the L image's mean rounded to a byte, from the sum of its
// luma values over P pixels.
VIT_HOST_DEVICE inline uint8_t contrast_mean(int64_t luma_sum, Index P) {
  return uint8_t(int(double(luma_sum) / double(P) + 0.5));
}

}  // namespace vit
