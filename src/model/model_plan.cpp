#include "model/model_plan.h"

namespace vit {

bool plans_flash(KernelPlan* plan, const ModelConfig& cfg, Index batch, Storage storage) {
  const OpKey key = attention_key(OpFamily::kAttention, batch, cfg.num_tokens(), cfg.num_heads,
                                  cfg.head_dim(), storage);
  return (plan ? plan->choice(key) : planned_choice(key)).variant == "flash";
}

void plan_model(KernelPlan& plan, const ModelConfig& cfg, Index batch,
                const std::vector<int>& sizes, Storage storage) {
  const Index B = batch, C = cfg.embed_dim, H = cfg.num_heads, D = cfg.head_dim(),
              M = cfg.hidden_dim();
  std::vector<int> all = sizes.empty() ? std::vector<int>{cfg.img_size} : sizes;
  for (const int size : all) {
    const Index g = size / cfg.patch_size, patches = g * g, N = patches + cfg.num_prefix();
    const auto attention = plan.choice(attention_key(OpFamily::kAttention, B, N, H, D, storage));
    if (attention.variant == "flash") {
      plan.choice(attention_key(OpFamily::kFlashForward, B, N, H, D, storage));
      plan.choice(attention_key(OpFamily::kFlashBackward, B, N, H, D, storage));
    }
    plan.choice(layernorm_key(B * N, C, storage));
    plan.choice(embed_key(B, patches, storage));
    plan.choice(pool_key(B, N, C, storage));
    plan.choice(gemm_key(B * N, C, 3 * C, storage));        // qkv
    plan.choice(gemm_key(B * N, C, C, storage));            // proj
    plan.choice(gemm_key(B * N, C, M, storage));            // fc1
    plan.choice(gemm_key(B * N, M, C, storage));            // fc2
    plan.choice(gemm_key(B, C, cfg.num_classes, storage));  // head
    if (cfg.stem == Stem::Patch)
      plan.choice(
          gemm_key(B * patches, Index(cfg.in_chans) * cfg.patch_size * cfg.patch_size, C, storage));
    if (cfg.ffn == Ffn::Local) {
      plan.choice(dwconv_key(true, B, N, M, storage));
      plan.choice(dwconv_key(false, B, N, M, storage));
    } else if (cfg.ffn == Ffn::Mlp) {
      plan.choice(gelu_key(B * N * M, storage));
    }
  }
}

}  // namespace vit
