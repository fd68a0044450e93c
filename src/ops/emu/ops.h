// CPU bf16 emulation ops: the layer ops of the CUDA bf16 backend (src/ops/cuda/ops.h with
// T = __nv_bfloat16), on the host. Activations and weights are stored as vit::bf16 and rounded
// exactly where the CUDA kernels round; everything in between is the fp32 CPU reference
// (vit::cpu::<op><float>) on the widened inputs. Two uses:
//  * CI, which has no GPU, runs the mixed-precision model logic (what is stored in bf16, what
//    stays fp32, where gradients accumulate) through EmuBackend (src/backend/host.h);
//  * on a GPU machine, the CUDA bf16 model is compared to this emulation step by step with
//    tight tolerances: both round the same values at the same points, so they differ only by
//    fp32 summation order and the odd value that rounds the other way.
//
// Same names, argument order and accumulate/overwrite rules as vit::cuda (and vit::cpu); host
// pointers. fp32 regardless of storage, as on the GPU: parameter gradients (they accumulate),
// LayerNorm mean/rstd, cross-entropy losses/probabilities/targets, drop-path sample scales.
//
// Rounding points (each bf16 output is rounded ONCE from its fp32 value unless noted):
//  * matmul_forward: GEMM result + bias in fp32, then one rounding. matmul_gelu_tanh_forward
//    rounds that value and, separately, its tanh GELU (cuBLASLt's GELU epilogue).
//  * layernorm_backward, pool_backward: dinp / dx ACCUMULATE as round(bf16 old + fp32 delta)
//    (bf16 stream; an fp32 stream adds without rounding).
//  * attention_forward: the probabilities att are rounded and the P @ V GEMM reads the rounded
//    values; scores stay fp32. attention_backward: dS is rounded and the dQ / dK GEMMs read
//    it; dP stays fp32.
//  * flash_attention_forward: keys in tiles of kFlashTile; per tile the unnormalised
//    probabilities exp2(s - running max) are rounded for the P @ V product, the running sum
//    adds them unrounded, out = round(O / sum). flash_attention_backward: P recomputed from
//    lse in fp32 and rounded for dV = P^T dO; dS = P (dP - rowsum(dO * out)) scale rounded
//    for dQ and dK.
//  * im2patches, im2col3x3s2, ReLU: exact; with a bf16 stream also embed_tokens_backward's
//    dpatch_out and token pooling (copies).
//  * col2im3x3s2: the (at most 4) taps summed in fp32 in (kh, kw) order, then one rounding.
//
// The residual stream (the block inputs and outputs, r1 between the two branches, and their
// gradient dres) is stored as X: bf16 like the other activations, or fp32 (--fp32-residual,
// what PyTorch autocast does: its adds run in fp32). The ops that read or write it take X; with
// X = float nothing of the stream is rounded: residual_forward's sum, the pooled features (and
// their gradient), LayerNorm's and pooling's accumulated input gradients stay fp32, and the bf16
// outputs computed from it (LayerNorm's out, embed_tokens_backward's dpatch_out,
// residual_backward's dbranch) are rounded once from their fp32 values. The embedding adds the
// bf16 weight copy's class token and position embedding in fp32.
#pragma once
#include <type_traits>

#include "core/bf16.h"
#include "core/common.h"

namespace vit::emu {

// Elementwise conversion: dst (n) = src (n), fp32 -> bf16 rounds to nearest even; fp32 -> fp32
// copies (dst may equal src).
void convert(bf16* dst, const float* src, Index n);
void convert(float* dst, const bf16* src, Index n);
void convert(float* dst, const float* src, Index n);

// out (M, Nout) = inp (M, K) @ weight (Nout, K)^T + bias (Nout) [bias may be nullptr].
void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, Index M,
                    Index K, Index Nout);
// dinp (M, K) = dout @ weight (overwrite); dweight (Nout, K) += dout^T @ inp; dbias (Nout) +=
// column sums of dout.
void matmul_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                     const bf16* weight, Index M, Index K, Index Nout);
// The CUDA backend's Linear + tanh GELU in cuBLASLt's epilogues (ops/cuda/ops.h): forward, pre
// (M, Hid) = round(GEMM + bias) and act = round(gelu_tanh(the same fp32 value)); backward, fc2's
// weight and bias gradients as matmul_backward, dpre (M, Hid) = round(gelu_tanh'(pre) * the fp32
// product dout @ weight), and dpre_bias (Hid) += round_bf16(fp32 column sums of the unrounded
// dpre) (cuBLASLt writes the bias gradient in the output type). dact is unused.
void matmul_gelu_tanh_forward(bf16* act, bf16* pre, const bf16* inp, const bf16* weight,
                              const bf16* bias, Index M, Index K, Index Hid);
void matmul_gelu_tanh_backward(bf16* dpre, float* dpre_bias, float* dweight, float* dbias,
                               bf16* dact, const bf16* dout, const bf16* act, const bf16* pre,
                               const bf16* weight, Index M, Index Hid, Index Nout);

// LayerNorm over the last dim C of (R, C) rows; saves mean (R) and rstd (R) in fp32. The input
// (and its gradient) is the residual stream's type X (bf16 or float).
template <class X>
void layernorm_forward(bf16* out, float* mean, float* rstd, const X* inp, const bf16* weight,
                       const bf16* bias, Index R, Index C, float eps);
// dinp (R, C) ACCUMULATES (may be nullptr: X comes from inp); dweight, dbias (C) accumulate.
template <class X>
void layernorm_backward(std::type_identity_t<X>* dinp, float* dweight, float* dbias,
                        const bf16* dout, const X* inp, const bf16* weight, const float* mean,
                        const float* rstd, Index R, Index C);

