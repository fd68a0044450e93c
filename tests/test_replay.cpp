// EfficientTrain++ replay buffer (methods.md §2.3): batch composition, FIFO capacity, that every
// output sample is a pushed sample (image and target together), determinism, fp16 storage.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "core/common.h"
#include "train/replay.h"

namespace {

constexpr int kElems = 6;  // C*S*S of a tiny sample, (C, S, S) = (6, 1, 1)
constexpr int kK = 3;

// Sample `id`: image values id*16 + e, targets id + 0.25*k (all exact in float and fp16 for id <
// 64).
struct Batch {
  std::vector<float> img, tgt;
};
Batch make_batch(int first_id, int B) {
  Batch b{std::vector<float>(size_t(B) * kElems), std::vector<float>(size_t(B) * kK)};
  for (int i = 0; i < B; ++i) {
    for (int e = 0; e < kElems; ++e) b.img[size_t(i) * kElems + e] = float((first_id + i) * 16 + e);
    for (int k = 0; k < kK; ++k) b.tgt[size_t(i) * kK + k] = float(first_id + i) + 0.25f * k;
  }
  return b;
}
// Returns the sample id of output row i, or -1 if the row is not a consistent pushed sample.
int sample_id(const std::vector<float>& img, const std::vector<float>& tgt, int i) {
  const float v0 = img[size_t(i) * kElems];
  const int id = int(v0) / 16;
  if (v0 != float(id * 16)) return -1;
  for (int e = 0; e < kElems; ++e)
    if (img[size_t(i) * kElems + e] != float(id * 16 + e)) return -1;
  for (int k = 0; k < kK; ++k)
    if (tgt[size_t(i) * kK + k] != float(id) + 0.25f * k) return -1;
  return id;
}

struct Out {
  std::vector<float> img, tgt;
  int n = 0;
};
Out assemble(vit::ReplayBuffer& rb) {
  Out o;
  const int cap = rb.max_assemble_samples();
  o.img.assign(size_t(cap) * kElems, NAN);
  o.tgt.assign(size_t(cap) * kK, NAN);
  o.n = rb.assemble(o.img.data(), o.tgt.data(), cap);
  return o;
}

TEST(Replay, BatchIsFreshPlusReplayedChunks) {
  // replay 4, split 4, B 8 -> chunks of 2; output = 8 fresh + 3*4 chunks * 2 = 32 = 4 * B.
  vit::ReplayBuffer rb(4, 4, 3, 123);
  int next_id = 0;
  std::set<int> pushed;
  for (int step = 0; step < 10; ++step) {
    Batch b = make_batch(next_id, 8);
    rb.push(b.img.data(), b.tgt.data(), 8, kElems, kK);
    EXPECT_EQ(rb.max_assemble_samples(), 32);
    Out o = assemble(rb);
    ASSERT_EQ(o.n, 32);
    // fresh batch first, in order
    for (int i = 0; i < 8; ++i) EXPECT_EQ(sample_id(o.img, o.tgt, i), next_id + i);
    // replayed samples: pushed ones still in the FIFO (last 3 batches), in whole aligned chunks
    const int oldest = std::max(0, next_id - 16);
    for (int i = 8; i < o.n; i += 2) {
      const int id = sample_id(o.img, o.tgt, i);
      ASSERT_GE(id, oldest) << "step " << step;
      ASSERT_LT(id, next_id + 8);
      EXPECT_EQ(id % 2, 0);                               // chunk start
      EXPECT_EQ(sample_id(o.img, o.tgt, i + 1), id + 1);  // chunk kept together
    }
    next_id += 8;
    EXPECT_EQ(rb.chunks(), std::min(step + 1, 3) * 4);
    EXPECT_EQ(rb.buffered_samples(), std::min(step + 1, 3) * 8);
  }
}

TEST(Replay, CapacityDropsOldestBatchAndDrawsCoverBuffer) {
  vit::ReplayBuffer rb(2, 8, 2, 7);
  std::map<int, int> seen;
  for (int step = 0; step < 60; ++step) {
    // ids 0..7 and 8..15 first, then ids 16..23 and 24..31 alternating (capacity: 2 batches)
    const Batch b = make_batch(step < 2 ? 8 * step : 16 + 8 * (step % 2), 8);
    rb.push(b.img.data(), b.tgt.data(), 8, kElems, kK);
    EXPECT_LE(rb.chunks(), 16);
    Out o = assemble(rb);
    ASSERT_EQ(o.n, 16);
    for (int i = 8; i < 16; ++i) {
      const int id = sample_id(o.img, o.tgt, i);
      ASSERT_GE(id, 0);
      if (step >= 3) {  // the first two batches have been dropped
        EXPECT_GE(id, 16);
        ++seen[id];
      }
    }
  }
  EXPECT_EQ(seen.size(), 16u);  // uniform draws reach every buffered sample
}

TEST(Replay, DeterministicFromSeed) {
  auto run = [](uint64_t seed) {
    vit::ReplayBuffer rb(3, 4, 5, seed);
    std::vector<int> ids;
    for (int step = 0; step < 12; ++step) {
      Batch b = make_batch(4 * step, 4);
      rb.push(b.img.data(), b.tgt.data(), 4, kElems, kK);
      Out o = assemble(rb);
      for (int i = 0; i < o.n; ++i) ids.push_back(sample_id(o.img, o.tgt, i));
    }
    return ids;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Replay, ReplayOnceIsPassThrough) {
  vit::ReplayBuffer rb(1, 32, 0, 1);
  Batch b = make_batch(3, 5);
  rb.push(b.img.data(), b.tgt.data(), 5, kElems, kK);
  EXPECT_EQ(rb.chunks(), 0);
  EXPECT_EQ(rb.max_assemble_samples(), 5);
  Out o = assemble(rb);
  ASSERT_EQ(o.n, 5);
  EXPECT_TRUE(std::equal(b.img.begin(), b.img.end(), o.img.begin()));
  EXPECT_TRUE(std::equal(b.tgt.begin(), b.tgt.end(), o.tgt.begin()));
}

TEST(Replay, UnevenAndSmallBatches) {
  // B 10, split 4 -> chunks 3,3,2,2; B 3 < split -> 3 chunks of 1.
  vit::ReplayBuffer rb(2, 4, 10, 5);
  Batch b = make_batch(0, 10);
  rb.push(b.img.data(), b.tgt.data(), 10, kElems, kK);
  EXPECT_EQ(rb.chunks(), 4);
  EXPECT_EQ(rb.max_assemble_samples(), 10 + 4 * 3);
  Out o = assemble(rb);
  EXPECT_GE(o.n, 10 + 4 * 2);
  EXPECT_LE(o.n, 10 + 4 * 3);
  for (int i = 0; i < o.n; ++i) EXPECT_GE(sample_id(o.img, o.tgt, i), 0);
  Batch s = make_batch(20, 3);
  rb.push(s.img.data(), s.tgt.data(), 3, kElems, kK);
  EXPECT_EQ(rb.chunks(), 7);
  EXPECT_EQ(rb.buffered_samples(), 13);
  o = assemble(rb);
  for (int i = 0; i < o.n; ++i) EXPECT_GE(sample_id(o.img, o.tgt, i), 0);
}

TEST(Replay, HalfStorageRoundsEverySample) {
  vit::ReplayBuffer rb(2, 2, 4, 9, vit::ReplayStorage::F16);
  std::vector<float> img = {0.1f, -1.0f / 3, 65504.f,  1e-6f,    70000.f, -0.0f,
                            2.0f, 1.5f,      3.14159f, -2.5e-5f, 1024.5f, 0.5f};
  std::vector<float> tgt = {0.1f, 0.2f, 0.7f, 0.9f, 0.05f, 0.05f};
  rb.push(img.data(), tgt.data(), 2, kElems, kK);
  Out o = assemble(rb);
  ASSERT_EQ(o.n, 4);
  const std::vector<float> want = {0.0999755859375f,
                                   -0.333251953125f,
                                   65504.f,
                                   1.0132789611816406e-06f,
                                   INFINITY,
                                   -0.0f,
                                   2.0f,
                                   1.5f,
                                   3.140625f,
                                   -2.4974346160888672e-05f,
                                   1024.0f,
                                   0.5f};
  for (int i = 0; i < o.n; ++i) {
    const int src = i < 2 ? i : -1;
    for (int e = 0; e < kElems; ++e) {
      const float v = o.img[size_t(i) * kElems + e];
      if (src >= 0)
        EXPECT_EQ(v, want[size_t(src) * kElems + e]) << i << "," << e;
      else
        EXPECT_TRUE(v == want[e] || v == want[kElems + e]) << i << "," << e;
    }
    for (int k = 0; k < kK; ++k)  // targets stay float
      EXPECT_TRUE(o.tgt[size_t(i) * kK + k] == tgt[k] || o.tgt[size_t(i) * kK + k] == tgt[kK + k]);
  }
  EXPECT_TRUE(std::signbit(o.img[5]));
  // Conversion round trip on all finite halves.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    EXPECT_EQ(vit::float_to_half(vit::half_to_float(uint16_t(h))), h) << h;
  }
  EXPECT_TRUE(std::isnan(vit::half_to_float(vit::float_to_half(NAN))));
  EXPECT_EQ(vit::float_to_half(65519.f), 0x7bffu);  // just below the rounding threshold
  EXPECT_EQ(vit::float_to_half(65520.f), 0x7c00u);
  EXPECT_EQ(vit::float_to_half(2.9802322387695312e-08f), 0u);  // 2^-25 ties to even (0)
  EXPECT_EQ(vit::float_to_half(8.940696716308594e-08f), 2u);   // 1.5 * 2^-24 ties to 2
}

TEST(Replay, RejectsMisuse) {
  EXPECT_THROW(vit::ReplayBuffer(0, 32, 1, 0), vit::Error);
  EXPECT_THROW(vit::ReplayBuffer(2, 0, 1, 0), vit::Error);
  EXPECT_THROW(vit::ReplayBuffer(2, 32, 0, 0), vit::Error);
  EXPECT_THROW(vit::ReplayBuffer(1, 32, -1, 0), vit::Error);
  vit::ReplayBuffer rb(2, 2, 2, 0);
  std::vector<float> out(100 * kElems), tout(100 * kK);
  EXPECT_THROW(rb.assemble(out.data(), tout.data(), 100), vit::Error);  // nothing pushed
  Batch b = make_batch(0, 4);
  rb.push(b.img.data(), b.tgt.data(), 4, kElems, kK);
  EXPECT_THROW(rb.push(b.img.data(), b.tgt.data(), 4, kElems, kK), vit::Error);  // no assemble
  EXPECT_THROW(rb.assemble(out.data(), tout.data(), 7), vit::Error);             // needs 8
  EXPECT_EQ(rb.assemble(out.data(), tout.data(), 8), 8);
  EXPECT_THROW(rb.push(b.img.data(), b.tgt.data(), 4, kElems + 1, kK), vit::Error);  // new shape
  EXPECT_THROW(rb.push(b.img.data(), b.tgt.data(), 0, kElems, kK), vit::Error);
}

}  // namespace
