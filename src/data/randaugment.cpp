#include "data/randaugment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "data/augment.h"

namespace vit::data {

namespace {

constexpr double kDenom = 10.0;  // timm _LEVEL_DENOM

struct OpInfo {
  RaOp op;
  const char* name;
};
constexpr OpInfo kOps[] = {
    {RaOp::AutoContrast, "AutoContrast"},
    {RaOp::Equalize, "Equalize"},
    {RaOp::Invert, "Invert"},
    {RaOp::Rotate, "Rotate"},
    {RaOp::Posterize, "Posterize"},
    {RaOp::Solarize, "Solarize"},
    {RaOp::SolarizeAdd, "SolarizeAdd"},
    {RaOp::Color, "Color"},
    {RaOp::Contrast, "Contrast"},
    {RaOp::Brightness, "Brightness"},
    {RaOp::Sharpness, "Sharpness"},
    {RaOp::ShearX, "ShearX"},
    {RaOp::ShearY, "ShearY"},
    {RaOp::TranslateXRel, "TranslateXRel"},
    {RaOp::TranslateYRel, "TranslateYRel"},
    {RaOp::PosterizeIncreasing, "PosterizeIncreasing"},
    {RaOp::SolarizeIncreasing, "SolarizeIncreasing"},
    {RaOp::ColorIncreasing, "ColorIncreasing"},
    {RaOp::ContrastIncreasing, "ContrastIncreasing"},
    {RaOp::BrightnessIncreasing, "BrightnessIncreasing"},
    {RaOp::SharpnessIncreasing, "SharpnessIncreasing"},
};

using Lut = std::array<uint8_t, 256>;

void apply_lut(uint8_t* plane, Index P, const Lut& lut) {
  for (Index i = 0; i < P; ++i) plane[i] = lut[plane[i]];
}

// PIL ImageOps.autocontrast (cutoff 0): per channel, stretch [lo, hi] to [0, 255].
void autocontrast(uint8_t* img, Index C, Index P) {
  for (Index c = 0; c < C; ++c) {
    uint8_t* p = img + c * P;
    const auto [mn, mx] = std::minmax_element(p, p + P);
    const int lo = *mn, hi = *mx;
    if (hi <= lo) continue;
    const double scale = 255.0 / (hi - lo), offset = -lo * scale;
    Lut lut;
    for (int i = 0; i < 256; ++i) lut[i] = uint8_t(std::clamp(int(i * scale + offset), 0, 255));
    apply_lut(p, P, lut);
  }
}

// PIL ImageOps.equalize: per channel cumulative-histogram LUT.
void equalize(uint8_t* img, Index C, Index P) {
  for (Index c = 0; c < C; ++c) {
    uint8_t* p = img + c * P;
    std::array<int64_t, 256> h{};
    for (Index i = 0; i < P; ++i) ++h[p[i]];
    int64_t total = 0, last = 0, nonzero = 0;
    for (int i = 0; i < 256; ++i)
      if (h[i]) total += h[i], last = h[i], ++nonzero;
    if (nonzero <= 1) continue;
    const int64_t step = (total - last) / 256;
    if (!step) continue;
    int64_t n = step / 2;
    Lut lut;
    for (int i = 0; i < 256; ++i) {
      lut[i] = uint8_t(std::min<int64_t>(n / step, 255));
      n += h[i];
    }
    apply_lut(p, P, lut);
  }
}

// PIL ImageFilter.SMOOTH (3x3, centre 5, others 1, /13); the border keeps the source pixels.
void smooth(const uint8_t* src, uint8_t* dst, Index C, Index H, Index W) {
  std::copy_n(src, C * H * W, dst);
  for (Index c = 0; c < C; ++c)
    for (Index y = 1; y + 1 < H; ++y)
      for (Index x = 1; x + 1 < W; ++x) {
        int s = 4 * src[(c * H + y) * W + x];
        for (Index dy = -1; dy <= 1; ++dy)
          for (Index dx = -1; dx <= 1; ++dx) s += src[(c * H + y + dy) * W + x + dx];
        dst[(c * H + y) * W + x] = uint8_t(std::clamp(int(std::lround(s / 13.0)), 0, 255));
      }
}

void sharpness(uint8_t* img, Index C, Index H, Index W, double factor) {
  std::vector<uint8_t> deg(C * H * W);  // (C, H, W)
  smooth(img, deg.data(), C, H, W);
  for (Index i = 0; i < C * H * W; ++i) {
    const float t = float(deg[i]) + float(factor) * (float(img[i]) - float(deg[i]));
    img[i] = t <= 0.0f ? 0 : t >= 255.0f ? 255 : uint8_t(t);
  }
}

// PIL's geometric bicubic: cubic convolution with a = -1 through 4 samples at -1, 0, 1, 2.
double cubic4(double v1, double v2, double v3, double v4, double d) {
  const double p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
  return v2 + d * (p2 + d * (p3 + d * p4));
}

// PIL Image.transform(AFFINE, m): output pixel centre (x + .5, y + .5) maps to source
// (m0 x' + m1 y' + m2, m3 x' + m4 y' + m5); sources outside the image take `fill`.
void affine(uint8_t* img, Index C, Index H, Index W, const double m[6],
            const std::array<uint8_t, 3>& fill, bool bicubic) {
  std::vector<uint8_t> src(img, img + C * H * W);  // (C, H, W)
  auto at = [&](Index c, Index y, Index x) {
    return double(
        src[(c * H + std::clamp<Index>(y, 0, H - 1)) * W + std::clamp<Index>(x, 0, W - 1)]);
  };
  for (Index y = 0; y < H; ++y)
    for (Index x = 0; x < W; ++x) {
      const double xo = x + 0.5, yo = y + 0.5;
      double xi = m[0] * xo + m[1] * yo + m[2], yi = m[3] * xo + m[4] * yo + m[5];
      const bool inside = xi >= 0.0 && xi < W && yi >= 0.0 && yi < H;
      xi -= 0.5;
      yi -= 0.5;
      const Index x0 = Index(std::floor(xi)), y0 = Index(std::floor(yi));
      const double dx = xi - x0, dy = yi - y0;
      for (Index c = 0; c < C; ++c) {
        uint8_t& out = img[(c * H + y) * W + x];
        if (!inside) {
          out = fill[std::min<Index>(c, 2)];
          continue;
        }
        double v = 0;
        if (!bicubic) {
          const double top = at(c, y0, x0) + (at(c, y0, x0 + 1) - at(c, y0, x0)) * dx;
          const double bot = at(c, y0 + 1, x0) + (at(c, y0 + 1, x0 + 1) - at(c, y0 + 1, x0)) * dx;
          v = top + (bot - top) * dy;
        } else {
          double r[4];
          for (Index j = 0; j < 4; ++j)
            r[j] = cubic4(at(c, y0 + j - 1, x0 - 1), at(c, y0 + j - 1, x0),
                          at(c, y0 + j - 1, x0 + 1), at(c, y0 + j - 1, x0 + 2), dx);
          v = cubic4(r[0], r[1], r[2], r[3], dy);
        }
        out = uint8_t(std::clamp(v, 0.0, 255.0));  // PIL truncates
      }
    }
}

void rotate(uint8_t* img, Index C, Index H, Index W, double degrees,
            const std::array<uint8_t, 3>& fill, bool bicubic) {
  // PIL Image.rotate about the centre (inverse matrix, angles counter-clockwise).
  const double a = -degrees * M_PI / 180.0;
  const double cs = std::round(std::cos(a) * 1e15) / 1e15,
               sn = std::round(std::sin(a) * 1e15) / 1e15;
  const double cx = W / 2.0, cy = H / 2.0;
  double m[6] = {cs, sn, 0.0, -sn, cs, 0.0};
  m[2] = cs * -cx + sn * -cy + cx;
  m[5] = -sn * -cx + cs * -cy + cy;
  affine(img, C, H, W, m, fill, bicubic);
}

}  // namespace

const char* ra_op_name(RaOp op) {
  for (const OpInfo& o : kOps)
    if (o.op == op) return o.name;
  return "?";
}

RandAugmentConfig parse_rand_augment(const std::string& spec, double magnitude_override) {
  RandAugmentConfig cfg;
  std::vector<std::string> parts;
  for (size_t pos = 0;;) {
    const size_t dash = spec.find('-', pos);
    parts.push_back(spec.substr(pos, dash - pos));
    if (dash == std::string::npos) break;
    pos = dash + 1;
  }
  if (parts[0] != "rand")
    throw Error(
        fmt::format("--aa '{}': only RandAugment ('rand-m9-mstd0.5-inc1') is supported", spec));
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& s = parts[i];
    const size_t d = s.find_first_of("0123456789.");
    if (d == std::string::npos) continue;  // timm skips sections without a number
    const std::string key = s.substr(0, d), val = s.substr(d);
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(val, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != val.size())
      throw Error(fmt::format("--aa '{}': bad number in section '{}'", spec, s));
    if (key == "mstd")
      cfg.magnitude_std = v > 100 ? std::numeric_limits<double>::infinity() : v;
    else if (key == "mmax")
      cfg.magnitude_max = v;
    else if (key == "inc")
      cfg.increasing = v != 0;
    else if (key == "m")
      cfg.magnitude = v;
    else if (key == "n")
      cfg.num_ops = int(v);
    else if (key == "p")
      cfg.prob = v;
    else
      throw Error(fmt::format("--aa '{}': unknown section '{}' (known: m, n, p, mstd, mmax, inc)",
                              spec, s));
  }
  if (cfg.num_ops < 0 || cfg.prob < 0 || cfg.prob > 1 || cfg.magnitude < 0)
    throw Error(fmt::format("--aa '{}': n must be >= 0, p in [0, 1], m >= 0", spec));
  if (magnitude_override >= 0) cfg.magnitude = magnitude_override;
  return cfg;
}

