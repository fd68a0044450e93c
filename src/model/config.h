// Model configuration and named presets.
#pragma once
#include <string>
#include <vector>

#include "core/common.h"

namespace vit {

enum class Classifier { Token, Avg };  // class token + final norm | mean of patch tokens + fc_norm
// Linear-GELU-Linear (exact erf GELU, timm's) | the same with the tanh GELU (timm's gelu_tanh;
// the GPU fuses it into the GEMMs' epilogues) | the locality FFN (methods.md 1.3)
enum class Ffn { Mlp, MlpTanh, Local };
// Patch embedding: one stride-P conv (patchify) | the hybrid conv stem (Xiao et al. 2021,
// "Early convolutions help transformers see better"; methods.md 3.2): log2(P) 3x3 stride-2
// convs, each followed by a channels-last LayerNorm and ReLU, then a 1x1 conv with bias to C.
enum class Stem { Patch, Conv };

struct ModelConfig {
  std::string name = "vit_tiny_patch16_224";
  int img_size = 224;
  int patch_size = 16;
  int in_chans = 3;
  int embed_dim = 192;  // C
  int depth = 12;       // L
  int num_heads = 3;    // H
  double mlp_ratio = 4.0;
  int num_classes = 1000;  // K
  Classifier classifier = Classifier::Token;
  bool qkv_bias = true;
  Ffn ffn = Ffn::Mlp;
  double drop_path = 0.0;         // max stochastic-depth rate, linear over depth
  double layer_scale_init = 0.0;  // 0 = no layer scale
  Stem stem = Stem::Patch;

  int grid() const { return img_size / patch_size; }
  int num_patches() const { return grid() * grid(); }
  // The avg classifier has no class token (Meta's pooled classifier; timm class_token=False).
  int num_prefix() const { return classifier == Classifier::Token ? 1 : 0; }
  int num_tokens() const { return num_patches() + num_prefix(); }             // N
  int head_dim() const { return embed_dim / num_heads; }                      // D
  int hidden_dim() const { return static_cast<int>(embed_dim * mlp_ratio); }  // M
  bool has_mlp_bias() const { return ffn != Ffn::Local; }
  // Output channels of the conv stem's 3x3 convs, first to last (empty for the patchify stem).
  // For P = 2^k: width_i = max(C >> (k - i), min(C, 16)) for i = 1..k, doubling up to C, as
  // pycls's ViT-C (C 384, P 16: 48, 96, 192, 384); at least 16 channels (or C if smaller).
  std::vector<int> stem_widths() const;

  // Throws vit::Error with a user-facing message when the combination is invalid.
  void validate() const;
  // Forward FLOPs per image (multiply-adds count 2), used for throughput and MFU reports.
  double forward_flops_per_image() const;
};

// Known presets: timm's vit_{tiny,small,base}_patch16_224 and small-image presets
// (vit_{tiny,small}_patch4_32, vit_tiny_patch4_28, ...). Throws vit::Error for unknown names.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

const char* to_string(Classifier c);
const char* to_string(Ffn f);
const char* to_string(Stem s);
Classifier classifier_from_string(const std::string& s);
Ffn ffn_from_string(const std::string& s);
Stem stem_from_string(const std::string& s);

}  // namespace vit
