#include "model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace vit {

namespace {
struct Preset {
  int img, patch, chans, dim, depth, heads, classes;
  Classifier cls;
  Ffn ffn;
  Stem stem = Stem::Patch;
};
// timm's ViTs plus small-image presets (28 px grey, 32 px colour) for MNIST-family and CIFAR.
const std::map<std::string, Preset>& presets() {
  static const std::map<std::string, Preset> p = {
      {"vit_tiny_patch16_224", {224, 16, 3, 192, 12, 3, 1000, Classifier::Token, Ffn::Mlp}},
      {"vit_small_patch16_224", {224, 16, 3, 384, 12, 6, 1000, Classifier::Token, Ffn::Mlp}},
      {"vit_base_patch16_224", {224, 16, 3, 768, 12, 12, 1000, Classifier::Token, Ffn::Mlp}},
      {"vit_tiny_patch4_32", {32, 4, 3, 192, 9, 3, 10, Classifier::Avg, Ffn::Mlp}},
      {"vit_small_patch4_32", {32, 4, 3, 384, 9, 6, 10, Classifier::Avg, Ffn::Mlp}},
      {"vit_tiny_patch4_28", {28, 4, 1, 192, 6, 3, 10, Classifier::Avg, Ffn::Mlp}},
      // The default recipe's model: small enough to train Fashion-MNIST on 2 CPU cores in minutes.
      {"vit_fmnist_tiny", {28, 4, 1, 96, 4, 3, 10, Classifier::Avg, Ffn::Mlp}},
      // The same with the locality FFN: its depthwise conv is the inductive bias that lets a ViT
      // reach 90% on Fashion-MNIST in a few epochs (docs/benchmarks.md).
      {"vit_fmnist_local", {28, 4, 1, 96, 4, 3, 10, Classifier::Avg, Ffn::Local}},
      // The same with the hybrid conv stem in place of the patchify: about a point more in the
      // same 6 epochs on the CPU (docs/benchmarks.md), for 10% more FLOPs per image.
      {"vit_fmnist_hybrid", {28, 4, 1, 96, 4, 3, 10, Classifier::Avg, Ffn::Local, Stem::Conv}},
      // The engine benchmark model of docs/benchmarks.md (C=192, L=6, H=3, 8x8 tokens).
      {"vit_bench_cpu", {32, 4, 3, 192, 6, 3, 10, Classifier::Avg, Ffn::Mlp}},
  };
  return p;
}
}  // namespace

void ModelConfig::validate() const {
  VIT_CHECK(patch_size > 0 && img_size > 0, "image and patch size must be positive");
  VIT_CHECK(
      img_size % patch_size == 0,
      fmt::format("image size {} is not divisible by the patch size {}", img_size, patch_size));
  VIT_CHECK(in_chans > 0, "input channels must be positive");
  VIT_CHECK(
      embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0,
      fmt::format("embed dim {} is not divisible by the number of heads {}", embed_dim, num_heads));
  VIT_CHECK(depth > 0, "depth must be positive");
  VIT_CHECK(mlp_ratio > 0 && hidden_dim() > 0, "mlp ratio must be positive");
  VIT_CHECK(num_classes > 0, "number of classes must be positive");
  VIT_CHECK(drop_path >= 0 && drop_path < 1, "drop path rate must be in [0, 1)");
  VIT_CHECK(layer_scale_init >= 0, "layer scale init must be >= 0");
  VIT_CHECK(stem == Stem::Patch || (patch_size >= 2 && (patch_size & (patch_size - 1)) == 0),
            fmt::format("the conv stem needs a patch size that is a power of two (at least 2), "
                        "not {}",
                        patch_size));
}

std::vector<int> ModelConfig::stem_widths() const {
  std::vector<int> w;
  if (stem != Stem::Conv) return w;
  int k = 0;
  while ((1 << k) < patch_size) ++k;
  for (int i = 1; i <= k; ++i) w.push_back(std::max(embed_dim >> (k - i), std::min(embed_dim, 16)));
  return w;
}

double ModelConfig::forward_flops_per_image() const {
  const double C = embed_dim, M = hidden_dim(), N = num_tokens(), np = num_patches();
  double f = 2.0 * np * in_chans * patch_size * patch_size * C;  // patch embedding
  if (stem == Stem::Conv) {
    // 3x3 stride-2 convs (LayerNorm and ReLU not counted, like the blocks' norms), then 1x1.
    f = 0;
    double side = img_size, cin = in_chans;
    for (const int w : stem_widths()) {
      side /= 2;
      f += 2.0 * side * side * 9 * cin * w;
      cin = w;
    }
    f += 2.0 * np * cin * C;
  }
  // The locality FFN runs on the patch tokens only (the class token bypasses it).
  const double n_ffn = ffn == Ffn::Local ? np : N;
  double block = N * (2 * C * 3 * C + 2 * C * C);  // qkv, proj
  block += n_ffn * (2 * C * M + 2 * M * C);        // fc1, fc2
  block += 2 * (2 * N * N * C);                    // QK^T and PV
  if (ffn == Ffn::Local) block += np * 2 * 9 * M;  // depthwise conv
  f += depth * block;
  f += 2 * C * num_classes;  // head
  return f;
}

ModelConfig model_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string known;
    for (auto& [k, v] : presets()) known += (known.empty() ? "" : ", ") + k;
    throw Error(fmt::format("unknown model '{}' (known: {})", name, known));
  }
  const Preset& p = it->second;
  ModelConfig c;
  c.name = name;
  c.img_size = p.img;
  c.patch_size = p.patch;
  c.in_chans = p.chans;
  c.embed_dim = p.dim;
  c.depth = p.depth;
  c.num_heads = p.heads;
  c.num_classes = p.classes;
  c.classifier = p.cls;
  c.ffn = p.ffn;
  c.stem = p.stem;
  return c;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (auto& [k, v] : presets()) names.push_back(k);
  return names;
}

const char* to_string(Classifier c) {
  return c == Classifier::Token ? "token" : "avg";
}
const char* to_string(Ffn f) {
  return f == Ffn::Mlp ? "mlp" : f == Ffn::MlpTanh ? "mlp_tanh" : "local";
}

const char* to_string(Stem s) {
  return s == Stem::Patch ? "patch" : "conv";
}

Classifier classifier_from_string(const std::string& s) {
  if (s == "token") return Classifier::Token;
  if (s == "avg") return Classifier::Avg;
  throw Error(fmt::format("unknown classifier '{}' (use token or avg)", s));
}

Ffn ffn_from_string(const std::string& s) {
  if (s == "mlp") return Ffn::Mlp;
  if (s == "mlp_tanh") return Ffn::MlpTanh;
  if (s == "local") return Ffn::Local;
  throw Error(fmt::format("unknown ffn '{}' (use mlp, mlp_tanh or local)", s));
}

Stem stem_from_string(const std::string& s) {
  if (s == "patch") return Stem::Patch;
  if (s == "conv") return Stem::Conv;
  throw Error(fmt::format("unknown stem '{}' (use patch or conv)", s));
}

}  // namespace vit
