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

}  // namespace

const char* ra_op_name(RaOp op) {
  for (const OpInfo& o : kOps)
    if (o.op == op) return o.name;
  return "?";
}

RandAugmentConfig parse_rand_augment(const std::string& spec, double magnitude_override) {
  RandAugmentConfig cfg;
  double num_ops = cfg.num_ops;  // as parsed: range-checked before it becomes an int
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
      num_ops = v;  // checked, then converted, below
    else if (key == "p")
      cfg.prob = v;
    else
      throw Error(fmt::format("--aa '{}': unknown section '{}' (known: m, n, p, mstd, mmax, inc)",
                              spec, s));
  }
  // Bounds keep every derived integer (ops per sample, posterize bits, solarize thresholds) in
  // range; timm's magnitudes live on a 0-10 scale.
  if (!(num_ops >= 0 && num_ops <= kMaxRandAugmentOps && num_ops == std::floor(num_ops)) ||
      !(cfg.prob >= 0 && cfg.prob <= 1) || !(cfg.magnitude >= 0 && cfg.magnitude <= 1000) ||
      !(cfg.magnitude_max >= 0 && cfg.magnitude_max <= 1000))
    throw Error(
        fmt::format("--aa '{}': n must be an integer in [0, {}], p in [0, 1], m and mmax "
                    "in [0, 1000]",
                    spec, kMaxRandAugmentOps));
  cfg.num_ops = int(num_ops);
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

PixelFill pixel_fill(const std::array<uint8_t, 3>& fill) {
  PixelFill f;
  for (int c = 0; c < 3; ++c) f.v[c] = fill[size_t(c)];
  return f;
}

void ra_apply_op(RaOp op, double arg, uint8_t* img, Index C, Index H, Index W,
                 const std::array<uint8_t, 3>& fill, bool bicubic) {
  apply_pixel_step(make_pixel_step(op, arg, bicubic, H, W), img, C, H, W, pixel_fill(fill));
}

RandAugment::RandAugment(const RandAugmentConfig& cfg, const std::array<uint8_t, 3>& fill,
                         const std::string& resample)
    : cfg_(cfg), fill_(pixel_fill(fill)) {
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

void RandAugment::plan(Rng& rng, Index H, Index W, PixelStep* steps) const {
  for (int k = 0; k < cfg_.num_ops; ++k) {
    steps[k] = PixelStep{};
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
    steps[k] = make_pixel_step(op, ra_level_arg(op, m, negate), bicubic, H, W);
  }
}

void RandAugment::apply(Rng& rng, uint8_t* img, Index C, Index H, Index W) const {
  std::vector<PixelStep> steps(size_t(std::max(cfg_.num_ops, 0)));
  plan(rng, H, W, steps.data());
  for (const PixelStep& s : steps) apply_pixel_step(s, img, C, H, W, fill_);
}

}  // namespace vit::data
