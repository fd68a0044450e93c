// CUDA ops: the GPU twin of src/ops/cpu/ops.h, one src/ops/cuda/<family>.cu per CPU file, with
// the same names, argument order and accumulate/overwrite rules. All pointers are DEVICE
// pointers; every op is enqueued on vit::cuda::stream() and returns without synchronising.
//
// Each op is a template on the storage type T of activations and weights, instantiated for
// float (the fp32 debugging mode, checked tightly against the CPU reference) and __nv_bfloat16
// (the mixed-precision product). Arithmetic is fp32 everywhere; bf16 is only how tensors are
// stored. Where fp32 storage matters regardless of T, the type is `float` instead of T, so for
// T = float every signature is exactly the CPU one:
//  * parameter gradients (dweight, dbias, dgamma, dcls, dpos) are fp32: they accumulate over
//    micro-batches, and the fused AdamW reads them next to the fp32 master weights;
//  * LayerNorm statistics (mean, rstd), the cross-entropy losses and probabilities, the soft
//    targets and the stochastic-depth sample scales are fp32.
// The ops that read or write the residual stream (the block inputs and outputs, r1 between the
// two branches, and their gradient dres) take its type X as a second parameter, X = T by
// default; T = bf16 with X = float is --fp32-residual (src/ops/emu/ops.h says what it rounds:
// nothing of the stream; bf16 outputs computed from it are rounded once from fp32).
// Conventions (as on the CPU): row-major, tokens (B, N, C); parameter gradients ACCUMULATE;
// input gradients OVERWRITE unless marked "accumulates"; a nullptr gradient output is skipped.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "core/batch_mix.h"
#include "core/common.h"
#include "core/pixel_step.h"
#include "core/resize_plan.h"
#include "ops/cpu/adamw.h"

namespace vit::cuda {

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------------------------
// Runtime (runtime.cu; the GEMM fallback counter in blas.cu)

// Number of usable CUDA devices; 0 when there is none or no driver (never throws). `why`, when
// given, receives the CUDA error text or "0 devices".
int device_count(std::string* why = nullptr);
// The stream every op is enqueued on: the legacy default stream (0) unless set.
cudaStream_t stream();
void set_stream(cudaStream_t s);
// Waits for everything enqueued on stream(), and throws vit::Error on an asynchronous error.
void synchronize();

// Device scratch memory owned by the backend: one buffer per slot (a slot per buffer that can be
// live at the same time as another), grown on demand by the ops and never shrunk.
enum ScratchSlot : int {
  kScratchAttScores = 0,      // attention: fp32 scores / dP of one head
  kScratchAttDs = 1,          // attention backward: dS of one head
  kScratchGemmBias = 2,       // GEMM: a 16-byte aligned copy of a bias for the cuBLASLt epilogue
  kScratchFlash = 3,          // flash attention backward: Drow = rowsum(dout * out) (B, H, N) fp32
  kScratchNorm = 4,           // global grad norm partials
  kScratchDwconv = 5,         // dwconv dweight partials
  kScratchLayernorm = 6,      // layernorm dweight/dbias partials
  kScratchColsum = 7,         // column-sum partials
  kScratchPixelSteps = 8,     // pixel steps: the other half of the ping-pong (B, C, S, S) uint8
  kScratchLocalFfn = 9,       // the locality FFN's separate ops: act1, d(act1) (B, N, M)
  kScratchGeluBiasGrad = 10,  // the GELU epilogue's bias gradient (Hid) in the storage type
  kScratchSlots = 11,
};
// Grows `slot` to at least `bytes` now, so a model can size its scratch before the first step
// (and before capturing a CUDA graph, which must not see a slot move).
void reserve_scratch(int slot, size_t bytes);
// A slot that grows gets a new buffer; the old one goes on a retired list instead of being
// freed, because ops enqueued earlier may still read it (and cudaFree would synchronise the
// device mid-run). This waits for the device, then frees the retired buffers; the current slot
// buffers stay (a captured graph may hold their addresses). Without it, the driver frees them
// at process exit.
void release_scratch();
// Counts the release_scratch() calls that freed a buffer: a CUDA graph captured before the
// count moved may name freed scratch memory and must be captured again.
uint64_t scratch_epoch();

// GEMMs that went to the plain SIMT fallback kernel because cuBLASLt offered no algorithm for
// their shape and alignment (blas.cu; process-wide, counted per call; direct gemm_simt calls
// are not counted). A model shape should never need it.
Index gemm_fallback_count();
// The GEMM of blas.cuh (row-major C = alpha op(A) op(B) + beta C + bias, strided-batched) on
// the plain SIMT kernel it falls back to where cuBLASLt has no algorithm, called directly: the
// cross-check of cuBLASLt's results (CudaOps.SimtMatmulMatchesCublasLt). (float, float),
// (bf16, bf16) and (bf16, float).
template <typename TAB, typename TC>
void gemm_simt(bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const TAB* A,
               Index lda, Index stride_a, const TAB* B, Index ldb, Index stride_b, float beta,
               TC* C, Index ldc, Index stride_c, Index batch = 1, const TC* bias = nullptr);
// Calls of the GELU epilogues (matmul_gelu_tanh_*) that ran as separate ops because cuBLASLt had
// no algorithm or the operands did not fit.
Index gelu_epilogue_miss_count();
void reset_gemm_fallback_count();  // both counts

// Elementwise type conversion (fp32 <-> bf16, or a copy): dst (n) = src (n).
template <typename TDst, typename TSrc>
void convert(TDst* dst, const TSrc* src, Index n);

// ---------------------------------------------------------------------------------------------
// Layer ops (same semantics as vit::cpu::*, see src/ops/cpu/ops.h for the full docs)

// out (M, Nout) = inp (M, K) @ weight (Nout, K)^T + bias (Nout) [bias may be nullptr].
// cuBLASLt, fp32 accumulation, the bias added in the GEMM epilogue.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, Index M, Index K,
                    Index Nout);
