// Compiled with -ffp-contract=off (CMakeLists.txt): see core/pixel_step.h.
#include "core/pixel_step.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace vit {

namespace {

using Lut = std::array<uint8_t, 256>;

void apply_lut(uint8_t* plane, Index P, const Lut& lut) {
  for (Index i = 0; i < P; ++i) plane[i] = lut[plane[i]];
}

void autocontrast(uint8_t* img, Index C, Index P) {
  for (Index c = 0; c < C; ++c) {
    uint8_t* p = img + c * P;
    const auto [mn, mx] = std::minmax_element(p, p + P);
    if (*mx <= *mn) continue;
    Lut lut;
    for (int i = 0; i < 256; ++i) lut[size_t(i)] = autocontrast_value(*mn, *mx, i);
    apply_lut(p, P, lut);
  }
}

void equalize(uint8_t* img, Index C, Index P) {
  for (Index c = 0; c < C; ++c) {
    uint8_t* p = img + c * P;
    std::array<int64_t, 256> hist{};
    for (Index i = 0; i < P; ++i) ++hist[p[i]];
    Lut lut;
    if (equalize_table(hist.data(), lut.data())) apply_lut(p, P, lut);
  }
}

// ImageEnhance.Sharpness: blend of the smoothed image (border pixels kept) towards img, a row
// at a time (two loops that vectorise).
void sharpness(uint8_t* img, Index C, Index H, Index W, float factor) {
  const std::vector<uint8_t> src(img, img + C * H * W);   // (C, H, W)
  std::vector<uint8_t> smoothed(static_cast<size_t>(W));  // one row (W)
  for (Index c = 0; c < C; ++c) {
    const uint8_t* plane = src.data() + c * H * W;
    for (Index y = 1; y + 1 < H; ++y) {
      uint8_t* row = img + (c * H + y) * W;
      for (Index x = 1; x + 1 < W; ++x) smoothed[size_t(x)] = smooth_value(plane, W, y, x);
      for (Index x = 1; x + 1 < W; ++x) row[x] = pil_blend(smoothed[size_t(x)], row[x], factor);
    }
  }
}

void affine(const PixelStep& s, uint8_t* img, Index C, Index H, Index W, const PixelFill& fill) {
  std::vector<uint8_t> src(img, img + C * H * W);  // (C, H, W)
  for (Index y = 0; y < H; ++y)
    for (Index x = 0; x < W; ++x) {
      const AffineTap t = affine_tap(s, H, W, y, x);
      for (Index c = 0; c < C; ++c)
        img[(c * H + y) * W + x] = t.inside
                                       ? affine_sample(src.data() + c * H * W, H, W, t, s.bicubic)
                                       : fill.v[std::min<Index>(c, 2)];
    }
}

// torchvision's adjust_contrast / adjust_saturation on a PIL image: blends towards the L
// image's mean / the pixel's own luma (grey images have no saturation: L -> L is the identity).
void contrast(uint8_t* img, Index C, Index P, float factor) {
  int64_t sum = 0;
  for (Index i = 0; i < P; ++i)
    sum += C == 3 ? pil_luma(img[i], img[P + i], img[2 * P + i]) : img[i];
  const uint8_t mean = contrast_mean(sum, P);
  for (Index i = 0; i < C * P; ++i) img[i] = pil_blend(mean, img[i], factor);
}

void saturation(uint8_t* img, Index C, Index P, float factor) {
  if (C != 3) return;
  for (Index i = 0; i < P; ++i) {
    const uint8_t l = pil_luma(img[i], img[P + i], img[2 * P + i]);
    for (Index c = 0; c < 3; ++c) img[c * P + i] = pil_blend(l, img[c * P + i], factor);
  }
}

}  // namespace

PixelStep make_pixel_step(RaOp op, double arg, bool bicubic, Index H, Index W) {
  PixelStep s;
  s.op = int32_t(op);
  s.arg = arg;
  s.bicubic = bicubic ? 1 : 0;
  double* m = s.m;
  m[0] = m[4] = 1.0;  // identity, then the op's terms
  switch (op) {
    case RaOp::Rotate: {  // PIL Image.rotate about the centre (inverse matrix, counter-clockwise)
      const double a = -arg * M_PI / 180.0;
      const double cs = std::round(std::cos(a) * 1e15) / 1e15,
                   sn = std::round(std::sin(a) * 1e15) / 1e15;
      const double cx = W / 2.0, cy = H / 2.0;
      m[0] = cs, m[1] = sn, m[3] = -sn, m[4] = cs;
      m[2] = cs * -cx + sn * -cy + cx;
      m[5] = -sn * -cx + cs * -cy + cy;
      break;
    }
    case RaOp::ShearX:
      m[1] = arg;
      break;
    case RaOp::ShearY:
      m[3] = arg;
      break;
    case RaOp::TranslateXRel:
      m[2] = arg * W;
      break;
    case RaOp::TranslateYRel:
      m[5] = arg * H;
      break;
    default:
      break;
  }
  return s;
}

void apply_pixel_step(const PixelStep& s, uint8_t* img, Index C, Index H, Index W,
                      const PixelFill& fill) {
  const Index P = H * W;
  if (s.op == PixelStep::kNone) return;
  if (s.geometric()) return affine(s, img, C, H, W, fill);
  const float factor = float(s.arg);
  switch (RaOp(s.op)) {
    case RaOp::AutoContrast:
      return autocontrast(img, C, P);
    case RaOp::Equalize:
      return equalize(img, C, P);
    case RaOp::Color:
    case RaOp::ColorIncreasing:
      return saturation(img, C, P, factor);
    case RaOp::Contrast:
    case RaOp::ContrastIncreasing:
      return contrast(img, C, P, factor);
    case RaOp::Brightness:
    case RaOp::BrightnessIncreasing:
      for (Index i = 0; i < C * P; ++i) img[i] = pil_blend(0, img[i], factor);
      return;
    case RaOp::Sharpness:
    case RaOp::SharpnessIncreasing:
      return sharpness(img, C, H, W, factor);
    default: {  // the table ops
      Lut lut;
      for (int i = 0; i < 256; ++i) lut[size_t(i)] = pointwise_value(s.op, s.arg, i);
      apply_lut(img, C * P, lut);
    }
  }
}

}  // namespace vit
