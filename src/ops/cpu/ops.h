// CPU reference ops: forward and backward of every layer of the ViT, fp32 for training and fp64
// for finite-difference checks (each op is instantiated for float and double).
//
// Conventions shared by all ops:
//  * Row-major buffers; tokens are (B, N, C), so the patch-token grid of one sample is a
//    channels-last image and needs no transposition.
//  * Parameter gradients (dweight, dbias, dgamma, ...) ACCUMULATE (+=): the caller zeroes the
//    gradient buffer once per optimizer update, which gives gradient accumulation for free.
//  * Input gradients OVERWRITE unless the doc says "accumulates" (LayerNorm and pooling add into
//    the residual-stream gradient, which is how the residual branch's identity path is carried).
//  * A nullptr gradient output means "not needed" and is skipped.
#pragma once
#include "core/common.h"

namespace vit::cpu {

// out (M, Nout) = inp (M, K) @ weight (Nout, K)^T + bias (Nout) [bias may be nullptr].
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, Index M, Index K,
                    Index Nout);
// dinp (M, K) = dout @ weight (overwrite); dweight (Nout, K) += dout^T @ inp; dbias (Nout) +=
// column sums of dout.
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     Index M, Index K, Index Nout);

// LayerNorm over the last dim C of (R, C) rows; saves mean (R) and rstd (R) for backward.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       Index R, Index C, T eps);
// dinp (R, C) ACCUMULATES; dweight, dbias (C) accumulate.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, Index R, Index C);

// Multi-head self-attention core. qkv (B, N, 3*H*D) holds [q heads | k heads | v heads] per
// token (timm's qkv Linear layout); att (B, H, N, N) receives the softmax probabilities;
// out (B, N, H*D) the heads concatenated in order. Scale is D^-0.5.
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, Index B, Index N, Index H, Index D);
// dqkv (B, N, 3*H*D) overwrite.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, Index B, Index N,
                        Index H, Index D);

// Exact (erf) GELU, elementwise over n values.
template <typename T>
void gelu_forward(T* out, const T* inp, Index n);
template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, Index n);

// Tanh-approximation GELU, PyTorch's gelu(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi)
// (x + 0.044715 x^3))), elementwise over n values.
template <typename T>
void gelu_tanh_forward(T* out, const T* inp, Index n);
template <typename T>
void gelu_tanh_backward(T* dinp, const T* dout, const T* inp, Index n);

// h-swish: x * relu6(x + 3) / 6, elementwise.
template <typename T>
void hswish_forward(T* out, const T* inp, Index n);
template <typename T>
void hswish_backward(T* dinp, const T* dout, const T* inp, Index n);

// ReLU, elementwise; out may alias inp. The backward's mask is inp > 0, and `inp` may be the
// forward's output instead (same sign), so the model runs ReLU in place; dinp may alias dout.
template <typename T>
void relu_forward(T* out, const T* inp, Index n);
template <typename T>
void relu_backward(T* dinp, const T* dout, const T* inp, Index n);

// Depthwise 3x3 convolution, stride 1, padding 1, no bias, on the token grid. inp/out (B, N, C)
// where the first `prefix` tokens of each sample (class token) are not part of the grid: their
// output rows are written as 0 (they bypass the conv) and their input gradient is 0.
// The remaining N - prefix = gh*gw tokens are the grid in row-major (h, w) order.
// weight (C, 1, 3, 3) as PyTorch's Conv2d(groups=C).
template <typename T>
void dwconv3x3_forward(T* out, const T* inp, const T* weight, Index B, Index N, Index prefix,
                       Index gh, Index gw, Index C);
// dinp (B, N, C) overwrite (prefix rows zeroed); dweight (C, 1, 3, 3) accumulates.
template <typename T>
void dwconv3x3_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, Index B,
                        Index N, Index prefix, Index gh, Index gw, Index C);

// Patch extraction for the patch-embedding GEMM: img (B, Cin, Himg, Wimg) NCHW ->
// patches (B, gh*gw, Cin*P*P), each patch vector ordered (c, ph, pw) to match the Conv2d
// weight (C, Cin, P, P) reshaped to (C, Cin*P*P); patches in row-major (h, w) order.
template <typename T>
void im2patches(T* patches, const T* img, Index B, Index Cin, Index Himg, Index Wimg, Index P);

