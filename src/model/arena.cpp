#include "model/arena.h"

#include <fmt/format.h>

#include <algorithm>

namespace vit {

namespace {
size_t align_up(size_t x) {
  return (x + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}
}  // namespace

size_t ArenaPlan::add(const std::string& name, Index count, size_t elem_bytes) {
  VIT_CHECK(count >= 0, fmt::format("arena: negative size for '{}'", name));
  ArenaSlot s{name, end_, size_t(count) * elem_bytes};
  end_ = align_up(s.offset + s.bytes);
  slots_.push_back(std::move(s));
  return slots_.back().offset;
}

void ArenaPlan::verify() const {
  std::vector<const ArenaSlot*> order;
  for (const auto& s : slots_) order.push_back(&s);
  std::sort(order.begin(), order.end(),
            [](const ArenaSlot* a, const ArenaSlot* b) { return a->offset < b->offset; });
  size_t prev_end = 0;
  std::string prev = "(start)";
  for (const ArenaSlot* s : order) {
    VIT_CHECK(s->offset % kArenaAlign == 0, fmt::format("arena: '{}' at {} is not {}-byte aligned",
                                                        s->name, s->offset, kArenaAlign));
    VIT_CHECK(s->offset >= prev_end, fmt::format("arena: '{}' overlaps '{}'", s->name, prev));
    VIT_CHECK(s->offset + s->bytes <= end_, fmt::format("arena: '{}' runs past the end", s->name));
    if (s->bytes > 0) {
      prev_end = s->offset + s->bytes;
      prev = s->name;
    }
  }
}

}  // namespace vit
