// Batched crop -> resize -> flip -> normalise (-> erase -> mixup/cutmix) of planned uint8 crops:
// the GPU twin of src/ops/cpu/resize_batch.cpp (same integer arithmetic, so the same bytes; the
// normalisation is the same table lookup, rounded once to T).
#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

constexpr int32_t kRound = 1 << (kResizePrecision - 1);

__device__ __forceinline__ uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kResizePrecision;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Rows of a sample's horizontal pass handled by one block (a grid-stride loop over the rest).
constexpr int kRowBlocks = 64;

__global__ void resize_rows_kernel(const uint8_t* pixels, const int32_t* tables,
                                   const ResizeSample* samples, Index C, Index S,
                                   uint8_t* scratch) {
  // grid (kRowBlocks, B): block x walks rows r of sample y's crop (C * bh rows of bw bytes),
  // its threads the S outputs of a row -> scratch (C, bh, S)
  const ResizeSample s = samples[blockIdx.y];
  const int32_t* first = tables + s.h_table;
  const int32_t* count = first + S;
  const int32_t* k = count + S;
  for (Index r = blockIdx.x; r < C * s.bh; r += gridDim.x) {
    const uint8_t* in = pixels + s.pixels + r * s.bw;
    uint8_t* out = scratch + s.rows + r * S;
    for (Index x = threadIdx.x; x < S; x += blockDim.x) {
      int32_t acc = kRound;
      const uint8_t* tap = in + first[x];
      const int32_t* kx = k + x * s.h_ksize;
      for (int32_t i = 0; i < count[x]; ++i) acc += int32_t(tap[i]) * kx[i];
      out[x] = clip8(acc);
    }
  }
}

__global__ void resize_cols_kernel(const uint8_t* scratch, const int32_t* tables,
                                   const ResizeSample* samples, Index B, Index C, Index S,
                                   uint8_t* out) {
  // out (B, C, S, S): one thread per output pixel, coalesced along x
  VIT_GRID_STRIDE(i, B * C * S * S) {
    const Index x = i % S, y = (i / S) % S, c = (i / (S * S)) % C, b = i / (C * S * S);
    const ResizeSample s = samples[b];
    const int32_t* first = tables + s.v_table;
    const int32_t* count = first + S;
    const int32_t* ky = count + S + y * s.v_ksize;
    const uint8_t* col = scratch + s.rows + (c * s.bh + first[y]) * S + x;  // (bh, S) plane
    int32_t acc = kRound;
    for (int32_t t = 0; t < count[y]; ++t) acc += int32_t(col[t * S]) * ky[t];
    out[((b * C + c) * S + y) * S + (s.flip ? S - 1 - x : x)] = clip8(acc);
  }
}

// The value of sample s's pixel j = (c, y, x): its noise inside the erase box, else the
// table's (ops/cpu/resize_batch.cpp: input_value).
__device__ __forceinline__ float input_value(const uint8_t* u8, const float* lut,
                                             const float* noise, const ResizeSample& s, Index j,
                                             Index S) {
  const Index c = j / (S * S), y = (j / S) % S, x = j % S;
  const ErasePlan& e = s.erase;
  if (e.covers(y, x))
    return erase_noise(noise, e.key, uint64_t((c * e.h + y - e.top) * e.w + x - e.left));
  return lut[c * 256 + u8[j]];
}

template <typename T>
__global__ void normalize_u8_kernel(const uint8_t* u8, const float* lut, const float* noise,
                                    const ResizeSample* samples, BatchMix mix, Index B, Index C,
                                    Index S, T* images) {
  // u8, images (B, C, S, S); lut (C, 256); noise (kEraseNoiseTable); samples (B). Erased,
  // then sample b mixed with B-1-b in fp32 before the store.
  const Index per_sample = C * S * S, n = B * per_sample;
  VIT_GRID_STRIDE(i, n) {
    const Index b = i / per_sample, j = i - b * per_sample;
    float v = input_value(u8 + b * per_sample, lut, noise, samples[b], j, S);
    if (!mix.none()) {
      const Index p = B - 1 - b;
      const float other = input_value(u8 + p * per_sample, lut, noise, samples[p], j, S);
      v = mix.cutmix ? (mix.in_box((j / S) % S, j % S) ? other : v) : mix_value(v, other, mix.lam);
    }
    images[i] = from_f32<T>(v);
  }
}

template <typename T>
__global__ void mix_images_kernel(const float* in, BatchMix mix, Index B, Index C, Index S,
                                  T* images) {
  // in, images (B, C, S, S): sample b mixed with B-1-b in fp32, rounded once to T
  const Index per_sample = C * S * S, n = B * per_sample;
  VIT_GRID_STRIDE(i, n) {
    const Index b = i / per_sample, j = i - b * per_sample;
    float v = in[i];
    if (!mix.none()) {
      const float other = in[(B - 1 - b) * per_sample + j];
      v = mix.cutmix ? (mix.in_box((j / S) % S, j % S) ? other : v) : mix_value(v, other, mix.lam);
    }
    images[i] = from_f32<T>(v);
  }
}

}  // namespace

void resize_rows(const uint8_t* pixels, const int32_t* tables, const ResizeSample* samples, Index B,
                 Index C, Index S, uint8_t* scratch) {
  if (B <= 0 || S <= 0) return;
  VIT_CHECK(B <= 65535, "resize_rows: at most 65535 samples per batch");
  resize_rows_kernel<<<dim3(kRowBlocks, unsigned(B)), 128, 0, stream()>>>(pixels, tables, samples,
                                                                          C, S, scratch);
  VIT_CUDA_LAUNCHED();
}

void resize_cols(const uint8_t* scratch, const int32_t* tables, const ResizeSample* samples,
                 Index B, Index C, Index S, uint8_t* out) {
  const Index n = B * C * S * S;
  if (n <= 0) return;
  resize_cols_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(scratch, tables, samples, B, C,
                                                                     S, out);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void normalize_u8(const uint8_t* u8, const float* lut, const float* noise,
                  const ResizeSample* samples, const BatchMix& mix, Index B, Index C, Index S,
                  T* images) {
  const Index n = B * C * S * S;
  if (n <= 0) return;
  normalize_u8_kernel<T><<<grid_stride_blocks(n), kBlock, 0, stream()>>>(u8, lut, noise, samples,
                                                                         mix, B, C, S, images);
  VIT_CUDA_LAUNCHED();
}

#define INSTANTIATE(T)                                                                           \
  template void normalize_u8<T>(const uint8_t*, const float*, const float*, const ResizeSample*, \
                                const BatchMix&, Index, Index, Index, T*);
VIT_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

template <typename T>
void mix_images(const float* in, const BatchMix& mix, Index B, Index C, Index S, T* images) {
  const Index n = B * C * S * S;
  if (n <= 0) return;
  mix_images_kernel<T><<<grid_stride_blocks(n), kBlock, 0, stream()>>>(in, mix, B, C, S, images);
  VIT_CUDA_LAUNCHED();
}

#define INSTANTIATE(T) \
  template void mix_images<T>(const float*, const BatchMix&, Index, Index, Index, T*);
VIT_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace vit::cuda