// The conv stem's 3x3 stride-2 padding-1 convolution as a GEMM (src/ops/cpu/conv_stem.cpp).
// Output side Ho = (H + 1) / 2, Wo = (W + 1) / 2 (H / 2 for the even sides the stem has).
// im2col: inp (B, H, W, C) channels-last, or (B, C, H, W) when `nchw` (the input image) ->
// cols (B, Ho, Wo, C*9), each row ordered (c, kh, kw) to match the Conv2d weight (Co, C, 3, 3)
// reshaped to (Co, C*9); taps outside the image are 0. Then
// matmul_forward(out (B*Ho*Wo, Co), cols, weight) gives the channels-last output (B, Ho, Wo, Co).
template <typename T>
void im2col3x3s2(T* cols, const T* inp, Index B, Index H, Index W, Index C, bool nchw);
// col2im, the adjoint of im2col (channels-last only: the image needs no gradient):
// dinp (B, H, W, C) overwrite = the sum of the dcols (B, Ho, Wo, C*9) entries each input
// element was copied to, at most 4, summed in (kh, kw) order.
template <typename T>
void col2im3x3s2(T* dinp, const T* dcols, Index B, Index H, Index W, Index C);

// Token assembly: x (B, N, C) with x[b, 0] = cls + pos[0] (when prefix == 1) and
// x[b, prefix + p] = patch_out[b, p] + pos[prefix + p]. patch_out (B, N - prefix, C),
// cls (C) or nullptr when prefix == 0, pos (N, C).
template <typename T>
void embed_tokens_forward(T* x, const T* patch_out, const T* cls, const T* pos, Index B, Index N,
                          Index prefix, Index C);
// dpatch_out (B, N - prefix, C) overwrite; dcls (C) and dpos (N, C) accumulate.
template <typename T>
void embed_tokens_backward(T* dpatch_out, T* dcls, T* dpos, const T* dx, Index B, Index N,
                           Index prefix, Index C);

// Residual add of a branch with optional layer scale and per-sample stochastic-depth scale:
// out (B, S, C) = x + sample_scale[b] * gamma[c] * branch, where S = tokens per sample.
// gamma (C) and sample_scale (B) may be nullptr (meaning 1). out may alias x.
template <typename T>
void residual_forward(T* out, const T* x, const T* branch, const T* gamma, const T* sample_scale,
                      Index B, Index S, Index C);
// dbranch (B, S, C) overwrite = sample_scale * gamma * dout; dgamma (C) accumulates
// sum(sample_scale * branch * dout). The identity path (dx = dout) is left to the caller, who
// keeps using the same residual-gradient buffer.
template <typename T>
void residual_backward(T* dbranch, T* dgamma, const T* dout, const T* branch, const T* gamma,
                       const T* sample_scale, Index B, Index S, Index C);

// Classifier pooling: out (B, C). Token mode (avg == false): out[b] = x[b, 0]. Avg mode:
// mean of x[b, prefix:N] (patch tokens only, as timm's global_pool='avg').
template <typename T>
void pool_forward(T* out, const T* x, Index B, Index N, Index prefix, Index C, bool avg);
// dx (B, N, C) ACCUMULATES.
template <typename T>
void pool_backward(T* dx, const T* dout, Index B, Index N, Index prefix, Index C, bool avg);

// Softmax cross-entropy against soft targets (B, K) (one-hot, label smoothing and mixup all
// use this path). losses (B) = -sum_k t_k log softmax(logits)_k; probs (B, K) saved.
template <typename T>
void cross_entropy_forward(T* losses, T* probs, const T* logits, const T* targets, Index B,
                           Index K);
// dlogits (B, K) overwrite = (probs - targets) * dloss, dloss being d(total loss)/d(loss_b)
// (e.g. 1 / (B * grad_accum_steps) for a mean loss).
template <typename T>
void cross_entropy_backward(T* dlogits, const T* probs, const T* targets, T dloss, Index B,
                            Index K);

}  // namespace vit::cpu