// qkv (B, N, 3*H*D) -> att (B, H, N, N) softmax probabilities, out (B, N, H*D). Scale D^-0.5.
void attention_forward(bf16* out, bf16* att, const bf16* qkv, Index B, Index N, Index H, Index D);
// dqkv (B, N, 3*H*D) overwrite.
void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att, Index B,
                        Index N, Index H, Index D);

// The fused (flash-style) attention of src/ops/cuda/flash_attention.cu, its rounding points
// reproduced (see flash_attention.cpp): out (B, N, H*D) and lse (B, H, N) fp32, the natural-log
// log-sum-exp of each row's scaled scores, from qkv (B, N, 3*H*D).
void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, Index B, Index N, Index H,
                             Index D);
// dqkv (B, N, 3*H*D) overwrite, from the forward's out and lse (the probabilities recomputed).
void flash_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, Index B, Index N, Index H, Index D);

// Exact (erf) GELU, tanh-approximation GELU (PyTorch's gelu(approximate='tanh')) and
// h-swish, elementwise over n values.
void gelu_forward(bf16* out, const bf16* inp, Index n);
void gelu_backward(bf16* dinp, const bf16* dout, const bf16* inp, Index n);
void gelu_tanh_forward(bf16* out, const bf16* inp, Index n);
void gelu_tanh_backward(bf16* dinp, const bf16* dout, const bf16* inp, Index n);
void hswish_forward(bf16* out, const bf16* inp, Index n);
void hswish_backward(bf16* dinp, const bf16* dout, const bf16* inp, Index n);

// ReLU, elementwise; out may alias inp, dinp may alias dout; `inp` may be the forward's output.
void relu_forward(bf16* out, const bf16* inp, Index n);
void relu_backward(bf16* dinp, const bf16* dout, const bf16* inp, Index n);

// Depthwise 3x3 conv on the token grid; the first `prefix` rows of each sample bypass it (their
// output and input-gradient rows are 0). inp/out (B, N, C), weight (C, 1, 3, 3).
void dwconv3x3_forward(bf16* out, const bf16* inp, const bf16* weight, Index B, Index N,
                       Index prefix, Index gh, Index gw, Index C);
// dinp (B, N, C) overwrite (prefix rows zeroed); dweight (C, 1, 3, 3) accumulates.
void dwconv3x3_backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp,
                        const bf16* weight, Index B, Index N, Index prefix, Index gh, Index gw,
                        Index C);

// img (B, Cin, Himg, Wimg) NCHW -> patches (B, gh*gw, Cin*P*P), each ordered (c, ph, pw).
void im2patches(bf16* patches, const bf16* img, Index B, Index Cin, Index Himg, Index Wimg,
                Index P);

// The conv stem's 3x3 stride-2 pad-1 conv as a GEMM: inp (B, H, W, C), or (B, C, H, W) when
// `nchw`, -> cols (B, Ho, Wo, C*9) ordered (c, kh, kw); Ho = (H + 1) / 2.
void im2col3x3s2(bf16* cols, const bf16* inp, Index B, Index H, Index W, Index C, bool nchw);
// dinp (B, H, W, C) overwrite = the adjoint of im2col (channels-last) applied to dcols.
void col2im3x3s2(bf16* dinp, const bf16* dcols, Index B, Index H, Index W, Index C);

// The ops below read or write the residual stream as X (bf16 or float; see the top).
// x (B, N, C): x[b, n < prefix] = cls + pos[n], x[b, prefix + p] = patch_out[b, p] + pos.
template <class X>
void embed_tokens_forward(X* x, const bf16* patch_out, const bf16* cls, const bf16* pos, Index B,
                          Index N, Index prefix, Index C);
// dpatch_out (B, N - prefix, C) overwrite; dcls (C) and dpos (N, C) accumulate.
template <class X>
void embed_tokens_backward(bf16* dpatch_out, float* dcls, float* dpos, const X* dx, Index B,
                           Index N, Index prefix, Index C);

// out (B, S, C) = x + sample_scale[b] * gamma[c] * branch; gamma (C), sample_scale (B) may be
// nullptr (meaning 1). out may alias x.
template <class X>
void residual_forward(X* out, const X* x, const bf16* branch, const bf16* gamma,
                      const float* sample_scale, Index B, Index S, Index C);
// dbranch (B, S, C) overwrite = sample_scale * gamma * dout; dgamma (C) accumulates.
template <class X>
void residual_backward(bf16* dbranch, float* dgamma, const X* dout, const bf16* branch,
                       const bf16* gamma, const float* sample_scale, Index B, Index S, Index C);

// out (B, C): the class token (avg == false) or the mean of x[b, prefix:N]. The pooled features
// and their gradient are the stream's type too (fp32 with an fp32 stream, as autocast's fp32 mean
// feeding its fp32 LayerNorm).
template <class X>
void pool_forward(X* out, const X* x, Index B, Index N, Index prefix, Index C, bool avg);
// dx (B, N, C) ACCUMULATES.
template <class X>
void pool_backward(X* dx, const X* dout, Index B, Index N, Index prefix, Index C, bool avg);

// losses (B) = -sum_k t_k log softmax(logits)_k, probs (B, K) saved; all fp32 but the logits.
void cross_entropy_forward(float* losses, float* probs, const bf16* logits, const float* targets,
                           Index B, Index K);
// dlogits (B, K) overwrite = (probs - targets) * dloss.
void cross_entropy_backward(bf16* dlogits, const float* probs, const float* targets, float dloss,
                            Index B, Index K);

}  // namespace vit::emu
