// How the 16-byte LayerNorm kernels deal a row of C columns (ops/cuda/layernorm_vec_kernels.cuh)
// and so whether they run at C: host code, so the kernel plan's rule and the kernels agree.
#pragma once
#include "core/common.h"

namespace vit {

// 16-byte chunks of bf16 a lane reads, up to 4 a lane: rows up to 1024 columns.
constexpr int kLayernormChunk = 8;
constexpr int kLayernormMaxChunks = 4;

// `group` lanes a row, `chunks` chunks a lane; group 0 where C is not 8 x {8, 16, 32} x
// {1 .. 4} (those rows take the row-in-registers kernels).
struct LayernormLayout {
  int group = 0, chunks = 0;
};
// The fewest chunks a lane (the fewest registers) that deal C exactly.
inline LayernormLayout layernorm_layout_for(Index C) {
  if (C <= 0 || C % kLayernormChunk != 0) return {};
  const Index words = C / kLayernormChunk;
  for (int chunks = 1; chunks <= kLayernormMaxChunks; ++chunks)
    for (int group : {8, 16, 32})
      if (Index(group) * chunks == words) return {group, chunks};
  return {};
}

}  // namespace vit
