// The hybrid conv stem (ModelConfig::stem == Stem::Conv; Xiao et al. 2021): the patch embedding
// of VitModel (vit_impl.h) as log2(P) 3x3 stride-2 convs, each followed by a LayerNorm over the
// channels of every pixel and a ReLU, then a 1x1 conv with bias to the embedding width C.
//
// Layout: channels-last (B, H, W, C) from the first conv on, so every conv is im2col3x3s2 + the
// model's GEMM, its LayerNorm is the blocks' LayerNorm over rows of C, and the 1x1 projection's
// output (B, h*w, C) is already the patch tokens: no transposes. The first im2col reads the NCHW
// image directly.
//
// Normalisation: LayerNorm, not the paper's BatchNorm. LayerNorm has no running statistics, so
// training and evaluation compute the same function, nothing extra goes into checkpoints, and
// data-parallel ranks need no statistics sync; it also reuses the LayerNorm kernels of every
// backend (ConvNeXt normalises its channels-last convs the same way). eps 1e-6 as the blocks.
//
// Memory: per layer the conv output (the LayerNorm input) and the LayerNorm + ReLU output (ReLU in
// place: its backward masks by the output's sign) with the row statistics. The im2col rows of
// the first layer (from the image, which the model does not keep) are stored; the deeper layers'
// rows (9x their input) are recomputed in the backward into one shared scratch.
//
// VIT_PROFILE rows of the stem are prefixed stem_ (stem_matmul_forward, ...), apart from the
// blocks' ops of the same name.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "core/profile.h"
#include "model/config.h"
#include "model/params.h"

