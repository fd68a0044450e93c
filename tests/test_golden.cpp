// Whole-model golden test against PyTorch for {mlp, local} x {token, avg}: our parameter table
// must have exactly the reference's timm keys and shapes; logits, loss, every parameter gradient
// and the losses of 10 AdamW updates (warmup + cosine, weight-decay groups, grad clipping) must
// match within relative error 1e-4 (tensors: ||ours - torch|| / ||torch||).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "io/safetensors.h"
#include "model/vit.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace {

using vit::Index;

double rel_err(const float* ours, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (ours[i] - ref[i]) * (ours[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesPyTorch) {
  const auto st = vit::io::read_safetensors(std::string(VIT_REFERENCE_DIR) + "/golden_" +
                                            GetParam() + ".safetensors");
  const auto& m = st.metadata;
  vit::ModelConfig cfg;
  cfg.name = "golden";
  cfg.img_size = std::stoi(m.at("img_size"));
  cfg.patch_size = std::stoi(m.at("patch_size"));
  cfg.in_chans = std::stoi(m.at("in_chans"));
  cfg.embed_dim = std::stoi(m.at("embed_dim"));
  cfg.depth = std::stoi(m.at("depth"));
  cfg.num_heads = std::stoi(m.at("num_heads"));
  cfg.mlp_ratio = std::stod(m.at("mlp_ratio"));
  cfg.num_classes = std::stoi(m.at("num_classes"));
  cfg.classifier = vit::classifier_from_string(m.at("classifier"));
  cfg.ffn = vit::ffn_from_string(m.at("ffn"));
  cfg.qkv_bias = m.at("qkv_bias") == "true";
  cfg.layer_scale_init = std::stod(m.at("layer_scale_init"));

  const std::vector<float> images = st.at("input.images").to_f32();
  const std::vector<float> targets = st.at("input.targets").to_f32();
  const Index B = st.at("input.images").shape[0];
  vit::Vit<float> model(cfg, B);
  const vit::ParamTable& table = model.table();

  // Same keys, same shapes, both ways.
  size_t n_params_in_file = 0;
  for (const auto& t : st.tensors)
    n_params_in_file += t.name.find('.') == std::string::npos ||
                        (t.name.rfind("input.", 0) != 0 && t.name.rfind("expected.", 0) != 0 &&
                         t.name.rfind("grad.", 0) != 0);
  EXPECT_EQ(table.specs.size(), n_params_in_file);
  for (const auto& s : table.specs) {
    const vit::io::Tensor& t = st.at(s.name);
    ASSERT_EQ(t.shape, s.shape) << s.name;
    const std::vector<float> v = t.to_f32();
    std::copy(v.begin(), v.end(), model.params.begin() + s.offset);
  }

  const float loss = model.forward(images.data(), targets.data(), B, false, 0);
  const double ref_loss = st.at("expected.loss").to_f64()[0];
  const double logits_err = rel_err(model.logits(), st.at("expected.logits").to_f64());
  EXPECT_LE(logits_err, 1e-4);
  EXPECT_LE(std::fabs(loss - ref_loss) / std::fabs(ref_loss), 1e-4);

  model.zero_grad();
  model.backward(1.0f / B);
  double worst = 0;
  std::string worst_key;
  for (const auto& s : table.specs) {
    const double e = rel_err(model.grads.data() + s.offset, st.at("grad." + s.name).to_f64());
    EXPECT_LE(e, 1e-4) << "grad of " << s.name;
    if (e > worst) worst = e, worst_key = s.name;
  }
  std::printf("  %s: logits %.2e, loss %.2e, worst grad %.2e (%s)\n", GetParam().c_str(),
              logits_err, std::fabs(loss - ref_loss) / std::fabs(ref_loss), worst,
              worst_key.c_str());

  // 10 AdamW updates on the same batch.
  const vit::LrSchedule sched{std::stod(m.at("lr_base")), std::stod(m.at("lr_min_lr")),
                              std::stod(m.at("lr_warmup_lr")), std::stod(m.at("lr_warmup")),
                              std::stod(m.at("lr_total"))};
  vit::AdamW<float> opt(table.total, table.num_decay,
                        vit::AdamWConfig{0.9, 0.999, 1e-8, std::stod(m.at("weight_decay")),
                                         std::stod(m.at("clip_grad"))});
  const std::vector<double> ref_losses = st.at("expected.step_losses").to_f64();
  double worst_step = 0;
  for (size_t k = 0; k < ref_losses.size(); ++k) {
    model.zero_grad();
    const float l = model.forward(images.data(), targets.data(), B, false, 0);
    const double e = std::fabs(l - ref_losses[k]) / std::fabs(ref_losses[k]);
    EXPECT_LE(e, 1e-4) << "loss of update " << k << ": " << l << " vs " << ref_losses[k];
    worst_step = std::max(worst_step, e);
    model.backward(1.0f / B);
    opt.step(model.params.data(), model.grads.data(), sched.at(double(k)));
  }
  EXPECT_LT(ref_losses.back(), ref_losses.front());  // the reference run actually trains
  std::printf("  %s: worst step loss rel err %.2e over %zu updates\n", GetParam().c_str(),
              worst_step, ref_losses.size());
}

INSTANTIATE_TEST_SUITE_P(FourConfigs, Golden,
                         ::testing::Values("mlp_token", "mlp_avg", "local_token", "local_avg"));

}  // namespace