std::array<uint8_t, 3> fill_mean_pixel(const std::vector<float>& mean) {
  std::array<uint8_t, 3> f{128, 128, 128};
  for (size_t c = 0; c < 3 && !mean.empty(); ++c)
    f[c] =
        uint8_t(std::clamp(std::nearbyint(mean[std::min(c, mean.size() - 1)] * 255.0), 0.0, 255.0));
  return f;
}

double ra_level_arg(RaOp op, double level, bool negate) {
  const double sign = negate ? -1.0 : 1.0, l = level / kDenom;
  switch (op) {
    case RaOp::Rotate:
      return sign * l * 30.0;
    case RaOp::ShearX:
    case RaOp::ShearY:
      return sign * l * 0.3;
    case RaOp::TranslateXRel:
    case RaOp::TranslateYRel:
      return sign * l * 0.45;
    case RaOp::Posterize:
      return int(l * 4);
    case RaOp::PosterizeIncreasing:
      return 4 - int(l * 4);
    case RaOp::Solarize:
      return int(l * 256);
    case RaOp::SolarizeIncreasing:
      return 256 - int(l * 256);
    case RaOp::SolarizeAdd:
      return int(l * 110);
    case RaOp::Color:
    case RaOp::Contrast:
    case RaOp::Brightness:
    case RaOp::Sharpness:
      return l * 1.8 + 0.1;
    case RaOp::ColorIncreasing:
    case RaOp::ContrastIncreasing:
    case RaOp::BrightnessIncreasing:
    case RaOp::SharpnessIncreasing:
      return 1.0 + sign * l * 0.9;
    default:
      return 0.0;
  }
}

