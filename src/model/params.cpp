#include "model/params.h"

#include <fmt/format.h>

#include <cmath>

#include "core/rng.h"

namespace vit {

Index ParamSpec::numel() const {
  Index n = 1;
  for (Index d : shape) n *= d;
  return n;
}

const ParamSpec* ParamTable::find(const std::string& name) const {
  for (const auto& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

const ParamSpec& ParamTable::at(const std::string& name) const {
  const ParamSpec* s = find(name);
  if (!s) throw Error(fmt::format("model has no parameter '{}'", name));
  return *s;
}

ParamTable build_param_table(const ModelConfig& cfg) {
  cfg.validate();
  const Index C = cfg.embed_dim, M = cfg.hidden_dim(), P = cfg.patch_size, K = cfg.num_classes;
  ParamTable t;
  // Weight decay follows timm: none for ndim <= 1 (biases, norms, layer scale) nor for
  // pos_embed / cls_token.
  auto add = [&](std::string name, std::vector<Index> shape, Init init, Index fan = 0) {
    const bool decay = shape.size() > 1 && name != "pos_embed" && name != "cls_token";
    t.specs.push_back({std::move(name), std::move(shape), init, decay, fan, 0});
  };
  const Index fan_patch = Index(cfg.in_chans) * P * P;
  if (cfg.num_prefix()) add("cls_token", {1, 1, C}, Init::Normal1e6);
  add("pos_embed", {1, cfg.num_tokens(), C}, Init::TruncNormal02);
  if (cfg.stem == Stem::Conv) {
    // 3x3 convs without bias (a LayerNorm follows), then the 1x1 projection with bias.
    Index cin = cfg.in_chans;
    const std::vector<int> widths = cfg.stem_widths();
    for (size_t i = 0; i < widths.size(); ++i) {
      const std::string s = fmt::format("patch_embed.stem.{}.", i);
      const Index co = widths[i];
      add(s + "conv.weight", {co, cin, 3, 3}, Init::StemConv, co);
      add(s + "norm.weight", {co}, Init::Ones);
      add(s + "norm.bias", {co}, Init::Zeros);
      cin = co;
    }
    add("patch_embed.proj.weight", {C, cin, 1, 1}, Init::StemProj, C);
    add("patch_embed.proj.bias", {C}, Init::Zeros);
  } else {
    add("patch_embed.proj.weight", {C, cfg.in_chans, P, P}, Init::ConvDefault, fan_patch);
    add("patch_embed.proj.bias", {C}, Init::ConvDefault, fan_patch);
  }
  for (int l = 0; l < cfg.depth; ++l) {
    const std::string b = fmt::format("blocks.{}.", l);
    add(b + "norm1.weight", {C}, Init::Ones);
    add(b + "norm1.bias", {C}, Init::Zeros);
    add(b + "attn.qkv.weight", {3 * C, C}, Init::TruncNormal02);
    if (cfg.qkv_bias) add(b + "attn.qkv.bias", {3 * C}, Init::Zeros);
    add(b + "attn.proj.weight", {C, C}, Init::TruncNormal02);
    add(b + "attn.proj.bias", {C}, Init::Zeros);
    if (cfg.layer_scale_init > 0) add(b + "ls1.gamma", {C}, Init::LayerScale);
    add(b + "norm2.weight", {C}, Init::Ones);
    add(b + "norm2.bias", {C}, Init::Zeros);
    add(b + "mlp.fc1.weight", {M, C}, Init::TruncNormal02);
    if (cfg.has_mlp_bias()) add(b + "mlp.fc1.bias", {M}, Init::Zeros);
    if (cfg.ffn == Ffn::Local) add(b + "mlp.dwconv.weight", {M, 1, 3, 3}, Init::ConvDefault, 9);
    add(b + "mlp.fc2.weight", {C, M}, Init::TruncNormal02);
    if (cfg.has_mlp_bias()) add(b + "mlp.fc2.bias", {C}, Init::Zeros);
    if (cfg.layer_scale_init > 0) add(b + "ls2.gamma", {C}, Init::LayerScale);
  }
  const std::string norm = cfg.classifier == Classifier::Token ? "norm" : "fc_norm";
  add(norm + ".weight", {C}, Init::Ones);
  add(norm + ".bias", {C}, Init::Zeros);
  add("head.weight", {K, C}, Init::TruncNormal02);
  add("head.bias", {K}, Init::Zeros);

  // Decayed tensors first, then the rest: AdamW takes one boundary instead of a mask. Every
  // tensor starts kParamAlign-element aligned (the padding stays 0 in params, grads and moments).
  auto align = [](Index x) { return (x + kParamAlign - 1) / kParamAlign * kParamAlign; };
  Index off = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& s : t.specs)
      if (s.decay == (pass == 0)) {
        s.offset = align(off);
        off = s.offset + s.numel();
        t.num_params += s.numel();
      }
    off = align(off);
    if (pass == 0) t.num_decay = off;
  }
  t.total = off;
  return t;
}

template <typename T>
void init_params(T* params, const ParamTable& table, const ModelConfig& cfg, uint64_t seed) {
  Index i = 0;
  for (const auto& s : table.specs) {
    Rng rng(mix_seed(seed, 0x1417, uint64_t(i++)));  // one stream per tensor
    T* p = params + s.offset;
    const Index n = s.numel();
    for (Index j = 0; j < n; ++j) {
      double v = 0;
      switch (s.init) {
        case Init::Zeros:
          v = 0;
          break;
        case Init::Ones:
          v = 1;
          break;
        case Init::LayerScale:
          v = cfg.layer_scale_init;
          break;
        case Init::Normal1e6:
          v = 1e-6 * rng.normal();
          break;
        case Init::TruncNormal02:  // truncation at +-2 (absolute), as timm's trunc_normal_
          do v = 0.02 * rng.normal();
          while (std::fabs(v) > 2.0);
          break;
        case Init::ConvDefault: {
          const double bound = 1.0 / std::sqrt(double(s.fan));
          v = (2 * rng.uniform() - 1) * bound;
          break;
        }
        case Init::StemConv:
          v = std::sqrt(2.0 / double(s.fan)) * rng.normal();
          break;
        case Init::StemProj:
          v = std::sqrt(1.0 / double(s.fan)) * rng.normal();
          break;
      }
      p[j] = T(v);
    }
  }
}

template void init_params<float>(float*, const ParamTable&, const ModelConfig&, uint64_t);
template void init_params<double>(double*, const ParamTable&, const ModelConfig&, uint64_t);

}  // namespace vit
