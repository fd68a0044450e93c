// parallel_copy: every byte of every size copied, none past the end written, under one thread,
// several, and inside a parallel region (where it copies on the calling thread).
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <vector>

#include "core/parallel_copy.h"
#include "core/rng.h"

namespace {

void expect_copied(size_t bytes, uint64_t seed) {
  SCOPED_TRACE("bytes " + std::to_string(bytes));
  vit::Rng rng(seed);
  std::vector<uint8_t> src(bytes), dst(bytes + 64, 0xA5);
  for (auto& b : src) b = uint8_t(rng.below(256));
  vit::parallel_copy(dst.data(), src.data(), bytes);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += dst[i] != src[i];
  EXPECT_EQ(wrong, 0u);
  for (size_t i = bytes; i < dst.size(); ++i)
    ASSERT_EQ(dst[i], 0xA5) << "written past the end at " << i;
}

const size_t kSizes[] = {0,
                         1,
                         (size_t(1) << 20) - 1,
                         vit::kParallelCopyMin - 1,
                         vit::kParallelCopyMin,
                         vit::kParallelCopyMin + 12345,
                         3 * vit::kParallelCopyMin + 7};

TEST(ParallelCopy, CopiesEveryByteAndNoMore) {
  const int threads = omp_get_max_threads();
  for (int t : {1, 3}) {
    SCOPED_TRACE("threads " + std::to_string(t));
    omp_set_num_threads(t);
    uint64_t seed = 10;
    for (size_t bytes : kSizes) expect_copied(bytes, ++seed);
  }
  omp_set_num_threads(threads);
}

TEST(ParallelCopy, CopiesInsideAParallelRegion) {
  std::vector<uint8_t> ok(2, 0);
#pragma omp parallel for num_threads(2)
  for (int i = 0; i < 2; ++i) {
    std::vector<uint8_t> src(vit::kParallelCopyMin + 99, uint8_t(i + 1)), dst(src.size(), 0);
    vit::parallel_copy(dst.data(), src.data(), src.size());
    ok[size_t(i)] = dst == src;
  }
  EXPECT_EQ(ok[0], 1);
  EXPECT_EQ(ok[1], 1);
}

}  // namespace
