#include "train/batch_config.h"

#include <fmt/format.h>

#include <cmath>

#include "core/common.h"
#include "data/randaugment.h"

namespace vit {

namespace {

// "LO,HI" -> {lo, hi}; throws naming the flag.
std::pair<double, double> parse_range(const std::string& flag, const std::string& v) {
  const size_t comma = v.find(',');
  double lo = 0, hi = 0;
  size_t n1 = 0, n2 = 0;
  try {
    if (comma == std::string::npos) throw std::invalid_argument("no comma");
    const std::string a = v.substr(0, comma), b = v.substr(comma + 1);
    lo = std::stod(a, &n1);
    hi = std::stod(b, &n2);
    if (n1 != a.size() || n2 != b.size()) throw std::invalid_argument("trailing text");
  } catch (const std::exception&) {
    throw Error(fmt::format("{} '{}': expected two numbers LO,HI (e.g. 0.08,1)", flag, v));
  }
  if (!(std::isfinite(lo) && std::isfinite(hi) && lo > 0 && lo <= hi))
    throw Error(fmt::format("{} '{}': need 0 < LO <= HI", flag, v));
  return {lo, hi};
}

}  // namespace

void validate_augment_args(const TrainArgs& a) {
  if (!a.aa.empty()) (void)data::parse_rand_augment(a.aa);  // throws naming the section
  auto prob = [](double v, const char* flag) {
    VIT_CHECK(std::isfinite(v) && v >= 0 && v <= 1, fmt::format("{} must be in [0, 1]", flag));
  };
  prob(a.reprob, "--reprob");
  prob(a.mixup_prob, "--mixup-prob");
  prob(a.mixup_switch_prob, "--mixup-switch-prob");
  VIT_CHECK(std::isfinite(a.mixup) && a.mixup >= 0, "--mixup must be >= 0 (0 = off)");
  VIT_CHECK(std::isfinite(a.cutmix) && a.cutmix >= 0, "--cutmix must be >= 0 (0 = off)");
  VIT_CHECK(std::isfinite(a.color_jitter) && a.color_jitter >= 0 && a.color_jitter <= 1,
            "--color-jitter must be in [0, 1]");
  if (!a.scale.empty()) {
    const auto [lo, hi] = parse_range("--scale", a.scale);
    VIT_CHECK(hi <= 1, fmt::format("--scale '{}': HI must be <= 1", a.scale));
  }
  (void)parse_range("--ratio", a.ratio);
  VIT_CHECK(a.train_interpolation == "bilinear" || a.train_interpolation == "bicubic" ||
                a.train_interpolation == "random",
            fmt::format("--train-interpolation {}: use bilinear, bicubic or random",
                        a.train_interpolation));
  VIT_CHECK(a.crop_pct == 0 || (std::isfinite(a.crop_pct) && a.crop_pct > 0 && a.crop_pct <= 1),
            "--crop-pct must be in (0, 1] (0 = plain resize)");
}

data::BatchConfig train_batch_config(const TrainArgs& a, int img_size,
                                     const std::vector<float>& mean, const std::vector<float>& std,
                                     bool streamed) {
  data::BatchConfig c;
  c.img_size = img_size;
  c.crop_padding = a.crop_pad;
  // --hflip -1 (the default) = the data's usual choice: timm's 0.5 for photos, none for the
  // small in-memory sets (the Fashion-MNIST recipe measured better without).
  c.hflip = a.hflip >= 0 ? a.hflip : (streamed ? 0.5 : 0.0);
  c.smoothing = a.smoothing;
  c.mean = mean;
  c.std = std;
  c.auto_augment = a.aa;
  c.reprob = a.reprob;
  c.color_jitter = a.color_jitter;
  c.interpolation = a.train_interpolation;
  if (!a.scale.empty()) {
    c.rrc = true;
    std::tie(c.scale_lo, c.scale_hi) = parse_range("--scale", a.scale);
    std::tie(c.ratio_lo, c.ratio_hi) = parse_range("--ratio", a.ratio);
  }
  if (streamed) {
    // Photos of any size: timm's RandomResizedCrop + flip (the pad-crop path needs one size).
    c.rrc = true;
    std::tie(c.ratio_lo, c.ratio_hi) = parse_range("--ratio", a.ratio);
  }
  return c;
}

data::BatchConfig eval_batch_config(const TrainArgs& a, int img_size,
                                    const std::vector<float>& mean, const std::vector<float>& std,
                                    bool streamed) {
  data::BatchConfig c;
  c.img_size = img_size;
  c.mean = mean;
  c.std = std;
  c.eval_crop_pct = streamed && a.crop_pct <= 0 ? 0.875 : a.crop_pct;
  c.eval_interpolation = "bicubic";  // timm's ViT pretrained_cfg interpolation
  return c;
}

data::MixupConfig mixup_config(const TrainArgs& a) {
  return {a.mixup, a.cutmix, a.mixup_prob, a.mixup_switch_prob};
}

}  // namespace vit
