// The one parameter table: every learnable tensor with its timm key name, shape, initialiser
// and weight-decay flag. It assigns offsets into ONE contiguous buffer, laid out as all
// weight-decayed tensors first and then all non-decayed ones, so the fused AdamW needs a single
// boundary index instead of a per-element mask. Params, grads and both AdamW moments use the
// same layout. Checkpoints store tensors by name, so the padding never reaches a weights file.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"
#include "model/config.h"

namespace vit {

enum class Init {
  Zeros,
  Ones,
  TruncNormal02,  // timm trunc_normal_(std=.02): Linear weights, pos_embed, head
  Normal1e6,      // cls_token: normal(std=1e-6)
  ConvDefault,    // PyTorch Conv2d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (weight and bias)
  LayerScale,     // constant layer_scale_init
  StemConv,       // conv stem 3x3 weights: N(0, sqrt(2 / fan)), fan = out channels (methods.md 3.2)
  StemProj,       // conv stem's last 1x1 weight: N(0, sqrt(1 / fan)), fan = out channels
};

struct ParamSpec {
  std::string name;          // timm state_dict key, e.g. "blocks.0.attn.qkv.weight"
  std::vector<Index> shape;  // timm shape
  Init init = Init::Zeros;
  bool decay = false;  // AdamW weight decay applies (ndim > 1 and not pos_embed/cls_token)
  Index fan = 0;       // ConvDefault: fan-in; StemConv, StemProj: output channels
  Index offset = 0;    // element offset in the contiguous buffer
  Index numel() const;
};

// Every tensor's offset is a multiple of this many elements, so GEMM operands inside the buffer
// (fp32 or its bf16 copy) are 128-byte aligned for cuBLASLt and vector loads.
constexpr Index kParamAlign = 64;

struct ParamTable {
  std::vector<ParamSpec> specs;  // in timm state_dict order
  Index total = 0;               // elements in the buffer, alignment padding included
  Index num_decay = 0;           // elements [0, num_decay) are weight-decayed (or padding)
  Index num_params = 0;          // learnable values: the sum of the tensors' sizes

  const ParamSpec* find(const std::string& name) const;  // nullptr if absent
  const ParamSpec& at(const std::string& name) const;    // throws vit::Error if absent
};

ParamTable build_param_table(const ModelConfig& cfg);

// Fills `params` (table.total elements) as timm's init_weights('') does, from `seed`.
template <typename T>
void init_params(T* params, const ParamTable& table, const ModelConfig& cfg, uint64_t seed);

// Typed pointers into one buffer laid out by the table (params or grads alike).
template <typename T>
struct BlockView {
  T *norm1_w, *norm1_b;  // (C)
  T *qkv_w, *qkv_b;      // (3C, C), (3C) or nullptr
  T *proj_w, *proj_b;    // (C, C), (C)
  T *norm2_w, *norm2_b;  // (C)
  T *fc1_w, *fc1_b;      // (M, C), (M) or nullptr (local FFN)
  T* dw_w;               // (M, 1, 3, 3) or nullptr (mlp FFN)
  T *fc2_w, *fc2_b;      // (C, M), (C) or nullptr (local FFN)
  T *ls1, *ls2;          // (C) or nullptr (no layer scale)
};

// One 3x3 conv of the conv stem (Stem::Conv) with its LayerNorm.
template <typename T>
struct StemView {
  T* conv_w;           // (Co, Ci, 3, 3), no bias
  T *norm_w, *norm_b;  // (Co)
};

template <typename T>
struct ModelView {
  std::vector<StemView<T>> stem;  // conv stem only, first to last
  T *patch_w, *patch_b;  // (C, Cin, P, P), (C); conv stem: the 1x1 projection (C, Co, 1, 1), (C)
  T* cls;                // (1, 1, C) or nullptr (avg classifier)
  T* pos;                // (1, N, C)
  std::vector<BlockView<T>> blocks;
  T *norm_w, *norm_b;  // final norm (token) or fc_norm (avg): (C)
  T *head_w, *head_b;  // (K, C), (K)
};

// Defined here so every storage type (fp32, fp64, host or device bf16) can bind a view.
template <typename T>
ModelView<T> bind_view(const ParamTable& table, const ModelConfig& cfg, T* base) {
  auto get = [&](const std::string& name) -> T* {
    const ParamSpec* s = table.find(name);
    return s ? base + s->offset : nullptr;
  };
  ModelView<T> v{};
  const size_t n_stem = cfg.stem_widths().size();
  for (size_t i = 0; i < n_stem; ++i) {
    const std::string s = fmt::format("patch_embed.stem.{}.", i);
    v.stem.push_back({get(s + "conv.weight"), get(s + "norm.weight"), get(s + "norm.bias")});
  }
  v.patch_w = get("patch_embed.proj.weight");
  v.patch_b = get("patch_embed.proj.bias");
  v.cls = get("cls_token");
  v.pos = get("pos_embed");
  for (int l = 0; l < cfg.depth; ++l) {
    const std::string b = fmt::format("blocks.{}.", l);
    BlockView<T> bv{};
    bv.norm1_w = get(b + "norm1.weight");
    bv.norm1_b = get(b + "norm1.bias");
    bv.qkv_w = get(b + "attn.qkv.weight");
    bv.qkv_b = get(b + "attn.qkv.bias");
    bv.proj_w = get(b + "attn.proj.weight");
    bv.proj_b = get(b + "attn.proj.bias");
    bv.norm2_w = get(b + "norm2.weight");
    bv.norm2_b = get(b + "norm2.bias");
    bv.fc1_w = get(b + "mlp.fc1.weight");
    bv.fc1_b = get(b + "mlp.fc1.bias");
    bv.dw_w = get(b + "mlp.dwconv.weight");
    bv.fc2_w = get(b + "mlp.fc2.weight");
    bv.fc2_b = get(b + "mlp.fc2.bias");
    bv.ls1 = get(b + "ls1.gamma");
    bv.ls2 = get(b + "ls2.gamma");
    v.blocks.push_back(bv);
  }
  const std::string norm = cfg.classifier == Classifier::Token ? "norm" : "fc_norm";
  v.norm_w = get(norm + ".weight");
  v.norm_b = get(norm + ".bias");
  v.head_w = get("head.weight");
  v.head_b = get("head.bias");
  return v;
}

}  // namespace vit
