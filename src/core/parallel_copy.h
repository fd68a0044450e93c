// A large host memcpy split over the OpenMP threads.
#pragma once
#include <cstddef>

namespace vit {

// dst (bytes) = src (bytes), the two not overlapping. From kParallelCopyMin bytes on, the copy
// is split into 1 MiB pieces over the OpenMP threads: one thread moved ~5 GB/s on the 2-core
// CI machine (the 154 MB fp32 batch of ViT-S/16 b256 in 29-35 ms, two threads 18-21 ms), as
// long as the H200's whole training step, so the input path's staging copy into pinned memory
// must not be one thread's.
constexpr size_t kParallelCopyMin = size_t(8) << 20;
void parallel_copy(void* dst, const void* src, size_t bytes);

}  // namespace vit
