#include "train/replay.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/common.h"

namespace vit {

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | 0x7c00u | (x > 0x7f800000u ? 0x0200u : 0u);  // inf / NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {                        // below 2^-14: fp16 subnormal (or zero)
    float a;
    std::memcpy(&a, &x, 4);
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));  // exact scaling by 2^24, RNE
  }
  const uint32_t rounded = x + 0x0fffu + ((x >> 13) & 1u);  // round to nearest even at bit 13
  return sign | uint16_t((rounded - 0x38000000u) >> 13);    // rebias exponent 127 -> 15
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    const float v = float(mant) * 0x1.0p-24f;
    std::memcpy(&x, &v, 4);
    x |= sign;
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

ReplayBuffer::ReplayBuffer(int replay_times, int split_factor, int capacity_batches, uint64_t seed,
                           ReplayStorage storage)
    : replay_times_(replay_times),
      split_factor_(split_factor),
      capacity_batches_(capacity_batches),
      storage_(storage),
      rng_(seed) {
  VIT_CHECK(replay_times >= 1,
            "replay buffer: replay times must be >= 1, got " + std::to_string(replay_times));
  VIT_CHECK(split_factor >= 1,
            "replay buffer: split factor must be >= 1, got " + std::to_string(split_factor));
  VIT_CHECK(capacity_batches >= 0, "replay buffer: capacity must be >= 0 batches, got " +
                                       std::to_string(capacity_batches));
  VIT_CHECK(replay_times == 1 || capacity_batches >= 1,
            "replay buffer: replay times " + std::to_string(replay_times) +
                " needs a capacity of at least one batch");
}

void ReplayBuffer::store(Chunk& c, const float* images, const float* targets, int n) const {
  const size_t ne = size_t(n) * img_elems_;
  c.n = n;
  if (storage_ == ReplayStorage::F16) {
    c.img.clear();
    c.half.resize(ne);
    for (size_t i = 0; i < ne; ++i) c.half[i] = float_to_half(images[i]);
  } else {
    c.half.clear();
    c.img.assign(images, images + ne);
  }
  c.tgt.assign(targets, targets + size_t(n) * K_);
}

void ReplayBuffer::load(const Chunk& c, float* images_out, float* targets_out) const {
  const size_t ne = size_t(c.n) * img_elems_;
  if (storage_ == ReplayStorage::F16) {
    for (size_t i = 0; i < ne; ++i) images_out[i] = half_to_float(c.half[i]);
  } else {
    std::memcpy(images_out, c.img.data(), sizeof(float) * ne);
  }
  std::memcpy(targets_out, c.tgt.data(), sizeof(float) * c.tgt.size());
}

void ReplayBuffer::push(const float* images, const float* targets, int B, int img_elems, int K) {
  VIT_CHECK(images && targets, "replay buffer: null batch");
  VIT_CHECK(B >= 1 && img_elems >= 1 && K >= 1,
            "replay buffer: bad batch shape B=" + std::to_string(B) +
                " img_elems=" + std::to_string(img_elems) + " K=" + std::to_string(K));
  VIT_CHECK(fresh_n_ == 0, "replay buffer: push() twice without assemble()");
  if (img_elems_ == 0) {
    img_elems_ = img_elems;
    K_ = K;
  }
  VIT_CHECK(img_elems == img_elems_ && K == K_,
            "replay buffer: sample shape changed (img_elems " + std::to_string(img_elems_) +
                " -> " + std::to_string(img_elems) + ", K " + std::to_string(K_) + " -> " +
                std::to_string(K) + "); use a new buffer per image size");
  store(fresh_, images, targets, B);
  fresh_n_ = B;
  if (replay_times_ == 1) return;  // nothing is ever replayed
  const int n_chunks = std::min(split_factor_, B);
  const int base = B / n_chunks, extra = B % n_chunks;
  int off = 0;
  for (int i = 0; i < n_chunks; ++i) {
    const int n = base + (i < extra ? 1 : 0);
    Chunk c;
    store(c, images + size_t(off) * img_elems_, targets + size_t(off) * K_, n);
    fifo_.push_back(std::move(c));
    off += n;
  }
  const size_t cap = size_t(capacity_batches_) * size_t(split_factor_);
  while (fifo_.size() > cap) {
    const size_t drop = std::min(size_t(split_factor_), fifo_.size());
    fifo_.erase(fifo_.begin(), fifo_.begin() + drop);
  }
}

int64_t ReplayBuffer::buffered_samples() const {
  int64_t n = 0;
  for (const Chunk& c : fifo_) n += c.n;
  return n;
}

int ReplayBuffer::max_assemble_samples() const {
  int largest = 0;
  for (const Chunk& c : fifo_) largest = std::max(largest, c.n);
  return fresh_n_ + (replay_times_ - 1) * split_factor_ * largest;
}

int ReplayBuffer::assemble(float* images_out, float* targets_out, int capacity_samples) {
  VIT_CHECK(fresh_n_ > 0, "replay buffer: assemble() without a pending push()");
  VIT_CHECK(images_out && targets_out, "replay buffer: null output");
  const int draws = (replay_times_ - 1) * split_factor_;
  VIT_CHECK(draws == 0 || !fifo_.empty(), "replay buffer: nothing buffered to replay");
  // Draw first so the room check sees the real count.
  std::vector<size_t> picks(draws);
  int64_t n = fresh_n_;
  for (int d = 0; d < draws; ++d) {
    picks[d] = size_t(rng_.below(fifo_.size()));
    n += fifo_[picks[d]].n;
  }
  VIT_CHECK(n <= capacity_samples, "replay buffer: output holds " +
                                       std::to_string(capacity_samples) + " samples, need " +
                                       std::to_string(n));
  load(fresh_, images_out, targets_out);
  int64_t off = fresh_n_;
  for (size_t p : picks) {
    const Chunk& c = fifo_[p];
    load(c, images_out + size_t(off) * img_elems_, targets_out + size_t(off) * K_);
    off += c.n;
  }
  fresh_n_ = 0;
  return int(n);
}

}  // namespace vit
