// Augmentation ops against PIL/torchvision (tests/reference/augment_ref.py) on a 29x37 RGB image.
// Tolerances: PIL works in uint8 with its own float/fixed-point rounding order, so pixel and
// resize ops must agree within +-1 per pixel. Geometric RandAugment ops (rotate, shear,
// translate) compute source coordinates in double like PIL, but a pixel whose source lands exactly
// on the image edge could flip between sample and fill: there at most 1% of pixels may differ by
// more than 1, and the mean absolute error must stay below 0.1.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data/augment.h"
#include "data/randaugment.h"
#include "io/safetensors.h"

using namespace vit;
using namespace vit::data;

namespace {

const io::SafeTensors& reference() {
  static const io::SafeTensors st =
      io::read_safetensors(std::string(VIT_REFERENCE_DIR) + "/augment.safetensors");
  return st;
}

std::vector<uint8_t> u8(const io::Tensor& t) {
  std::vector<uint8_t> out;
  for (float v : t.to_f32()) out.push_back(uint8_t(v));
  return out;
}

struct Src {
  Index C, H, W;
  std::vector<uint8_t> px;  // (C, H, W)
};

Src source() {
  const auto& t = reference().at("src");
  return {t.shape[0], t.shape[1], t.shape[2], u8(t)};
}

struct Diff {
  int max = 0;
  double mean = 0, frac_over1 = 0;
};

Diff compare(const std::vector<uint8_t>& got, const std::string& key, Index C, Index H, Index W) {
  const auto& t = reference().at(key);
  EXPECT_EQ(t.shape, (std::vector<Index>{C, H, W})) << key;
  const std::vector<uint8_t> ref = u8(t);
  Diff d;
  if (ref.size() != got.size()) return {999, 999, 1};
  for (size_t i = 0; i < ref.size(); ++i) {
    const int e = std::abs(int(got[i]) - int(ref[i]));
    d.max = std::max(d.max, e);
    d.mean += e;
    d.frac_over1 += e > 1;
  }
  d.mean /= double(ref.size());
  d.frac_over1 /= double(ref.size());
  return d;
}

void expect_within1(const std::vector<uint8_t>& got, const std::string& key, Index C, Index H,
                    Index W) {
  const Diff d = compare(got, key, C, H, W);
  EXPECT_LE(d.max, 1) << key << " mean abs err " << d.mean;
}

}  // namespace

TEST(AugmentTorch, ResizeMatchesPil) {
  const Src s = source();
  for (const char* name : {"bilinear", "bicubic"}) {
    const Interp in = parse_interp(name);
    std::vector<uint8_t> out(3 * 24 * 24);
    resize_pil(s.px.data(), 3, s.H, s.W, {3, 5, 20, 25}, out.data(), 24, 24, in);
    expect_within1(out, std::string("crop_") + name, 3, 24, 24);
    std::vector<uint8_t> down(3 * 11 * 13);
    resize_pil(s.px.data(), 3, s.H, s.W, {0, 0, s.H, s.W}, down.data(), 11, 13, in);
    expect_within1(down, std::string("down_") + name, 3, 11, 13);
    std::vector<uint8_t> up(3 * 45 * 50);
    resize_pil(s.px.data(), 3, s.H, s.W, {0, 0, s.H, s.W}, up.data(), 45, 50, in);
    expect_within1(up, std::string("up_") + name, 3, 45, 50);
    std::vector<uint8_t> ev(3 * 24 * 24);
    eval_resize_crop(s.px.data(), 3, s.H, s.W, ev.data(), 24, 0.875, in);
    expect_within1(ev, std::string("eval_") + name, 3, 24, 24);
  }
}

TEST(AugmentTorch, FlipAndColourMatchPil) {
  const Src s = source();
  std::vector<uint8_t> f = s.px;
  hflip(f.data(), 3, s.H, s.W);
  expect_within1(f, "hflip", 3, s.H, s.W);
  for (double fac : {0.6, 1.4}) {
    const std::string suf = fac < 1 ? "_0.6" : "_1.4";
    std::vector<uint8_t> b = s.px, c = s.px, sa = s.px;
    adjust_brightness(b.data(), 3, s.H, s.W, fac);
    adjust_contrast(c.data(), 3, s.H, s.W, fac);
    adjust_saturation(sa.data(), 3, s.H, s.W, fac);
    expect_within1(b, "brightness" + suf, 3, s.H, s.W);
    expect_within1(c, "contrast" + suf, 3, s.H, s.W);
    expect_within1(sa, "saturation" + suf, 3, s.H, s.W);
  }
}

TEST(AugmentTorch, RandAugmentOpsMatchPil) {
  const Src s = source();
  const std::array<uint8_t, 3> fill{124, 116, 104};
  const RaOp ops[] = {RaOp::AutoContrast,
                      RaOp::Equalize,
                      RaOp::Invert,
                      RaOp::Rotate,
                      RaOp::Posterize,
                      RaOp::Solarize,
                      RaOp::SolarizeAdd,
                      RaOp::Color,
                      RaOp::Contrast,
                      RaOp::Brightness,
                      RaOp::Sharpness,
                      RaOp::ShearX,
                      RaOp::ShearY,
                      RaOp::TranslateXRel,
                      RaOp::TranslateYRel,
                      RaOp::PosterizeIncreasing,
                      RaOp::SolarizeIncreasing,
                      RaOp::ColorIncreasing,
                      RaOp::ContrastIncreasing,
                      RaOp::BrightnessIncreasing,
                      RaOp::SharpnessIncreasing};
  for (RaOp op : ops)
    for (int level : {3, 9}) {
      std::vector<uint8_t> img = s.px;
      ra_apply_op(op, ra_level_arg(op, level, false), img.data(), 3, s.H, s.W, fill, false);
      const std::string key = std::string("ra_") + ra_op_name(op) + "_" + std::to_string(level);
      const Diff d = compare(img, key, 3, s.H, s.W);
      const bool geometric = op == RaOp::Rotate || op == RaOp::ShearX || op == RaOp::ShearY ||
                             op == RaOp::TranslateXRel || op == RaOp::TranslateYRel;
      if (geometric) {
        EXPECT_LE(d.frac_over1, 0.01) << key << " max " << d.max << " mean " << d.mean;
        EXPECT_LT(d.mean, 0.1) << key;
      } else {
        EXPECT_LE(d.max, 1) << key << " mean " << d.mean;
      }
    }
  for (RaOp op : {RaOp::Rotate, RaOp::ShearX, RaOp::TranslateYRel}) {
    std::vector<uint8_t> img = s.px;
    ra_apply_op(op, ra_level_arg(op, 9, false), img.data(), 3, s.H, s.W, fill, true);
    const std::string key = std::string("ra_") + ra_op_name(op) + "_9_bicubic";
    const Diff d = compare(img, key, 3, s.H, s.W);
    EXPECT_LE(d.frac_over1, 0.01) << key << " max " << d.max << " mean " << d.mean;
    EXPECT_LT(d.mean, 0.1) << key;
  }
}
