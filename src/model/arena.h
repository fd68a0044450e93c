// The activation arena: every activation and scratch buffer of a model in one block, planned as
// byte offsets in plain host code. Each backend allocates the block once, at the run's largest
// shape (batch, tokens), so buffer pointers never move during a run (CUDA-graph ready) and
// nothing is allocated or freed mid-run, also when the size curriculum changes the token count.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/common.h"

namespace vit {

// Every buffer starts at a multiple of this many bytes (cuBLASLt's best alignment, and more
// than any vector load needs).
constexpr size_t kArenaAlign = 256;

struct ArenaSlot {
  std::string name;
  size_t offset = 0;  // bytes from the block's start, a multiple of kArenaAlign
  size_t bytes = 0;
};

class ArenaPlan {
 public:
  // Reserves `count` elements of `elem_bytes` each; returns the slot's byte offset.
  size_t add(const std::string& name, Index count, size_t elem_bytes);
  // Bytes the block needs: the end of the last slot rounded up to kArenaAlign.
  size_t total_bytes() const { return end_; }
  const std::vector<ArenaSlot>& slots() const { return slots_; }
  // Throws vit::Error when a slot is misaligned, overlaps another or runs past the end.
  void verify() const;

 private:
  std::vector<ArenaSlot> slots_;
  size_t end_ = 0;
};

// A typed view of a planned slot inside an allocated block.
template <typename T>
T* arena_ptr(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<std::byte*>(base) + offset);
}

// Elements per row for rows of n elements that keep every row start 16-byte aligned in both
// fp32 and bf16: n rounded up to a multiple of 8.
inline Index padded_row(Index n) {
  return (n + 7) / 8 * 8;
}

}  // namespace vit
