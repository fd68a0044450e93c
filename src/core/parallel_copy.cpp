#include "core/parallel_copy.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace vit {

void parallel_copy(void* dst, const void* src, size_t bytes) {
  if (bytes < kParallelCopyMin || omp_get_max_threads() == 1 || omp_in_parallel()) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  constexpr size_t kPiece = size_t(1) << 20;
  const int64_t pieces = int64_t((bytes + kPiece - 1) / kPiece);
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pieces; ++i) {
    const size_t at = size_t(i) * kPiece;
    std::memcpy(d + at, s + at, std::min(kPiece, bytes - at));
  }
}

}  // namespace vit
