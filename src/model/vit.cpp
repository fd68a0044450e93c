#include "model/vit.h"

#include <algorithm>
#include <cstring>

#include "core/profile.h"
#include "core/rng.h"
#include "ops/cpu/ops.h"

namespace vit {

using namespace cpu;

// Activations of one block, kept for the backward pass.
template <typename T>
struct BlockActs {
  std::vector<T> ln1, ln1_mean, ln1_rstd;  // (B, N, C), (B*N), (B*N)
  std::vector<T> qkv;                      // (B, N, 3C)
  std::vector<T> att;                      // (B, H, N, N) softmax probabilities
  std::vector<T> atty;                     // (B, N, C) heads concatenated, before proj
  std::vector<T> proj;                     // (B, N, C) attention branch output
  std::vector<T> r1;                       // (B, N, C) residual after the attention branch
  std::vector<T> ln2, ln2_mean, ln2_rstd;  // (B, N, C), (B*N), (B*N)
  std::vector<T> fc1;                      // (B, N, M) before the activation
  std::vector<T> act1;                     // (B, N, M) GELU or h-swish of fc1
  std::vector<T> dw, act2;                 // (B, N, M) local FFN only: conv out, h-swish
  std::vector<T> fc2;                      // (B, N, C) FFN branch output
  std::vector<T> scale1, scale2;           // (B) stochastic-depth sample scales
};

template <typename T>
struct Vit<T>::Acts {
  std::vector<T> patches;                // (B, Np, Cin*P*P)
  std::vector<T> patch_out;              // (B, Np, C)
  std::vector<std::vector<T>> res;       // L+1 x (B, N, C): block inputs, then final output
  std::vector<BlockActs<T>> blocks;      // L
  std::vector<T> pooled, pooled_norm;    // (B, C)
  std::vector<T> pool_mean, pool_rstd;   // (B)
  std::vector<T> logits, probs, losses;  // (B, K), (B, K), (B)
  bool drop_path_active = false;
  // Gradient scratch, shared by all layers.
  std::vector<T> dres;                   // (B, N, C) gradient of the residual stream
  std::vector<T> dbranch, datty, dln;    // (B, N, C)
  std::vector<T> dqkv;                   // (B, N, 3C)
  std::vector<T> dhid_a, dhid_b;         // (B, N, M)
  std::vector<T> dpatch_out;             // (B, Np, C)
  std::vector<T> dlogits;                // (B, K)
  std::vector<T> dpooled, dpooled_norm;  // (B, C)
};

template <typename T>
Vit<T>::Vit(const ModelConfig& cfg, Index max_batch)
    : cfg_(cfg), table_(build_param_table(cfg)), max_batch_(max_batch) {
  VIT_CHECK(max_batch > 0, "batch size must be positive");
  params.assign(table_.total, T(0));
  grads.assign(table_.total, T(0));
  init_params(params.data(), table_, cfg_, 0);
  const Index B = max_batch, N = cfg.num_tokens(), C = cfg.embed_dim, M = cfg.hidden_dim();
  const Index H = cfg.num_heads, K = cfg.num_classes, Np = cfg.num_patches();
  const Index F = Index(cfg.in_chans) * cfg.patch_size * cfg.patch_size;
  const bool local = cfg.ffn == Ffn::Local;
  acts_ = std::make_unique<Acts>();
  Acts& a = *acts_;
  a.patches.resize(B * Np * F);
  a.patch_out.resize(B * Np * C);
  a.res.assign(cfg.depth + 1, std::vector<T>(B * N * C));
  a.blocks.resize(cfg.depth);
  for (auto& b : a.blocks) {
    b.ln1.resize(B * N * C);
    b.ln1_mean.resize(B * N);
    b.ln1_rstd.resize(B * N);
    b.qkv.resize(B * N * 3 * C);
    b.att.resize(B * H * N * N);
    b.atty.resize(B * N * C);
    b.proj.resize(B * N * C);
    b.r1.resize(B * N * C);
    b.ln2.resize(B * N * C);
    b.ln2_mean.resize(B * N);
    b.ln2_rstd.resize(B * N);
    b.fc1.resize(B * N * M);
    b.act1.resize(B * N * M);
    if (local) {
      b.dw.resize(B * N * M);
      b.act2.resize(B * N * M);
    }
    b.fc2.resize(B * N * C);
    b.scale1.resize(B);
    b.scale2.resize(B);
  }
  a.pooled.resize(B * C);
  a.pooled_norm.resize(B * C);
  a.pool_mean.resize(B);
  a.pool_rstd.resize(B);
  a.logits.resize(B * K);
  a.probs.resize(B * K);
  a.losses.resize(B);
  a.dres.resize(B * N * C);
  a.dbranch.resize(B * N * C);
  a.datty.resize(B * N * C);
  a.dln.resize(B * N * C);
  a.dqkv.resize(B * N * 3 * C);
  a.dhid_a.resize(B * N * M);
  a.dhid_b.resize(B * N * M);
  a.dpatch_out.resize(B * Np * C);
  a.dlogits.resize(B * K);
  a.dpooled.resize(B * C);
  a.dpooled_norm.resize(B * C);
}

template <typename T>
Vit<T>::~Vit() = default;

template <typename T>
void Vit<T>::zero_grad() {
  std::fill(grads.begin(), grads.end(), T(0));
}

template <typename T>
const T* Vit<T>::logits() const {
  return acts_->logits.data();
}

template <typename T>
const T* Vit<T>::losses() const {
  return acts_->losses.data();
}

template <typename T>
T Vit<T>::forward(const T* images, const T* targets, Index B, bool train, uint64_t seed) {
  VIT_CHECK(B > 0 && B <= max_batch_, "batch larger than the model was allocated for");
  const ModelConfig& c = cfg_;
  const Index N = c.num_tokens(), C = c.embed_dim, M = c.hidden_dim(), H = c.num_heads;
  const Index D = c.head_dim(), K = c.num_classes, Np = c.num_patches(), P = c.patch_size;
  const Index pre = c.num_prefix(), g = c.grid(), F = Index(c.in_chans) * P * P;
  const Index BN = B * N;
  const bool local = c.ffn == Ffn::Local;
  Acts& a = *acts_;
  ModelView<T> w = bind_view(table_, cfg_, params.data());
  batch_ = B;
  images_ = images;
  targets_ = targets;
  has_targets_ = targets != nullptr;

  // Patch embedding (a stride-P conv as a GEMM), class token, position embedding.
  {
    ProfileScope prof("im2patches");
    im2patches(a.patches.data(), images, B, Index(c.in_chans), Index(c.img_size), Index(c.img_size),
               P);
  }
  {
    ProfileScope prof("matmul_forward");
    matmul_forward(a.patch_out.data(), a.patches.data(), w.patch_w, w.patch_b, B * Np, F, C);
  }
  {
    ProfileScope prof("embed_tokens_forward");
    embed_tokens_forward(a.res[0].data(), a.patch_out.data(), w.cls, w.pos, B, N, pre, C);
  }

  // Stochastic depth: rate rises linearly over depth (timm's linspace(0, rate, L)).
  a.drop_path_active = train && c.drop_path > 0;
  Rng rng(mix_seed(seed, 0xd209));
  for (int l = 0; l < c.depth; ++l) {
    BlockActs<T>& b = a.blocks[l];
    const BlockView<T>& bw = w.blocks[l];
    if (a.drop_path_active) {
      const double rate = c.depth > 1 ? c.drop_path * l / (c.depth - 1) : 0.0;
      const double keep = 1.0 - rate;
      for (Index i = 0; i < B; ++i) b.scale1[i] = rng.uniform() < keep ? T(1 / keep) : T(0);
      for (Index i = 0; i < B; ++i) b.scale2[i] = rng.uniform() < keep ? T(1 / keep) : T(0);
    }
    const T* s1 = a.drop_path_active ? b.scale1.data() : nullptr;
    const T* s2 = a.drop_path_active ? b.scale2.data() : nullptr;
    const T* x = a.res[l].data();  // (B, N, C)

    // Attention branch.
    {
      ProfileScope prof("layernorm_forward");
      layernorm_forward(b.ln1.data(), b.ln1_mean.data(), b.ln1_rstd.data(), x, bw.norm1_w,
                        bw.norm1_b, BN, C, T(1e-6));
    }
    {
      ProfileScope prof("matmul_forward");
      matmul_forward(b.qkv.data(), b.ln1.data(), bw.qkv_w, bw.qkv_b, BN, C, 3 * C);
    }
    {
      ProfileScope prof("attention_forward");
      attention_forward(b.atty.data(), b.att.data(), b.qkv.data(), B, N, H, D);
    }
    {
      ProfileScope prof("matmul_forward");
      matmul_forward(b.proj.data(), b.atty.data(), bw.proj_w, bw.proj_b, BN, C, C);
    }
    {
      ProfileScope prof("residual_forward");
      residual_forward(b.r1.data(), x, b.proj.data(), bw.ls1, s1, B, N, C);
    }

    // FFN branch.
    {
      ProfileScope prof("layernorm_forward");
      layernorm_forward(b.ln2.data(), b.ln2_mean.data(), b.ln2_rstd.data(), b.r1.data(), bw.norm2_w,
                        bw.norm2_b, BN, C, T(1e-6));
    }
    {
      ProfileScope prof("matmul_forward");
      matmul_forward(b.fc1.data(), b.ln2.data(), bw.fc1_w, bw.fc1_b, BN, C, M);
    }
    const T* hidden;
    if (local) {
      // Linear -> h-swish -> depthwise 3x3 on the grid -> h-swish -> Linear. The class-token
      // row leaves the conv as 0 and fc2 has no bias, so the class token bypasses the FFN.
      {
        ProfileScope prof("hswish_forward");
        hswish_forward(b.act1.data(), b.fc1.data(), BN * M);
      }
      {
        ProfileScope prof("dwconv3x3_forward");
        dwconv3x3_forward(b.dw.data(), b.act1.data(), bw.dw_w, B, N, pre, g, g, M);
      }
      {
        ProfileScope prof("hswish_forward");
        hswish_forward(b.act2.data(), b.dw.data(), BN * M);
      }
      hidden = b.act2.data();
    } else {
      {
        ProfileScope prof("gelu_forward");
        gelu_forward(b.act1.data(), b.fc1.data(), BN * M);
      }
      hidden = b.act1.data();
    }
    {
      ProfileScope prof("matmul_forward");
      matmul_forward(b.fc2.data(), hidden, bw.fc2_w, bw.fc2_b, BN, M, C);
    }
    {
      ProfileScope prof("residual_forward");
      residual_forward(a.res[l + 1].data(), b.r1.data(), b.fc2.data(), bw.ls2, s2, B, N, C);
    }
  }

  // Classifier: pool (class token or patch mean), norm, head.
  {
    ProfileScope prof("pool_forward");
    pool_forward(a.pooled.data(), a.res[c.depth].data(), B, N, pre, C,
                 c.classifier == Classifier::Avg);
  }
  {
    ProfileScope prof("layernorm_forward");
    layernorm_forward(a.pooled_norm.data(), a.pool_mean.data(), a.pool_rstd.data(), a.pooled.data(),
                      w.norm_w, w.norm_b, B, C, T(1e-6));
  }
  {
    ProfileScope prof("matmul_forward");
    matmul_forward(a.logits.data(), a.pooled_norm.data(), w.head_w, w.head_b, B, C, K);
  }
  if (!targets) return T(0);
  {
    ProfileScope prof("cross_entropy_forward");
    cross_entropy_forward(a.losses.data(), a.probs.data(), a.logits.data(), targets, B, K);
  }
  double sum = 0;
  for (Index i = 0; i < B; ++i) sum += a.losses[i];
  return T(sum / B);
}

template <typename T>
void Vit<T>::backward(T loss_scale) {
  VIT_CHECK(has_targets_, "backward() needs a forward() with targets");
  const ModelConfig& c = cfg_;
  const Index B = batch_, N = c.num_tokens(), C = c.embed_dim, M = c.hidden_dim();
  const Index H = c.num_heads, D = c.head_dim(), K = c.num_classes, Np = c.num_patches();
  const Index P = c.patch_size, pre = c.num_prefix(), g = c.grid();
  const Index F = Index(c.in_chans) * P * P, BN = B * N;
  const bool local = c.ffn == Ffn::Local;
  Acts& a = *acts_;
  ModelView<T> w = bind_view(table_, cfg_, params.data());
  ModelView<T> dw = bind_view(table_, cfg_, grads.data());

  // Head.
  {
    ProfileScope prof("cross_entropy_backward");
    cross_entropy_backward(a.dlogits.data(), a.probs.data(), targets_, loss_scale, B, K);
  }
  {
    ProfileScope prof("matmul_backward");
    matmul_backward(a.dpooled_norm.data(), dw.head_w, dw.head_b, a.dlogits.data(),
                    a.pooled_norm.data(), w.head_w, B, C, K);
  }
  std::fill(a.dpooled.begin(), a.dpooled.begin() + B * C, T(0));
  {
    ProfileScope prof("layernorm_backward");
    layernorm_backward(a.dpooled.data(), dw.norm_w, dw.norm_b, a.dpooled_norm.data(),
                       a.pooled.data(), w.norm_w, a.pool_mean.data(), a.pool_rstd.data(), B, C);
  }
  std::fill(a.dres.begin(), a.dres.begin() + BN * C, T(0));
  {
    ProfileScope prof("pool_backward");
    pool_backward(a.dres.data(), a.dpooled.data(), B, N, pre, C, c.classifier == Classifier::Avg);
  }

  for (int l = c.depth - 1; l >= 0; --l) {
    BlockActs<T>& b = a.blocks[l];
    const BlockView<T>& bw = w.blocks[l];
    const BlockView<T>& bg = dw.blocks[l];
    const T* s1 = a.drop_path_active ? b.scale1.data() : nullptr;
    const T* s2 = a.drop_path_active ? b.scale2.data() : nullptr;

    // FFN branch; dres holds d(block output) and, through the identity path, d(r1).
    {
      ProfileScope prof("residual_backward");
      residual_backward(a.dbranch.data(), bg.ls2, a.dres.data(), b.fc2.data(), bw.ls2, s2, B, N, C);
    }
    const T* hidden = local ? b.act2.data() : b.act1.data();
    {
      ProfileScope prof("matmul_backward");
      matmul_backward(a.dhid_a.data(), bg.fc2_w, bg.fc2_b, a.dbranch.data(), hidden, bw.fc2_w, BN,
                      M, C);
    }
    if (local) {
      {
        ProfileScope prof("hswish_backward");
        hswish_backward(a.dhid_b.data(), a.dhid_a.data(), b.dw.data(), BN * M);
      }
      {
        ProfileScope prof("dwconv3x3_backward");
        dwconv3x3_backward(a.dhid_a.data(), bg.dw_w, a.dhid_b.data(), b.act1.data(), bw.dw_w, B, N,
                           pre, g, g, M);
      }
      {
        ProfileScope prof("hswish_backward");
        hswish_backward(a.dhid_b.data(), a.dhid_a.data(), b.fc1.data(), BN * M);
      }
    } else {
      {
        ProfileScope prof("gelu_backward");
        gelu_backward(a.dhid_b.data(), a.dhid_a.data(), b.fc1.data(), BN * M);
      }
    }
    {
      ProfileScope prof("matmul_backward");
      matmul_backward(a.dln.data(), bg.fc1_w, bg.fc1_b, a.dhid_b.data(), b.ln2.data(), bw.fc1_w, BN,
                      C, M);
    }
    {
      ProfileScope prof("layernorm_backward");
      layernorm_backward(a.dres.data(), bg.norm2_w, bg.norm2_b, a.dln.data(), b.r1.data(),
                         bw.norm2_w, b.ln2_mean.data(), b.ln2_rstd.data(), BN, C);
    }

    // Attention branch; dres now holds d(r1) and, through the identity path, d(block input).
    {
      ProfileScope prof("residual_backward");
      residual_backward(a.dbranch.data(), bg.ls1, a.dres.data(), b.proj.data(), bw.ls1, s1, B, N,
                        C);
    }
    {
      ProfileScope prof("matmul_backward");
      matmul_backward(a.datty.data(), bg.proj_w, bg.proj_b, a.dbranch.data(), b.atty.data(),
                      bw.proj_w, BN, C, C);
    }
    {
      ProfileScope prof("attention_backward");
      attention_backward(a.dqkv.data(), a.datty.data(), b.qkv.data(), b.att.data(), B, N, H, D);
    }
    {
      ProfileScope prof("matmul_backward");
      matmul_backward(a.dln.data(), bg.qkv_w, bg.qkv_b, a.dqkv.data(), b.ln1.data(), bw.qkv_w, BN,
                      C, 3 * C);
    }
    {
      ProfileScope prof("layernorm_backward");
      layernorm_backward(a.dres.data(), bg.norm1_w, bg.norm1_b, a.dln.data(), a.res[l].data(),
                         bw.norm1_w, b.ln1_mean.data(), b.ln1_rstd.data(), BN, C);
    }
  }

  // Embedding.
  {
    ProfileScope prof("embed_tokens_backward");
    embed_tokens_backward(a.dpatch_out.data(), dw.cls, dw.pos, a.dres.data(), B, N, pre, C);
  }
  {
    ProfileScope prof("matmul_backward");
    matmul_backward(static_cast<T*>(nullptr), dw.patch_w, dw.patch_b, a.dpatch_out.data(),
                    a.patches.data(), w.patch_w, B * Np, F, C);
  }
}

template class Vit<float>;
template class Vit<double>;

}  // namespace vit
