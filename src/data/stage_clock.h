// Where the input pipeline's time goes, per stage, summed over every thread that builds batches:
// read (file bytes; packed sets are memory-mapped, so their page reads fall in decode), decode
// (JPEG/PNG, DCT-scaled), layout (interleaved -> planar), augment (crop, resize, flip,
// RandAugment, normalise, erasing: timm_sample), copy (the finished batch to the caller). Off
// unless switched on (vitrain bench-data): then each scope costs two clock reads.
#pragma once
#include <chrono>

namespace vit::data {

enum class Stage : int { Read, Decode, Layout, Augment, Copy };
constexpr int kNumStages = 5;
const char* stage_name(Stage s);

struct StageTotals {
  double seconds[kNumStages] = {};
  long calls[kNumStages] = {};
};

void stage_clock_enable(bool on);
bool stage_clock_on();
// Sums over every thread since the last reset; threads that ended keep their share.
StageTotals stage_clock_totals();
void stage_clock_reset();
void stage_clock_add(Stage s, double seconds);

// Times its scope under `s` when the clock is on. Scopes nest: the time of a scope opened inside
// another (the crop's draws, made between a JPEG's header and its pixels) is its own stage's,
// not also the outer one's.
class StageScope {
 public:
  explicit StageScope(Stage s);
  ~StageScope();
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;

 private:
  Stage stage_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
  StageScope* outer_ = nullptr;  // the scope this one interrupts, on this thread
};

}  // namespace vit::data