void ra_apply_op(RaOp op, double arg, uint8_t* img, Index C, Index H, Index W,
                 const std::array<uint8_t, 3>& fill, bool bicubic) {
  const Index P = H * W;
  Lut lut;
  switch (op) {
    case RaOp::AutoContrast:
      autocontrast(img, C, P);
      return;
    case RaOp::Equalize:
      equalize(img, C, P);
      return;
    case RaOp::Invert:
      for (Index i = 0; i < C * P; ++i) img[i] = uint8_t(255 - img[i]);
      return;
    case RaOp::Rotate:
      rotate(img, C, H, W, arg, fill, bicubic);
      return;
    case RaOp::Posterize:
    case RaOp::PosterizeIncreasing: {
      const int bits = int(arg);
      if (bits >= 8) return;
      const uint8_t mask = uint8_t(~((1 << (8 - bits)) - 1));
      for (Index i = 0; i < C * P; ++i) img[i] &= mask;
      return;
    }
    case RaOp::Solarize:
    case RaOp::SolarizeIncreasing:
      for (int i = 0; i < 256; ++i) lut[i] = uint8_t(i < arg ? i : 255 - i);
      for (Index c = 0; c < C; ++c) apply_lut(img + c * P, P, lut);
      return;
    case RaOp::SolarizeAdd:
      for (int i = 0; i < 256; ++i) lut[i] = uint8_t(i < 128 ? std::min(255, i + int(arg)) : i);
      for (Index c = 0; c < C; ++c) apply_lut(img + c * P, P, lut);
      return;
    case RaOp::Color:
    case RaOp::ColorIncreasing:
      adjust_saturation(img, C, H, W, arg);
      return;
    case RaOp::Contrast:
    case RaOp::ContrastIncreasing:
      adjust_contrast(img, C, H, W, arg);
      return;
    case RaOp::Brightness:
    case RaOp::BrightnessIncreasing:
      adjust_brightness(img, C, H, W, arg);
      return;
    case RaOp::Sharpness:
    case RaOp::SharpnessIncreasing:
      sharpness(img, C, H, W, arg);
      return;
    case RaOp::ShearX: {
      const double m[6] = {1, arg, 0, 0, 1, 0};
      affine(img, C, H, W, m, fill, bicubic);
      return;
    }
    case RaOp::ShearY: {
      const double m[6] = {1, 0, 0, arg, 1, 0};
      affine(img, C, H, W, m, fill, bicubic);
      return;
    }
    case RaOp::TranslateXRel: {
      const double m[6] = {1, 0, arg * W, 0, 1, 0};
      affine(img, C, H, W, m, fill, bicubic);
      return;
    }
    case RaOp::TranslateYRel: {
      const double m[6] = {1, 0, 0, 0, 1, arg * H};
      affine(img, C, H, W, m, fill, bicubic);
      return;
    }
  }
}

