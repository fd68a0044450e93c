// The one parameter table: every learnable tensor with its timm key name, shape, initialiser
// and weight-decay flag. It assigns offsets into ONE contiguous buffer, laid out as all
// weight-decayed tensors first and then all non-decayed ones, so the fused AdamW needs a single
// boundary index instead of a per-element mask. Params, grads and both AdamW moments use the
// same layout.
#pragma once
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
};

struct ParamSpec {
  std::string name;          // timm state_dict key, e.g. "blocks.0.attn.qkv.weight"
  std::vector<Index> shape;  // timm shape
  Init init = Init::Zeros;
  bool decay = false;  // AdamW weight decay applies (ndim > 1 and not pos_embed/cls_token)
  Index fan_in = 0;    // for ConvDefault
  Index offset = 0;    // element offset in the contiguous buffer
  Index numel() const;
};

struct ParamTable {
  std::vector<ParamSpec> specs;  // in timm state_dict order
  Index total = 0;               // elements in the buffer
  Index num_decay = 0;           // elements [0, num_decay) are weight-decayed

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

template <typename T>
struct ModelView {
  T *patch_w, *patch_b;  // (C, Cin, P, P), (C)
  T* cls;                // (1, 1, C) or nullptr (avg classifier)
  T* pos;                // (1, N, C)
  std::vector<BlockView<T>> blocks;
  T *norm_w, *norm_b;  // final norm (token) or fc_norm (avg): (C)
  T *head_w, *head_b;  // (K, C), (K)
};

template <typename T>
ModelView<T> bind_view(const ParamTable& table, const ModelConfig& cfg, T* base);

}  // namespace vit
