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

namespace {
thread_local StageScope* t_innermost = nullptr;  // this thread's innermost open scope
double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
// Time without a call: an outer scope's part before an inner one opens.
void add_seconds(Stage s, double seconds) {
  std::atomic<double>& slot = this_thread_slot().seconds[int(s)];
  slot.store(slot.load(std::memory_order_relaxed) + seconds, std::memory_order_relaxed);
}
}  // namespace

StageScope::StageScope(Stage s) : stage_(s), on_(stage_clock_on()) {
  if (!on_) return;
  t0_ = std::chrono::steady_clock::now();
  outer_ = t_innermost;
  if (outer_) add_seconds(outer_->stage_, seconds_between(outer_->t0_, t0_));
  t_innermost = this;
}

StageScope::~StageScope() {
  if (!on_) return;
  const auto now = std::chrono::steady_clock::now();
  stage_clock_add(stage_, seconds_between(t0_, now));
  t_innermost = outer_;
  if (outer_) outer_->t0_ = now;  // the outer scope's clock runs again
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
