// Whole-model gradient check in float64: every parameter tensor of the ViT (all four
// {mlp, local} x {token, avg} variants, with layer scale and active stochastic depth, and the
// conv stem) against central finite differences of the mean loss.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/rng.h"
#include "model/vit.h"

namespace {

using vit::Index;

struct Variant {
  vit::Ffn ffn;
  vit::Classifier cls;
  double layer_scale;
  double drop_path;
  vit::Stem stem = vit::Stem::Patch;
};

// Readable test names (gtest would print the struct's bytes, padding included).
void PrintTo(const Variant& v, std::ostream* os) {
  *os << vit::to_string(v.ffn) << "_" << vit::to_string(v.cls) << "_ls" << v.layer_scale << "_dp"
      << v.drop_path << "_" << vit::to_string(v.stem);
}

vit::ModelConfig tiny_config(const Variant& v) {
  vit::ModelConfig c;
  c.name = "fd_tiny";
  c.img_size = 12;
  c.patch_size = 4;
  c.in_chans = 2;
  c.embed_dim = 8;
  c.depth = 2;
  c.num_heads = 2;
  c.mlp_ratio = 2;
  c.num_classes = 3;
  c.ffn = v.ffn;
  c.classifier = v.cls;
  c.layer_scale_init = v.layer_scale;
  c.drop_path = v.drop_path;
  c.stem = v.stem;
  return c;
}

class ModelFd : public ::testing::TestWithParam<Variant> {};

TEST_P(ModelFd, EveryParameterGradientMatchesFiniteDifferences) {
  const vit::ModelConfig cfg = tiny_config(GetParam());
  const Index B = 3, K = cfg.num_classes;
  vit::Vit<double> model(cfg, B);
  vit::Rng rng(7);
  // Perturb the init so LayerNorm affine params, biases and the class token matter.
  for (auto& p : model.params) p += 0.2 * rng.normal();
  std::vector<double> images(B * cfg.in_chans * cfg.img_size * cfg.img_size);
  for (auto& x : images) x = rng.normal();
  std::vector<double> targets(B * K, 0.05 / (K - 1));
  for (Index b = 0; b < B; ++b) targets[b * K + b % K] = 0.95;

  const uint64_t seed = 11;  // same drop-path masks in every forward
  model.forward(images.data(), targets.data(), B, true, seed);
  model.zero_grad();
  model.backward(1.0 / B);
  const std::vector<double> analytic = model.grads;

  int checked = 0;
  for (const auto& spec : model.table().specs) {
    const Index n = spec.numel();
    const Index stride = std::max<Index>(1, n / 12);  // up to ~12 elements per tensor
    for (Index j = 0; j < n; j += stride) {
      double& p = model.params[spec.offset + j];
      const double saved = p, h = 1e-6;
      p = saved + h;
      model.forward(images.data(), targets.data(), B, true, seed);
      const double lp = model.mean_loss();
      p = saved - h;
      model.forward(images.data(), targets.data(), B, true, seed);
      const double lm = model.mean_loss();
      p = saved;
      const double numeric = (lp - lm) / (2 * h);
      const double a = analytic[spec.offset + j];
      EXPECT_NEAR(a, numeric, 1e-7 + 1e-5 * std::fabs(numeric)) << spec.name << "[" << j << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ModelFd,
    ::testing::Values(Variant{vit::Ffn::Mlp, vit::Classifier::Token, 0.0, 0.0},
                      Variant{vit::Ffn::Mlp, vit::Classifier::Avg, 0.0, 0.0},
                      Variant{vit::Ffn::Local, vit::Classifier::Token, 0.0, 0.0},
                      Variant{vit::Ffn::Local, vit::Classifier::Avg, 0.0, 0.0},
                      Variant{vit::Ffn::Local, vit::Classifier::Token, 0.5, 0.3},
                      Variant{vit::Ffn::Mlp, vit::Classifier::Avg, 0.5, 0.3},
                      Variant{vit::Ffn::MlpTanh, vit::Classifier::Token, 0.0, 0.0},
                      // 12 -> 6 -> 3: two 3x3 stride-2 layers (8 channels each), then 1x1.
                      Variant{vit::Ffn::Mlp, vit::Classifier::Token, 0.0, 0.0, vit::Stem::Conv},
                      Variant{vit::Ffn::Local, vit::Classifier::Avg, 0.5, 0.3, vit::Stem::Conv}));

}  // namespace