// dinp (M, K) = dout @ weight (overwrite); dweight (Nout, K) += dout^T @ inp; dbias (Nout) +=
// column sums of dout.
template <typename T>
void matmul_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                     const T* weight, Index M, Index K, Index Nout);
// The Linear before the exact GELU: pre (M, Hid) = inp (M, K) @ weight (Hid, K)^T + bias (Hid),
// act (M, Hid) = gelu(pre), pre rounded before the GELU: matmul_forward and gelu_forward.
template <typename T>
void matmul_gelu_forward(T* act, T* pre, const T* inp, const T* weight, const T* bias, Index M,
                         Index K, Index Hid);
// The Linear after the exact GELU, backward through it: dweight (Nout, Hid) += dout (M, Nout)^T @
// act, dbias (Nout) += column sums of dout, dpre (M, Hid) = gelu'(pre) * (dout @ weight (Nout,
// Hid)) with the product rounded to T first (overwrite), dpre_bias (Hid) += its column sums; dact
// (M, Hid) receives the product first (scratch).
template <typename T>
void matmul_gelu_backward(T* dpre, float* dpre_bias, float* dweight, float* dbias, T* dact,
                          const T* dout, const T* act, const T* pre, const T* weight, Index M,
                          Index Hid, Index Nout);
// The Linear before a tanh GELU: pre (M, Hid) = inp (M, K) @ weight (Hid, K)^T + bias (Hid),
// act (M, Hid) = gelu_tanh(pre). In bf16 one GEMM with cuBLASLt's GELU epilogue, each output
// rounded once from fp32 (unless VIT_GELU_EPILOGUE=0 or cuBLASLt has no algorithm: then
// matmul_forward and gelu_tanh_forward, pre rounded before the GELU).
template <typename T>
void matmul_gelu_tanh_forward(T* act, T* pre, const T* inp, const T* weight, const T* bias, Index M,
                              Index K, Index Hid);
// The Linear after it, backward through the GELU: dweight (Nout, Hid) += dout (M, Nout)^T @ act,
// dbias (Nout) += column sums of dout, dpre (M, Hid) = gelu_tanh'(pre) * (dout @ weight (Nout,
// Hid)) (overwrite), dpre_bias (Hid) += its column sums. In bf16 the data-gradient GEMM's
// epilogue forms dpre from the fp32 product (one rounding) and its column sums in bf16; otherwise
// dact (M, Hid) receives dout @ weight first (scratch; unused by the epilogue).
template <typename T>
void matmul_gelu_tanh_backward(T* dpre, float* dpre_bias, float* dweight, float* dbias, T* dact,
                               const T* dout, const T* act, const T* pre, const T* weight, Index M,
                               Index Hid, Index Nout);

// LayerNorm over the last dim C of (R, C) rows; saves mean (R) and rstd (R) in fp32. The input
// (and its gradient) is the stream's X.
template <typename T, typename X = T>
void layernorm_forward(T* out, float* mean, float* rstd, const X* inp, const T* weight,
                       const T* bias, Index R, Index C, float eps);
