// Mapping a model and its AdamW moments between training image sizes (train/resize_model.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/config.h"
#include "model/params.h"
#include "train/resize_model.h"

namespace {

vit::ModelConfig token_cfg(int size) {
  vit::ModelConfig c = vit::model_preset("vit_fmnist_tiny");
  c.classifier = vit::Classifier::Token;
  c.img_size = size;
  c.validate();
  return c;
}

std::vector<float> randn(vit::Index n, unsigned seed, float mean = 0, bool positive = false) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(mean, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& e : x) e = positive ? std::abs(d(g)) * 1e-3f : d(g);
  return x;
}

TEST(ResizeModel, SameSizeIsIdentity) {
  const auto cfg = token_cfg(28);
  const auto t = vit::build_param_table(cfg);
  const auto p = randn(t.total, 1), m = randn(t.total, 2), v = randn(t.total, 3, 0, true);
  const auto r = vit::resize_model(cfg, t, p, m, v, 28);
  ASSERT_EQ(r.table.total, t.total);
  std::vector<bool> in_tensor(size_t(t.total), false);
  for (const auto& s : t.specs)
    for (vit::Index i = s.offset; i < s.offset + s.numel(); ++i) {
      in_tensor[i] = true;
      ASSERT_NEAR(r.params[i], p[i], 1e-6f) << s.name;
      ASSERT_NEAR(r.m[i], m[i], 1e-6f) << s.name;
      ASSERT_NEAR(r.v[i], v[i], 1e-6f) << s.name;
    }
  for (vit::Index i = 0; i < t.total; ++i) {  // the alignment padding is not a tensor: left 0
    if (!in_tensor[i]) {
      ASSERT_EQ(r.params[i], 0.0f) << i;
    }
  }
}

TEST(ResizeModel, ShapesClsRowCopiesAndNonNegativeV) {
  const auto cfg = token_cfg(28);  // grid 7
  const auto t = vit::build_param_table(cfg);
  const auto p = randn(t.total, 4), m = randn(t.total, 5), v = randn(t.total, 6, 0, true);
  const auto r = vit::resize_model(cfg, t, p, m, v, 12);  // grid 3
  EXPECT_EQ(r.cfg.img_size, 12);
  const auto& pe = r.table.at("pos_embed");
  const vit::Index C = cfg.embed_dim;
  EXPECT_EQ(pe.shape, (std::vector<vit::Index>{1, 3 * 3 + 1, C}));
  EXPECT_EQ(r.table.num_params, t.num_params - (49 - 9) * C);
  const auto& pe0 = t.at("pos_embed");
  for (vit::Index c = 0; c < C; ++c) {  // class-token row untouched
    EXPECT_EQ(r.params[pe.offset + c], p[pe0.offset + c]);
    EXPECT_EQ(r.m[pe.offset + c], m[pe0.offset + c]);
    EXPECT_EQ(r.v[pe.offset + c], v[pe0.offset + c]);
  }
  for (float x : r.v) ASSERT_GE(x, 0.0f);
  for (const auto& s : t.specs) {  // every other tensor copied by name
    if (s.name == "pos_embed") continue;
    const auto& d = r.table.at(s.name);
    for (vit::Index i = 0; i < s.numel(); i += 7) {
      ASSERT_EQ(r.params[d.offset + i], p[s.offset + i]) << s.name;
      ASSERT_EQ(r.m[d.offset + i], m[s.offset + i]) << s.name;
    }
  }
}

TEST(ResizeModel, SmoothGridRoundTripIsClose) {
  const auto cfg = token_cfg(56);  // grid 14
  const auto t = vit::build_param_table(cfg);
  std::vector<float> p(size_t(t.total), 0.5f);
  const auto& pe = t.at("pos_embed");
  const vit::Index C = cfg.embed_dim, g = cfg.grid();
  for (vit::Index y = 0; y < g; ++y)
    for (vit::Index x = 0; x < g; ++x)
      for (vit::Index c = 0; c < C; ++c)
        p[pe.offset + (1 + y * g + x) * C + c] =
            float(std::sin(0.2 * x + 0.01 * c) * std::cos(0.15 * y));
  const auto up = vit::resize_model(cfg, t, p, {}, {}, 112);  // grid 28
  EXPECT_TRUE(up.m.empty());
  const auto back = vit::resize_model(up.cfg, up.table, up.params, {}, {}, 56);
  double worst = 0;
  for (const auto& s : t.specs)
    for (vit::Index i = s.offset; i < s.offset + s.numel(); ++i)
      worst = std::max(worst, double(std::abs(back.params[i] - p[i])));
  EXPECT_LT(worst, 0.02);
}

TEST(ResizeModel, RejectsBadSize) {
  const auto cfg = token_cfg(28);
  const auto t = vit::build_param_table(cfg);
  const std::vector<float> p(size_t(t.total));
  EXPECT_THROW(vit::resize_model(cfg, t, p, {}, {}, 30), vit::Error);
  EXPECT_THROW(vit::resize_model(cfg, t, p, {}, {}, 0), vit::Error);
}

}  // namespace
