#include "data/stage_clock.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace vit::data {

namespace {

// Each thread adds into its own slot (no contention on the hot path); the registry owns the
// slots, so a thread that ends leaves its share behind.
struct Slot {
  std::atomic<double> seconds[kNumStages] = {};
  std::atomic<long> calls[kNumStages] = {};
};

struct Registry {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::vector<std::unique_ptr<Slot>> slots;
};

Registry& registry() {
  static Registry r;
  return r;
}

Slot& this_thread_slot() {
  thread_local Slot* slot = [] {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.slots.push_back(std::make_unique<Slot>());
    return r.slots.back().get();
  }();
  return *slot;
}

}  // namespace

const char* stage_name(Stage s) {
  static const char* const names[kNumStages] = {"read", "decode", "layout", "augment", "copy"};
  return names[int(s)];
}

void stage_clock_enable(bool on) {
  registry().on = on;
}

bool stage_clock_on() {
  return registry().on.load(std::memory_order_relaxed);
}

void stage_clock_add(Stage s, double seconds) {
  Slot& slot = this_thread_slot();
  const int i = int(s);
  // Only this thread writes its slot: a relaxed load and store are enough.
  slot.seconds[i].store(slot.seconds[i].load(std::memory_order_relaxed) + seconds,
                        std::memory_order_relaxed);
  slot.calls[i].store(slot.calls[i].load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

StageTotals stage_clock_totals() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  StageTotals t;
  for (const auto& slot : r.slots)
    for (int i = 0; i < kNumStages; ++i) {
      t.seconds[i] += slot->seconds[i].load(std::memory_order_relaxed);
      t.calls[i] += slot->calls[i].load(std::memory_order_relaxed);
    }
  return t;
}

void stage_clock_reset() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& slot : r.slots)
    for (int i = 0; i < kNumStages; ++i) {
      slot->seconds[i].store(0.0, std::memory_order_relaxed);
      slot->calls[i].store(0, std::memory_order_relaxed);
    }
}

}  // namespace vit::data