RandAugment::RandAugment(const RandAugmentConfig& cfg, const std::array<uint8_t, 3>& fill,
                         const std::string& resample)
    : cfg_(cfg), fill_(fill) {
  if (resample == "bilinear")
    resample_ = 1;
  else if (resample == "bicubic")
    resample_ = 2;
  else if (resample != "random")
    throw Error(
        fmt::format("RandAugment resample '{}': use random, bilinear or bicubic", resample));
  // timm _RAND_TRANSFORMS / _RAND_INCREASING_TRANSFORMS (same order).
  ops_ = {RaOp::AutoContrast, RaOp::Equalize, RaOp::Invert, RaOp::Rotate};
  if (cfg.increasing)
    ops_.insert(ops_.end(), {RaOp::PosterizeIncreasing, RaOp::SolarizeIncreasing, RaOp::SolarizeAdd,
                             RaOp::ColorIncreasing, RaOp::ContrastIncreasing,
                             RaOp::BrightnessIncreasing, RaOp::SharpnessIncreasing});
  else
    ops_.insert(ops_.end(), {RaOp::Posterize, RaOp::Solarize, RaOp::SolarizeAdd, RaOp::Color,
                             RaOp::Contrast, RaOp::Brightness, RaOp::Sharpness});
  ops_.insert(ops_.end(), {RaOp::ShearX, RaOp::ShearY, RaOp::TranslateXRel, RaOp::TranslateYRel});
}

void RandAugment::apply(Rng& rng, uint8_t* img, Index C, Index H, Index W) const {
  for (int k = 0; k < cfg_.num_ops; ++k) {
    const RaOp op = ops_[rng.below(ops_.size())];
    if (cfg_.prob < 1.0 && rng.uniform() > cfg_.prob) continue;
    double m = cfg_.magnitude;
    if (std::isinf(cfg_.magnitude_std))
      m = m * rng.uniform();
    else if (cfg_.magnitude_std > 0)
      m = m + cfg_.magnitude_std * rng.normal();
    m = std::clamp(m, 0.0, cfg_.magnitude_max);
    const bool negate = rng.uniform() < 0.5;
    const bool bicubic = resample_ == 0 ? rng.uniform() < 0.5 : resample_ == 2;
    ra_apply_op(op, ra_level_arg(op, m, negate), img, C, H, W, fill_, bicubic);
  }
}

}  // namespace vit::data
