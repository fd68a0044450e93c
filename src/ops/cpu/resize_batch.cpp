#include "ops/cpu/resize_batch.h"

namespace vit::cpu {

namespace {

// One axis table of output size S at tables + offset: first (S), count (S), k (S, ksize).
struct Table {
  const int32_t* first;
  const int32_t* count;
  const int32_t* k;
  Index ksize;
  Table(const int32_t* tables, int32_t offset, int32_t ksize, Index S)
      : first(tables + offset), count(first + S), k(count + S), ksize(ksize) {}
};

constexpr int32_t kRound = 1 << (kResizePrecision - 1);

}  // namespace

void resize_rows(const uint8_t* pixels, const int32_t* tables, const ResizeSample* samples, Index B,
                 Index C, Index S, uint8_t* scratch) {
  for (Index b = 0; b < B; ++b) {
    const ResizeSample& s = samples[b];
    const Table t(tables, s.h_table, s.h_ksize, S);
    for (Index r = 0; r < C * s.bh; ++r) {
      const uint8_t* in = pixels + s.pixels + r * s.bw;  // (bw) one row of the crop
      uint8_t* out = scratch + s.rows + r * S;           // (S)
      for (Index x = 0; x < S; ++x) {
        int32_t acc = kRound;
        const uint8_t* tap = in + t.first[x];
        const int32_t* k = t.k + x * t.ksize;
        for (int32_t i = 0; i < t.count[x]; ++i) acc += int32_t(tap[i]) * k[i];
        out[x] = resize_clip8(acc);
      }
    }
  }
}

void resize_cols(const uint8_t* scratch, const int32_t* tables, const ResizeSample* samples,
                 Index B, Index C, Index S, uint8_t* out) {
  for (Index b = 0; b < B; ++b) {
    const ResizeSample& s = samples[b];
    const Table t(tables, s.v_table, s.v_ksize, S);
    for (Index c = 0; c < C; ++c) {
      const uint8_t* plane = scratch + s.rows + c * s.bh * S;  // (bh, S)
      uint8_t* dst = out + (b * C + c) * S * S;                // (S, S)
      for (Index y = 0; y < S; ++y) {
        const int32_t* k = t.k + y * t.ksize;
        const uint8_t* top = plane + Index(t.first[y]) * S;
        for (Index x = 0; x < S; ++x) {
          int32_t acc = kRound;
          for (int32_t i = 0; i < t.count[y]; ++i) acc += int32_t(top[i * S + x]) * k[i];
          dst[y * S + (s.flip ? S - 1 - x : x)] = resize_clip8(acc);
        }
      }
    }
  }
}

namespace {
// The value of sample s's pixel (c, y, x): its noise inside the erase box, else the table's.
float input_value(const uint8_t* u8, const float* lut, const float* noise, const ResizeSample& s,
                  Index c, Index y, Index x, Index S) {
  const ErasePlan& e = s.erase;
  if (e.covers(y, x))
    return erase_noise(noise, e.key, uint64_t((c * e.h + y - e.top) * e.w + x - e.left));
  return lut[c * 256 + u8[(c * S + y) * S + x]];
}
}  // namespace

void normalize_u8(const uint8_t* u8, const float* lut, const float* noise,
                  const ResizeSample* samples, const BatchMix& mix, Index B, Index C, Index S,
                  float* images) {
  const Index per_sample = C * S * S;
  for (Index b = 0; b < B; ++b) {
    const Index p = B - 1 - b;  // the mixing partner
    for (Index c = 0; c < C; ++c)
      for (Index y = 0; y < S; ++y)
        for (Index x = 0; x < S; ++x) {
          const float own = input_value(u8 + b * per_sample, lut, noise, samples[b], c, y, x, S);
          float v = own;
          if (!mix.none()) {
            const float other =
                input_value(u8 + p * per_sample, lut, noise, samples[p], c, y, x, S);
            v = mix.cutmix ? (mix.in_box(y, x) ? other : own) : mix_value(own, other, mix.lam);
          }
          images[b * per_sample + (c * S + y) * S + x] = v;
        }
  }
}

void mix_images(const float* in, const BatchMix& mix, Index B, Index C, Index S, float* images) {
  const Index per_sample = C * S * S;
  for (Index b = 0; b < B; ++b) {
    const float* own = in + b * per_sample;
    const float* other = in + (B - 1 - b) * per_sample;  // the mixing partner
    for (Index j = 0; j < per_sample; ++j) {
      float v = own[j];
      if (!mix.none())
        v = mix.cutmix ? (mix.in_box((j / S) % S, j % S) ? other[j] : v)
                       : mix_value(v, other[j], mix.lam);
      images[b * per_sample + j] = v;
    }
  }
}

}  // namespace vit::cpu
