// The bodies of VitModel<Backend> (src/model/vit.h), included by the files that instantiate it
// for their backends (vit.cpp: the host backends; vit_cuda.cpp: the CUDA backend).
#pragma once
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/profile.h"
#include "core/rng.h"
#include "model/conv_stem.h"
#include "model/op_work.h"
#include "model/vit.h"
#include "model/model_plan.h"
#include "ops/attention_choice.h"

namespace vit {

// Activations of one block, kept for the backward pass (pointers into the arena). S: stored
// activations, A: fp32 statistics, R: the residual stream (S, or fp32 with --fp32-residual).
template <class S, class A, class R>
struct BlockActs {
  S* ln1 = nullptr;                            // (B, N, C)
  A *ln1_mean = nullptr, *ln1_rstd = nullptr;  // (B*N)
  S* qkv = nullptr;                            // (B, N, 3C)
  S* att = nullptr;                            // (B, H, N, N) softmax probabilities (unfused)
  A* lse = nullptr;                            // (B, H, N) row log-sum-exp (fused attention)
  S* atty = nullptr;                           // (B, N, C) heads concatenated, before proj
  S* proj = nullptr;                           // (B, N, C) attention branch output
  R* r1 = nullptr;                             // (B, N, C) residual after the attention branch
  S* ln2 = nullptr;                            // (B, N, C)
  A *ln2_mean = nullptr, *ln2_rstd = nullptr;  // (B*N)
  S* fc1 = nullptr;                            // (B, N, M) before the activation
  S* act1 = nullptr;                           // (B, N, M) GELU or h-swish of fc1 (see below)
  S *dw = nullptr, *act2 = nullptr;            // (B, N, M) local FFN only: conv out, h-swish
  S* fc2 = nullptr;                            // (B, N, C) FFN branch output
  A *scale1 = nullptr, *scale2 = nullptr;      // (B) stochastic-depth scales, in drop_scales
  // act1 of the local FFN is nullptr on backends that recompute it (kLocalFfnStoresAct1).
};

// The sizes a block's ops take, at batch B and the model's current image size.
struct BlockDims {
  Index N, C, M, H, D;     // tokens, channels, FFN hidden width, heads, head dim
  Index prefix, grid, BN;  // class-token rows, patch-grid side, B * N
  bool local;              // locality FFN
};
inline BlockDims block_dims(const ModelConfig& c, Index B) {
  const Index N = c.num_tokens();
  return {N,        c.embed_dim, c.hidden_dim(),     c.num_heads, c.head_dim(), c.num_prefix(),
          c.grid(), B * N,       c.ffn == Ffn::Local};
}

template <class Backend>
struct VitModel<Backend>::Acts {
  using S = Store;
  using A = Acc;
  using R = Res;
  S* patches = nullptr;                          // (B, Np, Cin*P*P) patchify stem only
  StemActs<S, A> stem;                           // conv stem only (conv_stem.h)
  S* patch_out = nullptr;                        // (B, Np, C)
  std::vector<R*> res;                           // L+1 x (B, N, C): block inputs, then output
  std::vector<BlockActs<S, A, R>> blocks;        // L
  R* pooled = nullptr;                           // (B, C) in the stream's type
  S* pooled_norm = nullptr;                      // (B, C)
  A *pool_mean = nullptr, *pool_rstd = nullptr;  // (B)
  S* logits = nullptr;                           // (B, K)
  A *probs = nullptr, *losses = nullptr;         // (B, K), (B)
  // Gradient scratch, shared by all layers.
  R* dres = nullptr;                                       // (B, N, C) residual-stream gradient
  S *dbranch = nullptr, *datty = nullptr, *dln = nullptr;  // (B, N, C)
  S* dqkv = nullptr;                                       // (B, N, 3C)
  S *dhid_a = nullptr, *dhid_b = nullptr;                  // (B, N, M)
  S* dpatch_out = nullptr;                                 // (B, Np, C)
  S* dlogits = nullptr;                                    // (B, K)
  R* dpooled = nullptr;                                    // (B, C)
  S* dpooled_norm = nullptr;                               // (B, C)
  A* drop_scales = nullptr;  // (L, 2, max B): per layer the attention then the FFN branch
};

template <class Backend>
VitModel<Backend>::VitModel(const ModelConfig& cfg, Index max_batch, int max_img_size,
                            KernelPlan* plan, Index capacity_multiple)
    : cfg_(cfg),
      table_(build_param_table(cfg)),
      max_batch_(max_batch),
      max_img_size_(max_img_size > 0 ? max_img_size : cfg.img_size),
      fused_attention_(Backend::kFusedAttention &&
                       plans_flash(plan, cfg, max_batch, storage_of<typename Backend::Store>())) {
  VIT_CHECK(max_batch > 0, "batch size must be positive");
  VIT_CHECK(max_img_size_ >= cfg.img_size && max_img_size_ % cfg.patch_size == 0,
            "model: the largest image size must be a multiple of the patch size and at least "
            "the current size");
  ModelConfig big = cfg;
  big.img_size = max_img_size_;
  VIT_CHECK(capacity_multiple > 0, "model: the capacity multiple must be positive");
  capacity_ = std::max(table_.total, build_param_table(big).total);
  capacity_ = (capacity_ + capacity_multiple - 1) / capacity_multiple * capacity_multiple;
  params = Buffer<Acc>(size_t(capacity_));
  grads = Buffer<Acc>(size_t(capacity_));
  Backend::zero(params.data(), capacity_);
  Backend::zero(grads.data(), capacity_);
  if constexpr (!std::is_same_v<Store, Acc>) {
    lowp_ = Buffer<Store>(size_t(capacity_));
    Backend::zero(lowp_.data(), capacity_);
  }
  if constexpr (Backend::kHost) {
    std::vector<Acc>& p = params;
    init_params(p.data(), table_, cfg_, 0);
  } else {
    std::vector<float> host(size_t(table_.total));
    init_params(host.data(), table_, cfg_, 0);
    Backend::upload(params.data(), host.data(), table_.total);
  }
  sync_weights();
  plan_arena();
  rebind();
}

template <class Backend>
VitModel<Backend>::~VitModel() = default;

template <class Backend>
void VitModel<Backend>::plan_arena() {
  // Sized at the largest token count of the run; smaller sizes use a prefix of each slot.
  ModelConfig big = cfg_;
  big.img_size = max_img_size_;
  const Index B = max_batch_, N = big.num_tokens(), C = big.embed_dim, M = big.hidden_dim();
  const Index H = big.num_heads, K = big.num_classes, Np = big.num_patches();
  const Index F = Index(big.in_chans) * big.patch_size * big.patch_size;
  const bool local = big.ffn == Ffn::Local;
  acts_ = std::make_unique<Acts>();
  Acts& a = *acts_;
  std::vector<std::pair<size_t, void**>> binds;
  auto slot = [&](auto*& ptr, const std::string& name, Index count) {
    using E = std::remove_pointer_t<std::remove_reference_t<decltype(ptr)>>;
    binds.push_back({plan_.add(name, count, sizeof(E)), reinterpret_cast<void**>(&ptr)});
  };
  if (big.stem == Stem::Conv)
    plan_stem(a.stem, big, B, slot);
  else
    slot(a.patches, "patches", B * Np * F);
  slot(a.patch_out, "patch_out", B * Np * C);
  a.res.assign(cfg_.depth + 1, nullptr);
  for (int l = 0; l <= cfg_.depth; ++l) slot(a.res[l], "res", B * N * C);
  a.blocks.resize(cfg_.depth);
  for (auto& b : a.blocks) {
    slot(b.ln1, "ln1", B * N * C);
    slot(b.ln1_mean, "ln1_mean", B * N);
    slot(b.ln1_rstd, "ln1_rstd", B * N);
    slot(b.qkv, "qkv", B * N * 3 * C);
    if (fused_attention_)
      slot(b.lse, "lse", B * H * N);
    else
      slot(b.att, "att", B * H * N * N);
    slot(b.atty, "atty", B * N * C);
    slot(b.proj, "proj", B * N * C);
    slot(b.r1, "r1", B * N * C);
    slot(b.ln2, "ln2", B * N * C);
    slot(b.ln2_mean, "ln2_mean", B * N);
    slot(b.ln2_rstd, "ln2_rstd", B * N);
    slot(b.fc1, "fc1", B * N * M);
    if (!local || Backend::kLocalFfnStoresAct1) slot(b.act1, "act1", B * N * M);
    if (local) {
      slot(b.dw, "dw", B * N * M);
      slot(b.act2, "act2", B * N * M);
    }
    slot(b.fc2, "fc2", B * N * C);
  }
  slot(a.pooled, "pooled", B * C);
  slot(a.pooled_norm, "pooled_norm", B * C);
  slot(a.pool_mean, "pool_mean", B);
  slot(a.pool_rstd, "pool_rstd", B);
  slot(a.logits, "logits", B * K);
  slot(a.probs, "probs", B * K);
  slot(a.losses, "losses", B);
  slot(a.dres, "dres", B * N * C);
  // A branch's own gradient buffer only where branch_grad (backward_block) cannot read dres in
  // place: with layer scale, stochastic depth or the fp32 residual stream.
  if (!std::is_same_v<Res, Store> || cfg_.layer_scale_init > 0 || cfg_.drop_path > 0)
    slot(a.dbranch, "dbranch", B * N * C);
  slot(a.datty, "datty", B * N * C);
  slot(a.dln, "dln", B * N * C);
  slot(a.dqkv, "dqkv", B * N * 3 * C);
  slot(a.dhid_a, "dhid_a", B * N * M);
  slot(a.dhid_b, "dhid_b", B * N * M);
  slot(a.dpatch_out, "dpatch_out", B * Np * C);
  slot(a.dlogits, "dlogits", B * K);
  slot(a.dpooled, "dpooled", B * C);
  slot(a.dpooled_norm, "dpooled_norm", B * C);
  // Stochastic-depth scales of all layers in one slot: one upload per forward.
  slot(a.drop_scales, "drop_scales", Index(cfg_.depth) * 2 * B);
  plan_.verify();
  // One block; its start is aligned by hand (host vectors only promise 16 bytes).
  arena_ = Buffer<std::byte>(plan_.total_bytes() + kArenaAlign);
  const auto raw = reinterpret_cast<uintptr_t>(arena_.data());
  std::byte* base = arena_.data() + (kArenaAlign - raw % kArenaAlign) % kArenaAlign;
  for (auto& [offset, ptr] : binds) *ptr = base + offset;
  for (int l = 0; l < cfg_.depth; ++l) {
    a.blocks[l].scale1 = a.drop_scales + Index(l) * 2 * B;
    a.blocks[l].scale2 = a.blocks[l].scale1 + B;
  }
  drop_path_host_.assign(size_t(cfg_.depth) * 2 * B, Acc(0));
}

template <class Backend>
void VitModel<Backend>::rebind() {
  w_ = bind_view(table_, cfg_, weights());
  g_ = bind_view(table_, cfg_, grads.data());
}

template <class Backend>
void VitModel<Backend>::set_img_size(int size) {
  VIT_CHECK(size > 0 && size <= max_img_size_ && size % cfg_.patch_size == 0,
            "model: image size must be a multiple of the patch size, at most the run's largest");
  cfg_.img_size = size;
  table_ = build_param_table(cfg_);
  // Past the table the buffers hold zeros (ZeRO-1 sums and copies that padding): a smaller
  // table leaves the larger one's tail behind.
  Backend::zero(params.data() + table_.total, capacity_ - table_.total);
  Backend::zero(grads.data() + table_.total, capacity_ - table_.total);
  rebind();
}

template <class Backend>
typename VitModel<Backend>::Store* VitModel<Backend>::weights() {
  if constexpr (std::is_same_v<Store, Acc>)
    return params.data();
  else
    return lowp_.data();
}

template <class Backend>
void VitModel<Backend>::sync_weights() {
  if constexpr (!std::is_same_v<Store, Acc>)
    Backend::convert(lowp_.data(), params.data(), capacity_);
}

template <class Backend>
void VitModel<Backend>::zero_grad() {
  Backend::zero(grads.data(), table_.total);
}

template <class Backend>
const typename VitModel<Backend>::Store* VitModel<Backend>::logits() const {
  return acts_->logits;
}

template <class Backend>
const typename VitModel<Backend>::Acc* VitModel<Backend>::losses() const {
  return acts_->losses;
}

template <class Backend>
double VitModel<Backend>::mean_loss() const {
  VIT_CHECK(has_targets_, "mean_loss() needs a forward() with targets");
  std::vector<Acc> per_sample(static_cast<size_t>(batch_));  // (B)
  Backend::download(per_sample.data(), acts_->losses, batch_);
  double sum = 0;
  for (Index i = 0; i < batch_; ++i) sum += double(per_sample[i]);
  return sum / double(batch_);
}

template <class Backend>
void VitModel<Backend>::draw_drop_path(Index B, uint64_t seed) {
  // Stochastic depth: rate rises linearly over depth (timm's linspace(0, rate, L)); drawn on
  // the host in a fixed order (layer, branch, sample) so every backend sees the same masks,
  // then uploaded at once in the slot's layout (rows of max_batch_).
  Rng rng(mix_seed(seed, 0xd209));
  const int L = cfg_.depth;
  const Index Bmax = max_batch_;
  for (int l = 0; l < L; ++l) {
    const double rate = L > 1 ? cfg_.drop_path * l / (L - 1) : 0.0;
    const double keep = 1.0 - rate;
    Acc* s = drop_path_host_.data() + size_t(l) * 2 * Bmax;  // (2, max B)
    for (int branch = 0; branch < 2; ++branch)
      for (Index i = 0; i < B; ++i)
        s[branch * Bmax + i] = rng.uniform() < keep ? Acc(1 / keep) : Acc(0);
  }
  Backend::upload(acts_->drop_scales, drop_path_host_.data(), Index(L) * 2 * Bmax);
}

template <class Backend>
void VitModel<Backend>::forward(const Store* images, const Acc* targets, Index B, bool train,
                                uint64_t seed) {
  begin_pass(targets, B, train, seed);
  forward_ops(images);
}

template <class Backend>
void VitModel<Backend>::begin_pass(const Acc* targets, Index B, bool train, uint64_t seed) {
  VIT_CHECK(B > 0 && B <= max_batch_, "batch larger than the model was allocated for");
  batch_ = B;
  targets_ = targets;
  has_targets_ = targets != nullptr;
  drop_path_active_ = train && cfg_.drop_path > 0;
  if (drop_path_active_) draw_drop_path(B, seed);
}

template <class Backend>
void VitModel<Backend>::forward_ops(const Store* images) {
  using W = ModelOpWork<Store, Res>;  // op work for the profile
  const ModelConfig& c = cfg_;
  const Index B = batch_, N = c.num_tokens(), C = c.embed_dim, K = c.num_classes;
  const Index Np = c.num_patches(), P = c.patch_size, pre = c.num_prefix();
  const Index F = Index(c.in_chans) * P * P;
  const Acc* targets = targets_;
  Acts& a = *acts_;

  // Patch embedding (a stride-P conv as a GEMM, or the conv stem), class token, position
  // embedding.
  if (c.stem == Stem::Conv) {
    stem_forward<Backend>(a.stem, w_, a.patch_out, images, B, c);
  } else {
    {
      ProfileScope prof("im2patches");
      Backend::im2patches(a.patches, images, B, Index(c.in_chans), Index(c.img_size),
                          Index(c.img_size), P);
    }
    ProfileScope prof("matmul_forward", W::matmul_forward(B * Np, F, C));
    Backend::matmul_forward(a.patch_out, a.patches, w_.patch_w, w_.patch_b, B * Np, F, C);
  }
  {
    ProfileScope prof("embed_tokens_forward", W::stream(B * N * C, 1, 1));
    Backend::embed_tokens_forward(a.res[0], a.patch_out, w_.cls, w_.pos, B, N, pre, C);
  }

  for (int l = 0; l < c.depth; ++l) {
    const BlockActs<Store, Acc, Res>& b = a.blocks[l];
    forward_block(l, B, drop_path_active_ ? b.scale1 : nullptr,
                  drop_path_active_ ? b.scale2 : nullptr);
  }

  // Classifier: pool (class token or patch mean), norm, head.
  {
    ProfileScope prof("pool_forward", W::stream(B * N * C, 1, 0));
    Backend::pool_forward(a.pooled, static_cast<const Res*>(a.res[c.depth]), B, N, pre, C,
                          c.classifier == Classifier::Avg);
  }
  {
    ProfileScope prof("layernorm_forward", W::elementwise(B * C, 2));
    Backend::layernorm_forward(a.pooled_norm, a.pool_mean, a.pool_rstd,
                               static_cast<const Res*>(a.pooled), w_.norm_w, w_.norm_b, B, C,
                               Acc(1e-6));
  }
  {
    ProfileScope prof("matmul_forward", W::matmul_forward(B, C, K));
    Backend::matmul_forward(a.logits, static_cast<const Store*>(a.pooled_norm), w_.head_w,
                            w_.head_b, B, C, K);
  }
  if (!targets) return;
  ProfileScope prof("cross_entropy_forward");
  Backend::cross_entropy_forward(a.losses, a.probs, static_cast<const Store*>(a.logits), targets, B,
                                 K);
}

// Attention core of block l: (B, N, 3C) qkv -> (B, N, C) atty, saving the probabilities
// (unfused) or the row log-sum-exp (fused) for the backward.
template <class Backend>
void VitModel<Backend>::attention_forward(int l, Index B) {
  using W = ModelOpWork<Store, Res>;  // op work for the profile
  const auto [N, C, M, H, D, pre, g, BN, local] = block_dims(cfg_, B);
  const BlockActs<Store, Acc, Res>& b = acts_->blocks[l];
  if constexpr (Backend::kFusedAttention) {
    if (fused_attention_) {
      ProfileScope prof("flash_attention_forward", W::attention(B, N, H, D, 2, 4, true));
      Backend::flash_attention_forward(b.atty, b.lse, static_cast<const Store*>(b.qkv), B, N, H, D);
      return;
    }
  }
  ProfileScope prof("attention_forward", W::attention(B, N, H, D, 2, 4, false));
  Backend::attention_forward(b.atty, b.att, static_cast<const Store*>(b.qkv), B, N, H, D);
}

// d(atty) in datty -> d(qkv) in dqkv (overwritten); the fused backward also reads atty.
template <class Backend>
void VitModel<Backend>::attention_backward(int l, Index B) {
  using W = ModelOpWork<Store, Res>;  // op work for the profile
  const auto [N, C, M, H, D, pre, g, BN, local] = block_dims(cfg_, B);
  Acts& a = *acts_;
  const BlockActs<Store, Acc, Res>& b = a.blocks[l];
  using CS = const Store*;
  if constexpr (Backend::kFusedAttention) {
    if (fused_attention_) {
      ProfileScope prof("flash_attention_backward", W::attention(B, N, H, D, 5, 6, true));
      Backend::flash_attention_backward(a.dqkv, CS(a.datty), CS(b.qkv), CS(b.atty),
                                        static_cast<const Acc*>(b.lse), B, N, H, D);
      return;
    }
  }
  ProfileScope prof("attention_backward", W::attention(B, N, H, D, 4, 7, false));
  Backend::attention_backward(a.dqkv, CS(a.datty), CS(b.qkv), CS(b.att), B, N, H, D);
}

// stream (B, N, C) = x + sample_scale gamma branch, then its LayerNorm into ln (B, N, C) with
// mean, rstd (B * N): one pass on the GPU, the two ops on the host backends (the same bits).
template <class Backend>
void VitModel<Backend>::residual_norm_forward(Res* stream, const Res* x, const Store* branch,
                                              const Store* gamma, const Acc* sample_scale,
                                              Store* ln, Acc* mean, Acc* rstd, const Store* norm_w,
                                              const Store* norm_b, Index B, Index N) {
  using W = ModelOpWork<Store, Res>;  // op work for the profile
  const Index C = cfg_.embed_dim, BN = B * N;
  ProfileScope prof("residual_layernorm_forward", W::stream(BN * C, 2, 2));
  Backend::residual_layernorm_forward(stream, ln, mean, rstd, x, branch, gamma, sample_scale,
                                      norm_w, norm_b, B, N, C, Acc(1e-6));
}

// The residual adds are fused with the LayerNorm after them: r1's with norm2, and the block's
// output add with block l + 1's norm1 (that block then starts at its qkv).
template <class Backend>
void VitModel<Backend>::forward_block(int l, Index B, const Acc* s1, const Acc* s2) {
  using W = ModelOpWork<Store, Res>;  // op work for the profile
  const auto [N, C, M, H, D, pre, g, BN, local] = block_dims(cfg_, B);
  Acts& a = *acts_;
  const BlockActs<Store, Acc, Res>& b = a.blocks[l];
  const BlockView<Store>& bw = w_.blocks[l];
  const Res* x = a.res[l];  // (B, N, C)

  // Attention branch (for l > 0 the previous block's output add has normed x already).
  if (l == 0) {
    ProfileScope prof("layernorm_forward", W::stream(BN * C, 1, 1));
    Backend::layernorm_forward(b.ln1, b.ln1_mean, b.ln1_rstd, x, bw.norm1_w, bw.norm1_b, BN, C,
                               Acc(1e-6));
  }
  {
    ProfileScope prof("matmul_forward", W::matmul_forward(BN, C, 3 * C));
    Backend::matmul_forward(b.qkv, static_cast<const Store*>(b.ln1), bw.qkv_w, bw.qkv_b, BN, C,
                            3 * C);
  }
  attention_forward(l, B);
  {
    ProfileScope prof("matmul_forward", W::matmul_forward(BN, C, C));
    Backend::matmul_forward(b.proj, static_cast<const Store*>(b.atty), bw.proj_w, bw.proj_b, BN, C,
                            C);
  }
  residual_norm_forward(b.r1, x, static_cast<const Store*>(b.proj), bw.ls1, s1, b.ln2, b.ln2_mean,
                        b.ln2_rstd, bw.norm2_w, bw.norm2_b, B, N);

  // FFN branch.
  if (!local) {
    // fc1 and its GELU: for the tanh form one GEMM with the GELU in cuBLASLt's epilogue on the
    // GPU (bf16); the exact GELU runs as its own kernel after the GEMM.
    OpWork work = W::matmul_forward(BN, C, M);
    work.bytes += W::elementwise(BN * M, 1).bytes;  // act1 besides fc1
    ProfileScope prof("matmul_gelu_forward", work);
    const Store* ln2 = b.ln2;
    if (cfg_.ffn == Ffn::MlpTanh)
      Backend::matmul_gelu_tanh_forward(b.act1, b.fc1, ln2, bw.fc1_w, bw.fc1_b, BN, C, M);
    else
      Backend::matmul_gelu_forward(b.act1, b.fc1, ln2, bw.fc1_w, bw.fc1_b, BN, C, M);
  } else {
    ProfileScope prof("matmul_forward", W::matmul_forward(BN, C, M));
    Backend::matmul_forward(b.fc1, static_cast<const Store*>(b.ln2), bw.fc1_w, bw.fc1_b, BN, C, M);
  }
  const Store* hidden;
  if (local) {
    // Linear -> h-swish -> depthwise 3x3 on the grid -> h-swish -> Linear (the middle three in
    // one pass on the GPU). The class-token row leaves the conv as 0 and fc2 has no bias, so
    // the class token bypasses the FFN.
    {
      // fc1 in; dw, act2 and (where the backend stores it) act1 out.
      ProfileScope prof("local_ffn_forward",
                        W::dwconv(B, g * g, M, 1, Backend::kLocalFfnStoresAct1 ? 4 : 3));
      Backend::local_ffn_forward(b.act1, b.dw, b.act2, static_cast<const Store*>(b.fc1), bw.dw_w, B,
                                 N, pre, g, g, M);
    }
    hidden = b.act2;
  } else {
    hidden = b.act1;  // written with fc1 above
  }
  {
    ProfileScope prof("matmul_forward", W::matmul_forward(BN, M, C));
    Backend::matmul_forward(b.fc2, hidden, bw.fc2_w, bw.fc2_b, BN, M, C);
  }
  const Res* r1 = b.r1;
  const Store* fc2 = b.fc2;
  if (l + 1 < cfg_.depth) {
    const BlockActs<Store, Acc, Res>& next = a.blocks[l + 1];
    const BlockView<Store>& nw = w_.blocks[l + 1];
    residual_norm_forward(a.res[l + 1], r1, fc2, bw.ls2, s2, next.ln1, next.ln1_mean, next.ln1_rstd,
                          nw.norm1_w, nw.norm1_b, B, N);
  } else {
    ProfileScope prof("residual_forward", W::stream(BN * C, 2, 1));
    Backend::residual_forward(a.res[l + 1], r1, fc2, bw.ls2, s2, B, N, C);
  }
}

template <class Backend>
void VitModel<Backend>::backward(Acc loss_scale, const std::function<void(int)>& grads_final) {
  using W = ModelOpWork<Store, Res>;  // op work for the profile
  VIT_CHECK(has_targets_, "backward() needs a forward() with targets");
  const ModelConfig& c = cfg_;
  const Index B = batch_, N = c.num_tokens(), C = c.embed_dim, K = c.num_classes;
  const Index pre = c.num_prefix(), BN = B * N;
  Acts& a = *acts_;

  // Head.
  {
    ProfileScope prof("cross_entropy_backward");
    Backend::cross_entropy_backward(a.dlogits, static_cast<const Acc*>(a.probs), targets_,
                                    loss_scale, B, K);
  }
  {
    ProfileScope prof("matmul_backward", W::matmul_backward(B, C, K));
    Backend::matmul_backward(
        a.dpooled_norm, g_.head_w, g_.head_b, static_cast<const Store*>(a.dlogits),
        static_cast<const Store*>(a.pooled_norm), static_cast<const Store*>(w_.head_w), B, C, K);
  }
  Backend::zero(a.dpooled, B * C);
  {
    ProfileScope prof("layernorm_backward", W::elementwise(B * C, 4));
    Backend::layernorm_backward(
        a.dpooled, g_.norm_w, g_.norm_b, static_cast<const Store*>(a.dpooled_norm),
        static_cast<const Res*>(a.pooled), static_cast<const Store*>(w_.norm_w),
        static_cast<const Acc*>(a.pool_mean), static_cast<const Acc*>(a.pool_rstd), B, C);
  }
  Backend::zero(a.dres, BN * C);
  {
    ProfileScope prof("pool_backward", W::stream(B * N * C, 2, 0));
    Backend::pool_backward(a.dres, static_cast<const Res*>(a.dpooled), B, N, pre, C,
                           c.classifier == Classifier::Avg);
  }

  if (grads_final) grads_final(c.depth);

  for (int l = c.depth - 1; l >= 0; --l) {
    const BlockActs<Store, Acc, Res>& b = a.blocks[l];
    backward_block(l, B, drop_path_active_ ? b.scale1 : nullptr,
                   drop_path_active_ ? b.scale2 : nullptr);
    if (grads_final) grads_final(l);
  }
  backward_embedding(B);
  if (grads_final) grads_final(-1);
}

// The class token, position embedding and patchify (or conv stem) gradients from dres.
template <class Backend>
void VitModel<Backend>::backward_embedding(Index B) {
  using W = ModelOpWork<Store, Res>;  // op work for the profile
  const ModelConfig& c = cfg_;
  const Index N = c.num_tokens(), C = c.embed_dim, Np = c.num_patches(), P = c.patch_size;
  const Index pre = c.num_prefix(), F = Index(c.in_chans) * P * P;
  Acts& a = *acts_;
  {
    ProfileScope prof("embed_tokens_backward", W::stream(B * N * C, 1, 1));
    Backend::embed_tokens_backward(a.dpatch_out, g_.cls, g_.pos, static_cast<const Res*>(a.dres), B,
                                   N, pre, C);
  }
  if (c.stem == Stem::Conv) {
    stem_backward<Backend>(a.stem, w_, g_, static_cast<const Store*>(a.dpatch_out), B, c);
    return;
  }
  ProfileScope prof("matmul_backward", W::matmul_backward(B * Np, F, C, false));
  Backend::matmul_backward(
      static_cast<Store*>(nullptr), g_.patch_w, g_.patch_b, static_cast<const Store*>(a.dpatch_out),
      static_cast<const Store*>(a.patches), static_cast<const Store*>(w_.patch_w), B * Np, F, C);
}

template <class Backend>
void VitModel<Backend>::backward_block(int l, Index B, const Acc* s1, const Acc* s2) {
  using W = ModelOpWork<Store, Res>;  // op work for the profile
  const auto [N, C, M, H, D, pre, g, BN, local] = block_dims(cfg_, B);
  Acts& a = *acts_;
  const BlockActs<Store, Acc, Res>& b = a.blocks[l];
  const BlockView<Store>& bw = w_.blocks[l];
  const BlockView<Acc>& bg = g_.blocks[l];
  using CS = const Store*;
  using CA = const Acc*;
  using CR = const Res*;
  // The gradient of a branch's output (B, N, C): sample_scale * gamma * d(block output). Without
  // layer scale and stochastic depth that is d(block output) itself, which residual_backward
  // would only copy (exactly), so the branch reads dres in place, before the LayerNorm backward
  // adds to it: one pass over the stream less per branch, the same bits.
  auto branch_grad = [&](const Store* ls, const Acc* s, Acc* dls, const Store* out) -> CS {
    if constexpr (std::is_same_v<Res, Store>)
      if (!ls && !s) return CS(a.dres);
    VIT_CHECK(a.dbranch, "backward: no dbranch slot planned for layer scale or drop path");
    ProfileScope prof("residual_backward", W::stream(BN * C, 1, 2));
    Backend::residual_backward(a.dbranch, dls, CR(a.dres), out, ls, s, B, N, C);
    return CS(a.dbranch);
  };

  // FFN branch; dres holds d(block output) and, through the identity path, d(r1).
  const Store* dffn = branch_grad(CS(bw.ls2), s2, bg.ls2, CS(b.fc2));
  const Store* hidden = local ? b.act2 : b.act1;
  Acc* fc1_db = bg.fc1_b;  // nullptr with the locality FFN: its fc1 has no bias
  if (!local) {
    // fc2's backward through the GELU into d(fc1) (dhid_b; d(act1) in dhid_a where the backend
    // forms it) and fc1's bias gradient: on the GPU (bf16) the GELU's backward and the bias
    // sums are the data-gradient GEMM's epilogue for the tanh form (cuBLASLt's); the exact
    // one's are a kernel of their own.
    OpWork work = W::matmul_backward(BN, M, C);
    work.bytes += W::elementwise(BN * M, 1).bytes;  // fc1's output, read for the GELU
    ProfileScope prof("matmul_gelu_backward", work);
    if (cfg_.ffn == Ffn::MlpTanh)
      Backend::matmul_gelu_tanh_backward(a.dhid_b, fc1_db, bg.fc2_w, bg.fc2_b, a.dhid_a, dffn,
                                         hidden, CS(b.fc1), CS(bw.fc2_w), BN, M, C);
    else
      Backend::matmul_gelu_backward(a.dhid_b, fc1_db, bg.fc2_w, bg.fc2_b, a.dhid_a, dffn, hidden,
                                    CS(b.fc1), CS(bw.fc2_w), BN, M, C);
    fc1_db = nullptr;
  } else {
    ProfileScope prof("matmul_backward", W::matmul_backward(BN, M, C));
    Backend::matmul_backward(a.dhid_a, bg.fc2_w, bg.fc2_b, dffn, hidden, CS(bw.fc2_w), BN, M, C);
  }
  // Back to fc1's output through the locality FFN's middle (h-swish, depthwise 3x3, h-swish;
  // one pass on the GPU, d(act2) in dhid_a is its scratch on the host); the GELUs' backward
  // came with fc2's above.
  if (local) {
    ProfileScope prof("local_ffn_backward", W::dwconv(B, g * g, M, 2, 7));
    Backend::local_ffn_backward(a.dhid_b, bg.dw_w, a.dhid_a, CS(b.dw), CS(b.act1), CS(b.fc1),
                                CS(bw.dw_w), B, N, pre, g, g, M);
  }
  {
    ProfileScope prof("matmul_backward", W::matmul_backward(BN, C, M));
    Backend::matmul_backward(a.dln, bg.fc1_w, fc1_db, CS(a.dhid_b), CS(b.ln2), CS(bw.fc1_w), BN, C,
                             M);
  }
  {
    ProfileScope prof("layernorm_backward", W::stream(BN * C, 3, 1));
    Backend::layernorm_backward(a.dres, bg.norm2_w, bg.norm2_b, CS(a.dln), CR(b.r1), CS(bw.norm2_w),
                                CA(b.ln2_mean), CA(b.ln2_rstd), BN, C);
  }

  // Attention branch; dres now holds d(r1) and, through the identity path, d(block input).
  const Store* dattn = branch_grad(CS(bw.ls1), s1, bg.ls1, CS(b.proj));
  {
    ProfileScope prof("matmul_backward", W::matmul_backward(BN, C, C));
    Backend::matmul_backward(a.datty, bg.proj_w, bg.proj_b, dattn, CS(b.atty), CS(bw.proj_w), BN, C,
                             C);
  }
  attention_backward(l, B);
  {
    ProfileScope prof("matmul_backward", W::matmul_backward(BN, C, 3 * C));
    Backend::matmul_backward(a.dln, bg.qkv_w, bg.qkv_b, CS(a.dqkv), CS(b.ln1), CS(bw.qkv_w), BN, C,
                             3 * C);
  }
  {
    ProfileScope prof("layernorm_backward", W::stream(BN * C, 3, 1));
    Backend::layernorm_backward(a.dres, bg.norm1_w, bg.norm1_b, CS(a.dln), CR(a.res[l]),
                                CS(bw.norm1_w), CA(b.ln1_mean), CA(b.ln1_rstd), BN, C);
  }
}

}  // namespace vit
