// The conv stem's configuration and wiring (ModelConfig::stem == Stem::Conv): the width rule,
// validation, the parameter table and its initialisation, the FLOP count, the checkpoint
// description, the bf16 emulation against fp32, and image-size switches (size curriculum).
// Its numerics are checked by finite differences (test_ops_fd.cpp, test_model_fd.cpp) and
// against PyTorch (test_ops_torch.cpp, test_conv_stem_torch.cpp, test_golden.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "model/config.h"
#include "model/params.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/engine_impl.h"
#include "train/resize_model.h"

namespace {

using vit::Index;

vit::ModelConfig conv(const std::string& preset) {
  vit::ModelConfig c = vit::model_preset(preset);
  c.stem = vit::Stem::Conv;
  c.validate();
  return c;
}

TEST(ConvStem, WidthsDoubleUpToTheEmbeddingWidth) {
  EXPECT_EQ(conv("vit_small_patch16_224").stem_widths(), (std::vector<int>{48, 96, 192, 384}));
  EXPECT_EQ(conv("vit_tiny_patch16_224").stem_widths(), (std::vector<int>{24, 48, 96, 192}));
  EXPECT_EQ(conv("vit_fmnist_tiny").stem_widths(), (std::vector<int>{48, 96}));
  vit::ModelConfig c = conv("vit_fmnist_tiny");
  c.embed_dim = 24;
  c.patch_size = 8;
  c.img_size = 24;
  EXPECT_EQ(c.stem_widths(), (std::vector<int>{16, 16, 24}));  // at least 16 channels
  c.embed_dim = 8;
  c.num_heads = 2;
  EXPECT_EQ(c.stem_widths(), (std::vector<int>{8, 8, 8}));  // ... or C when C is smaller
  EXPECT_TRUE(vit::model_preset("vit_fmnist_tiny").stem_widths().empty());  // patchify
}

TEST(ConvStem, NeedsAPowerOfTwoPatch) {
  vit::ModelConfig c = vit::model_preset("vit_fmnist_tiny");
  c.patch_size = 7;  // 28 / 7: fine for patchify
  EXPECT_NO_THROW(c.validate());
  c.stem = vit::Stem::Conv;
  EXPECT_THROW(c.validate(), vit::Error);
  c.patch_size = 1;
  EXPECT_THROW(c.validate(), vit::Error);
  c.patch_size = 2;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(vit::stem_from_string("conv"), vit::Stem::Conv);
  EXPECT_EQ(std::string(vit::to_string(vit::Stem::Patch)), "patch");
  EXPECT_THROW(vit::stem_from_string("resnet"), vit::Error);
}

TEST(ConvStem, ParameterTableAndInit) {
  const vit::ModelConfig c = conv("vit_small_patch16_224");
  const vit::ParamTable t = vit::build_param_table(c);
  const std::vector<std::pair<std::string, std::vector<Index>>> want = {
      {"patch_embed.stem.0.conv.weight", {48, 3, 3, 3}},
      {"patch_embed.stem.0.norm.weight", {48}},
      {"patch_embed.stem.3.conv.weight", {384, 192, 3, 3}},
      {"patch_embed.stem.3.norm.bias", {384}},
      {"patch_embed.proj.weight", {384, 384, 1, 1}},
      {"patch_embed.proj.bias", {384}}};
  for (const auto& [name, shape] : want) EXPECT_EQ(t.at(name).shape, shape) << name;
  EXPECT_EQ(t.find("patch_embed.stem.4.conv.weight"), nullptr);
  EXPECT_EQ(t.find("patch_embed.stem.0.conv.bias"), nullptr);  // LayerNorm follows: no bias
  EXPECT_TRUE(t.at("patch_embed.stem.1.conv.weight").decay);
  EXPECT_FALSE(t.at("patch_embed.stem.1.norm.weight").decay);
  // Patchify stem: 384*3*16*16 + 384 embedding parameters; conv stem: the convs, norms, 1x1.
  const vit::ParamTable tp = vit::build_param_table(vit::model_preset("vit_small_patch16_224"));
  const Index stem =
      48 * 27 + 96 * 48 * 9 + 192 * 96 * 9 + 384 * 192 * 9 + 2 * (48 + 96 + 192 + 384);
  EXPECT_EQ(t.num_params - tp.num_params, stem + 384 * 384 + 384 - (384 * 768 + 384));

  // methods.md 3.2: 3x3 ~ N(0, sqrt(2 / out_ch)), 1x1 ~ N(0, sqrt(1 / out_ch)), bias 0.
  std::vector<float> p(size_t(t.total));
  vit::init_params(p.data(), t, c, 7);
  auto stats = [&](const std::string& name) {
    const vit::ParamSpec& s = t.at(name);
    double m = 0, q = 0;
    for (Index i = 0; i < s.numel(); ++i) m += p[s.offset + i];
    m /= double(s.numel());
    for (Index i = 0; i < s.numel(); ++i) q += (p[s.offset + i] - m) * (p[s.offset + i] - m);
    return std::pair{m, std::sqrt(q / double(s.numel()))};
  };
  // Relative tolerances ~5 standard errors of a sample std (1 / sqrt(2 n)): n = 1296, 165888.
  const double s0 = std::sqrt(2.0 / 48), s2 = std::sqrt(2.0 / 192), sp = std::sqrt(1.0 / 384);
  EXPECT_NEAR(stats("patch_embed.stem.0.conv.weight").second, s0, 0.1 * s0);
  EXPECT_NEAR(stats("patch_embed.stem.2.conv.weight").second, s2, 0.01 * s2);
  EXPECT_NEAR(stats("patch_embed.proj.weight").second, sp, 0.01 * sp);
  EXPECT_EQ(stats("patch_embed.proj.bias"), (std::pair{0.0, 0.0}));
  EXPECT_EQ(stats("patch_embed.stem.1.norm.weight"), (std::pair{1.0, 0.0}));
}

TEST(ConvStem, FlopsCountTheConvs) {
  const vit::ModelConfig c = conv("vit_small_patch16_224");
  const double patch = vit::model_preset("vit_small_patch16_224").forward_flops_per_image();
  // 3x3 convs at 112, 56, 28, 14 px (3->48->96->192->384), the 1x1 384->384 on 14x14; minus
  // the patchify GEMM 196 x 768 x 384. About one ViT-S block, as the paper notes.
  const double stem = 2.0 * (112 * 112 * 27 * 48 + 56 * 56 * 432 * 96 + 28 * 28 * 864 * 192 +
                             14 * 14 * 1728 * 384 + 196 * 384 * 384);
  EXPECT_DOUBLE_EQ(c.forward_flops_per_image() - patch, stem - 2.0 * 196 * 768 * 384);
}

TEST(ConvStem, CheckpointDescriptionKeepsTheStem) {
  const vit::ModelConfig c = conv("vit_fmnist_tiny");
  const std::string json = vit::model_config_to_json(c);
  EXPECT_NE(json.find("\"stem\":\"conv\""), std::string::npos) << json;
  EXPECT_EQ(vit::model_config_from_json(json).stem, vit::Stem::Conv);
  // Files written before the conv stem have no key: patchify.
  std::string old = vit::model_config_to_json(vit::model_preset("vit_fmnist_tiny"));
  const std::string key = ",\"stem\":\"patch\"";
  ASSERT_NE(old.find(key), std::string::npos) << old;
  old.erase(old.find(key), key.size());
  EXPECT_EQ(vit::model_config_from_json(old).stem, vit::Stem::Patch);
}

vit::ModelConfig small_conv() {
  vit::ModelConfig c = conv("vit_fmnist_tiny");  // C 96: widths 48, 96
  c.img_size = 16;
  c.in_chans = 1;
  c.num_classes = 5;
  c.drop_path = 0.1;
  c.validate();
  return c;
}

std::vector<float> initial_params(const vit::ParamTable& t, const vit::ModelConfig& c) {
  std::vector<float> p(size_t(t.total), 0.0f);
  vit::init_params(p.data(), t, c, 42);
  return p;
}

// As EngineTest.Bf16EmulationTrainsCloseToFp32 (test_engine.cpp), with the conv stem: its
// GEMMs, LayerNorms and col2im sums round to bf16 where the CUDA bf16 backend rounds.
TEST(ConvStem, Bf16EmulationTrainsCloseToFp32) {
  const vit::ModelConfig c = small_conv();
  const Index B = 8;
  auto cpu = vit::make_engine(vit::test::engine_options("cpu", "bf16", c, B));
  auto emu = vit::make_engine(vit::test::engine_options("emu", "bf16", c, B));
  vit::test::expect_trains_close_to_fp32(*emu, *cpu, initial_params(cpu->table(), c), c, B);
}

// The stem follows set_img_size (16 -> 8: layers 8 -> 4 -> 2) inside the arena planned at the
// largest size, and then computes exactly what a fresh engine at the small size does.
TEST(ConvStem, ImageSizeSwitchMatchesAFreshEngine) {
  const vit::ModelConfig c = small_conv();
  const Index B = 4;
  vit::ModelEngine<vit::CpuBackend<float>> big(vit::test::engine_options("cpu", "bf16", c, B));
  const size_t arena = big.model().arena_bytes();
  const auto p0 = initial_params(big.table(), c);
  big.write_params(p0);
  const auto r = vit::resize_model(c, big.table(), p0, {}, {}, 8);
  big.set_img_size(8);
  big.write_params(r.params);
  EXPECT_EQ(big.model().arena_bytes(), arena);

  vit::ModelConfig small = c;
  small.img_size = 8;
  auto fresh = vit::make_engine(vit::test::engine_options("cpu", "bf16", small, B));
  fresh->write_params(r.params);
  const vit::test::Batch b = vit::test::random_batch(small, B, 9);
  for (vit::Engine* e : {static_cast<vit::Engine*>(&big), fresh.get()}) {
    e->zero_grad();
    e->forward_backward(b.images.data(), b.targets.data(), B, 1.0f / B, 2);
    e->step(1e-3);
  }
  EXPECT_EQ(big.read_params(), fresh->read_params());
  EXPECT_EQ(big.read_stats().last_loss, fresh->read_stats().last_loss);
}

}  // namespace