namespace vit {

// One 3x3 stride-2 conv of the stem at the model's current image size.
struct StemLayer {
  Index H, W, Ci;    // input side and channels
  Index Ho, Wo, Co;  // output side and channels
};

inline std::vector<StemLayer> stem_layers(const ModelConfig& c) {
  std::vector<StemLayer> v;
  Index side = c.img_size, ci = c.in_chans;
  for (const int co : c.stem_widths()) {
    const Index so = (side + 1) / 2;
    v.push_back({side, side, ci, so, so, Index(co)});
    side = so;
    ci = co;
  }
  return v;
}

// Activations and scratch of the stem (pointers into the model's arena).
template <class S, class A>
struct StemActs {
  std::vector<S*> conv;                 // per layer (B, Ho, Wo, Co): conv out, LayerNorm in
  std::vector<S*> act;                  // per layer (B, Ho, Wo, Co): LayerNorm + ReLU out
  std::vector<A*> mean, rstd;           // per layer (B*Ho*Wo)
  S* cols0 = nullptr;                   // (B, Ho, Wo, Cin*9): the first layer's im2col rows
  S *cols = nullptr, *dcols = nullptr;  // (B, Ho, Wo, Ci*9) of the largest deeper layer
  S *dx = nullptr, *dy = nullptr;       // (largest B*Ho*Wo*Co): gradient ping-pong
};

// Plans the stem's slots for batch B at the run's largest image size (cfg `big`) through the
// model's `slot(ptr, name, count)`.
template <class S, class A, class Slot>
void plan_stem(StemActs<S, A>& a, const ModelConfig& big, Index B, Slot&& slot) {
  const std::vector<StemLayer> layers = stem_layers(big);
  const size_t k = layers.size();
  a.conv.assign(k, nullptr);
  a.act.assign(k, nullptr);
  a.mean.assign(k, nullptr);
  a.rstd.assign(k, nullptr);
  Index cols = 0, grad = 0;
  for (size_t i = 0; i < k; ++i) {
    const StemLayer& l = layers[i];
    const Index R = B * l.Ho * l.Wo;
    slot(a.conv[i], "stem_conv", R * l.Co);
    slot(a.act[i], "stem_act", R * l.Co);
    slot(a.mean[i], "stem_mean", R);
    slot(a.rstd[i], "stem_rstd", R);
    if (i == 0)
      slot(a.cols0, "stem_cols0", R * l.Ci * 9);
    else
      cols = std::max(cols, R * l.Ci * 9);
    grad = std::max(grad, R * l.Co);
  }
  if (cols > 0) {
    slot(a.cols, "stem_cols", cols);
    slot(a.dcols, "stem_dcols", cols);
  }
  slot(a.dx, "stem_dx", grad);
  slot(a.dy, "stem_dy", grad);
}

// patch_out (B, Np, C) = the stem applied to images (B, Cin, S, S) NCHW.
template <class Backend, class S, class A>
void stem_forward(const StemActs<S, A>& a, const ModelView<S>& w, S* patch_out, const S* images,
                  Index B, const ModelConfig& c) {
  const std::vector<StemLayer> layers = stem_layers(c);
  const size_t k = layers.size();
  for (size_t i = 0; i < k; ++i) {
    const StemLayer& l = layers[i];
    const Index R = B * l.Ho * l.Wo;
    S* cols = i == 0 ? a.cols0 : a.cols;  // (R, Ci*9)
    {
      ProfileScope prof("stem_im2col3x3s2");
      Backend::im2col3x3s2(cols, i == 0 ? images : static_cast<const S*>(a.act[i - 1]), B, l.H, l.W,
                           l.Ci, i == 0);
    }
    {
      ProfileScope prof("stem_matmul_forward");
      Backend::matmul_forward(a.conv[i], static_cast<const S*>(cols), w.stem[i].conv_w,
                              static_cast<const S*>(nullptr), R, l.Ci * 9, l.Co);
    }
    {
      ProfileScope prof("stem_layernorm_forward");
      Backend::layernorm_forward(a.act[i], a.mean[i], a.rstd[i], static_cast<const S*>(a.conv[i]),
                                 w.stem[i].norm_w, w.stem[i].norm_b, R, l.Co, A(1e-6));
    }
    {
      ProfileScope prof("stem_relu_forward");
      Backend::relu_forward(a.act[i], static_cast<const S*>(a.act[i]), R * l.Co);
    }
  }
  ProfileScope prof("stem_matmul_forward");
  const Index Np = Index(c.num_patches());
  Backend::matmul_forward(patch_out, static_cast<const S*>(a.act[k - 1]), w.patch_w, w.patch_b,
                          B * Np, layers[k - 1].Co, Index(c.embed_dim));
}

// Parameter gradients of the stem (accumulated into g) from dpatch_out (B, Np, C), after a
// stem_forward at the same batch and image size.
template <class Backend, class S, class A>
void stem_backward(const StemActs<S, A>& a, const ModelView<S>& w, const ModelView<A>& g,
                   const S* dpatch_out, Index B, const ModelConfig& c) {
  using CS = const S*;
  using CA = const A*;
  const std::vector<StemLayer> layers = stem_layers(c);
  const size_t k = layers.size();
  {
    ProfileScope prof("stem_matmul_backward");
    const Index Np = Index(c.num_patches());
    Backend::matmul_backward(a.dx, g.patch_w, g.patch_b, dpatch_out, CS(a.act[k - 1]),
                             CS(w.patch_w), B * Np, layers[k - 1].Co, Index(c.embed_dim));
  }
  for (size_t i = k; i-- > 0;) {
    const StemLayer& l = layers[i];
    const Index R = B * l.Ho * l.Wo;
    // dx holds d(act[i]) (B, Ho, Wo, Co).
    {
      ProfileScope prof("stem_relu_backward");
      Backend::relu_backward(a.dx, CS(a.dx), CS(a.act[i]), R * l.Co);
    }
    Backend::zero(a.dy, R * l.Co);
    {
      ProfileScope prof("stem_layernorm_backward");
      Backend::layernorm_backward(a.dy, g.stem[i].norm_w, g.stem[i].norm_b, CS(a.dx), CS(a.conv[i]),
                                  CS(w.stem[i].norm_w), CA(a.mean[i]), CA(a.rstd[i]), R, l.Co);
    }
    if (i > 0) {
      ProfileScope prof("stem_im2col3x3s2");  // recomputed: the deeper layers' rows are not kept
      Backend::im2col3x3s2(a.cols, CS(a.act[i - 1]), B, l.H, l.W, l.Ci, false);
    }
    {
      ProfileScope prof("stem_matmul_backward");
      Backend::matmul_backward(i > 0 ? a.dcols : static_cast<S*>(nullptr), g.stem[i].conv_w,
                               static_cast<A*>(nullptr), CS(a.dy), CS(i > 0 ? a.cols : a.cols0),
                               CS(w.stem[i].conv_w), R, l.Ci * 9, l.Co);
    }
    if (i > 0) {
      ProfileScope prof("stem_col2im3x3s2");  // d(act[i - 1]) (B, H, W, Ci) into dx
      Backend::col2im3x3s2(a.dx, CS(a.dcols), B, l.H, l.W, l.Ci);
    }
  }
}

}  // namespace vit