// The same with the loop kernel that rows wider than 1024 take (layernorm_forward keeps short
// rows in registers): for tests, which hold the two to the same bits.
template <typename T, typename X = T>
void layernorm_forward_loop(T* out, float* mean, float* rstd, const X* inp, const T* weight,
                            const T* bias, Index R, Index C, float eps);
// residual_forward, then layernorm_forward of its result, in one pass where a row fits the
// registers (C <= 1024), else (or with VIT_FUSE_RESIDUAL_NORM=0, for the bench) the two calls;
// bitwise the two calls either way:
// stream (B, S, C) = x + sample_scale[b] gamma[c] branch (may alias x; gamma, sample_scale may be
// nullptr), out (B, S, C) = LayerNorm(stream) with mean, rstd (B * S).
template <typename T, typename X = T>
void residual_layernorm_forward(X* stream, T* out, float* mean, float* rstd, const X* x,
                                const T* branch, const T* gamma, const float* sample_scale,
                                const T* weight, const T* bias, Index B, Index S, Index C,
                                float eps);
// dinp (R, C) ACCUMULATES; dweight, dbias (C) accumulate.
template <typename T, typename X = T>
void layernorm_backward(X* dinp, float* dweight, float* dbias, const T* dout, const X* inp,
                        const T* weight, const float* mean, const float* rstd, Index R, Index C);
// Whether the LayerNorm ops above take the 16-byte kernels for bf16 rows of C channels (the
// default unless VIT_LAYERNORM_VEC=0, where C = 8 x {8, 16, 32} x {1, 2, 3, 4}; each call also
// needs its pointers 16-byte aligned, as the arena's are). Other rows, and fp32 activations, take
// the row-in-registers kernels.
bool layernorm_vectorized(Index C);

// qkv (B, N, 3*H*D) -> att (B, H, N, N) softmax probabilities, out (B, N, H*D). Scale D^-0.5.
// Batched cuBLASLt GEMMs (one launch per head, batched over B) around an fp32 softmax; the
// scores are fp32 in a scratch buffer, only the probabilities are stored as T.
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, Index B, Index N, Index H, Index D);
// dqkv (B, N, 3*H*D) overwrite.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, Index B, Index N,
                        Index H, Index D);

// Fused attention (flash-style, flash_attention.cu): never materialises the (B, H, N, N)
// matrices. Head dims D in {32, 48, 64, 96} (others throw), any N >= 1. T = bf16 runs the tile
// products on tensor cores (fp32 accumulation: the mma.sync kernels of flash_attention_mma.cu);
// T = float in plain fp32. The model's attention for these head dims.
// qkv (B, N, 3C) as in attention_forward (q | k | v, head h at columns h*D of each third);
// out (B, N, C) overwritten; lse (B, H, N) fp32 row log-sum-exp of the scaled scores (saved for
// backward).
template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, Index B, Index N, Index H, Index D);
// dqkv (B, N, 3C) OVERWRITTEN from dout (B, N, C), qkv, out and lse of the forward.
// Deterministic (no atomics).
template <typename T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              Index B, Index N, Index H, Index D);

// Exact (erf) GELU, tanh-approximation GELU (PyTorch's gelu(approximate='tanh')) and
// h-swish, elementwise over n values.
template <typename T>
void gelu_forward(T* out, const T* inp, Index n);
template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, Index n);
template <typename T>
void gelu_tanh_forward(T* out, const T* inp, Index n);
template <typename T>
void gelu_tanh_backward(T* dinp, const T* dout, const T* inp, Index n);
template <typename T>
void hswish_forward(T* out, const T* inp, Index n);
template <typename T>
void hswish_backward(T* dinp, const T* dout, const T* inp, Index n);
// The activation's backward with the column sums of dinp (R, C) folded in: dbias (C)
// ACCUMULATES them, the bias gradient of the Linear that produced inp (the FFN's fc1). Bitwise
// the activation's backward followed by matmul_backward's bias column sum, minus a read of dinp.
template <typename T>
void gelu_backward_bias(T* dinp, float* dbias, const T* dout, const T* inp, Index R, Index C);
template <typename T>
void gelu_tanh_backward_bias(T* dinp, float* dbias, const T* dout, const T* inp, Index R, Index C);
template <typename T>
void hswish_backward_bias(T* dinp, float* dbias, const T* dout, const T* inp, Index R, Index C);

// ReLU, elementwise (NaN passes); out may alias inp, dinp may alias dout; the backward's mask
// is inp > 0, and `inp` may be the forward's output.
template <typename T>
void relu_forward(T* out, const T* inp, Index n);
template <typename T>
void relu_backward(T* dinp, const T* dout, const T* inp, Index n);

// Depthwise 3x3 conv on the token grid; the first `prefix` rows of each sample bypass it (their
// output and input-gradient rows are 0). inp/out (B, N, C), weight (C, 1, 3, 3).
template <typename T>
void dwconv3x3_forward(T* out, const T* inp, const T* weight, Index B, Index N, Index prefix,
                       Index gh, Index gw, Index C);
// dinp (B, N, C) overwrite (prefix rows zeroed); dweight (C, 1, 3, 3) accumulates.
template <typename T>
void dwconv3x3_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                        Index B, Index N, Index prefix, Index gh, Index gw, Index C);
// The locality FFN's middle, the three ops hswish_forward(act1, fc1), dwconv3x3_forward(dw,
// act1), hswish_forward(act2, dw): fc1 -> act1, dw, act2 (B, N, M); act1 may be nullptr (then
// it goes through scratch; the backward does not read it).
template <typename T>
void local_ffn_forward(T* act1, T* dw, T* act2, const T* fc1, const T* weight, Index B, Index N,
                       Index prefix, Index gh, Index gw, Index M);
// Its backward, bitwise hswish_backward(ddw, dact2, dw), dwconv3x3_backward(dact1, dweight, ddw,
// act1), hswish_backward(dfc1, dact1, fc1): dfc1 (B, N, M) overwrite, dweight (M, 1, 3, 3)
// accumulates. act1 is unused (recomputed from fc1; may be nullptr). dact2 is left as it was
// here; the host backends' version uses it as scratch. act1 and d(act1) go through scratch and
// the backward recomputes act1 in a pass of its own.
template <typename T>
void local_ffn_backward(T* dfc1, float* dweight, T* dact2, const T* dw, const T* act1, const T* fc1,
                        const T* weight, Index B, Index N, Index prefix, Index gh, Index gw,
                        Index M);

// img (B, Cin, Himg, Wimg) NCHW -> patches (B, gh*gw, Cin*P*P), each ordered (c, ph, pw).
template <typename T>
void im2patches(T* patches, const T* img, Index B, Index Cin, Index Himg, Index Wimg, Index P);

// The conv stem's 3x3 stride-2 pad-1 conv as a GEMM (conv_stem.cu): inp (B, H, W, C), or
// (B, C, H, W) when `nchw`, -> cols (B, Ho, Wo, C*9) ordered (c, kh, kw); Ho = (H + 1) / 2.
template <typename T>
void im2col3x3s2(T* cols, const T* inp, Index B, Index H, Index W, Index C, bool nchw);
// dinp (B, H, W, C) overwrite = the adjoint of im2col (channels-last): the at most 4 taps of
// dcols (B, Ho, Wo, C*9) each element was copied to, summed in fp32 in (kh, kw) order.
template <typename T>
void col2im3x3s2(T* dinp, const T* dcols, Index B, Index H, Index W, Index C);

// The ops below read or write the residual stream as X (see the top).
// x (B, N, C): x[b, n < prefix] = cls + pos[n], x[b, prefix + p] = patch_out[b, p] + pos.
template <typename T, typename X = T>
void embed_tokens_forward(X* x, const T* patch_out, const T* cls, const T* pos, Index B, Index N,
                          Index prefix, Index C);
// dpatch_out (B, N - prefix, C) overwrite; dcls (C) and dpos (N, C) accumulate.
template <typename T, typename X = T>
void embed_tokens_backward(T* dpatch_out, float* dcls, float* dpos, const X* dx, Index B, Index N,
                           Index prefix, Index C);

// out (B, S, C) = x + sample_scale[b] * gamma[c] * branch; gamma (C), sample_scale (B) may be
// nullptr (meaning 1). out may alias x.
template <typename T, typename X = T>
void residual_forward(X* out, const X* x, const T* branch, const T* gamma,
                      const float* sample_scale, Index B, Index S, Index C);
// dbranch (B, S, C) overwrite = sample_scale * gamma * dout; dgamma (C) accumulates.
template <typename T, typename X = T>
void residual_backward(T* dbranch, float* dgamma, const X* dout, const T* branch, const T* gamma,
                       const float* sample_scale, Index B, Index S, Index C);

// out (B, C): the class token (avg == false) or the mean of x[b, prefix:N]. Pooling reads and
// writes the residual stream's type (the pooled features are fp32 with an fp32 stream), so it
// takes T = X.
template <typename T>
void pool_forward(T* out, const T* x, Index B, Index N, Index prefix, Index C, bool avg);
// dx (B, N, C) ACCUMULATES.
template <typename T>
void pool_backward(T* dx, const T* dout, Index B, Index N, Index prefix, Index C, bool avg);

// losses (B) = -sum_k t_k log softmax(logits)_k, probs (B, K) saved; all fp32 but the logits.
template <typename T>
void cross_entropy_forward(float* losses, float* probs, const T* logits, const float* targets,
                           Index B, Index K);
// dlogits (B, K) overwrite = (probs - targets) * dloss.
template <typename T>
void cross_entropy_backward(T* dlogits, const float* probs, const float* targets, float dloss,
                            Index B, Index K);

// ---------------------------------------------------------------------------------------------
// Optimizer (adamw.cu; the GPU twin of src/train/optimizer.cpp)

// norm (1, device, fp64) = sqrt(sum grads^2): a deterministic two-pass reduction (fixed block
// partials, then one block), fp64 accumulation as on the CPU.
void global_grad_norm(double* norm, const float* grads, Index n);
// sumsq (1, device) = sum grads^2, the same reduction without the root (ZeRO-1: each rank's
// block, summed over the ranks, then sqrt_in_place); x (1, device) = sqrt(x).
void grad_sum_of_squares(double* sumsq, const float* grads, Index n);
void sqrt_in_place(double* x);

// One fused AdamW update over the contiguous fp32 master buffer, torch.optim.AdamW math as
// vit::AdamW<float>::step: decoupled weight decay on elements [0, num_decay) only, bias
// correction with `step` (1 for the first update), and global-norm clipping when
// cfg.clip_grad > 0, the scale computed on the device from `grad_norm` (from
// global_grad_norm; no host sync; may be nullptr without clipping). params, m, v, grads (n)
// fp32; params_lowp (n), when not nullptr, receives the updated weights in TLow (the bf16 copy
// the forward reads). `apply` (1, device), when not nullptr, is judge_update's verdict: 0 skips
// the update (nothing is written).
template <typename TLow>
void adamw_step(float* params, TLow* params_lowp, float* m, float* v, const float* grads,
                const double* grad_norm, const double* apply, Index n, Index num_decay,
                const AdamWConfig& cfg, double lr, Index step);

// Model EMA (ema.cu): ema (n) = lerp(ema, params, 1 - decay), PyTorch's fused formula (bitwise
// vit::cpu::ema_update<float>), unless `apply` (1, device; nullptr = always) is 0.
void ema_update(float* ema, const float* params, const double* apply, Index n, double decay);
// a, b (n): exchanged.
void swap_buffers(float* a, float* b, Index n);

// judge_update (ops/cpu/adamw.h) on the device's step statistics (kNumStepStats): whether the
// update with the loss and grad norm held there is applied, and the skip counters.
void judge_update(double* stats);

// Input images (resize_batch.cu), the twins of src/ops/cpu/resize_batch.h on device buffers
// (pixels, tables, samples, scratch and out included): the horizontal pass, the vertical pass
// with the flip, and the normalisation by table (lut (C, 256)), random erasing (noise: the
// erase_noise_table) and the batch's mixup/cutmix into the model's input (B, C, S, S).
void resize_rows(const uint8_t* pixels, const int32_t* tables, const ResizeSample* samples, Index B,
                 Index C, Index S, uint8_t* scratch);
void resize_cols(const uint8_t* scratch, const int32_t* tables, const ResizeSample* samples,
                 Index B, Index C, Index S, uint8_t* out);
template <typename T>
void normalize_u8(const uint8_t* u8, const float* lut, const float* noise,
                  const ResizeSample* samples, const BatchMix& mix, Index B, Index C, Index S,
                  T* images);
// images (B, C, S, S) in T = in (B, C, S, S) fp32 mixed as mix says: ops/cpu/resize_batch.h.
template <typename T>
void mix_images(const float* in, const BatchMix& mix, Index B, Index C, Index S, T* images);
// EfficientTrain++'s low-frequency pass (lowfreq_batch.cu), the twin of
// src/ops/cpu/lowfreq_batch.h: out (planes, S, S) from in (planes, F, F), op (2, S, F).
void lowfreq_batch(const float* in, const float* op, bool complex, Index planes, Index F, Index S,
                   float* scratch, float* out);
// The uint8 ops between the resize and the normalisation (pixel_steps.cu), the twin of
// src/ops/cpu/pixel_steps.h: images (B, C, S, S) in place, steps (B, slots) on the device.
void apply_pixel_steps(uint8_t* images, const PixelStep* steps, int32_t slots, Index B, Index C,
                       Index S, const PixelFill& fill);

}  // namespace vit::cuda
