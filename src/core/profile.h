// Optional per-op profile of the training step: VIT_PROFILE=1, or Profile::set_enabled (what
// `vitrain bench --profile` does). Off, it costs one branch per op. Each op scope names its op
// and the work it does (flops, bytes), so the table shows achieved rates beside the times.
// Times come from the host clock (exact for the CPU backends, whose ops are synchronous) or
// from a timer a GPU backend installs (events on its stream: the host clock would time only
// the asynchronous launches).
#pragma once
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

namespace vit {

// The work of one op call: floating-point operations (a multiply-add is 2) and the bytes it
// must move at least (each input read once, each output written once).
struct OpWork {
  double flops = 0, bytes = 0;
};

struct OpTotals {
  double seconds = 0, flops = 0, bytes = 0;
  long calls = 0;
};

// A device timer: begin() before an op is enqueued, end() after; collect() waits for the
// device and adds the finished intervals to the totals.
class ProfileTimer {
 public:
  virtual ~ProfileTimer() = default;
  virtual int begin() = 0;  // a token for end()
  virtual void end(int token, const char* name, const OpWork& work) = 0;
  virtual void collect(std::map<std::string, OpTotals>& totals) = 0;
};

struct Profile {
  static bool enabled();
  static void set_enabled(bool on);
  // The timer ops use from now on (nullptr: the host clock). Not owned.
  static void set_timer(ProfileTimer* timer);
  static ProfileTimer* timer();
  // Per op, everything recorded since reset(); collects a device timer's pending intervals.
  static const std::map<std::string, OpTotals>& totals();
  static void add(const char* name, double seconds, const OpWork& work);
  // The table, slowest op first: per-step milliseconds over `steps` steps, share of the
  // profiled time, calls per step, achieved TFLOP/s (ops with flops) or GB/s (the others).
  static void print(FILE* out, int steps);
  static void reset();
};

// Times the enclosing scope under `name` when profiling is on.
class ProfileScope {
 public:
  explicit ProfileScope(const char* name, OpWork work = {})
      : name_(Profile::enabled() ? name : nullptr), work_(work) {
    if (!name_) return;
    if (ProfileTimer* t = Profile::timer())
      token_ = t->begin();
    else
      t0_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (!name_) return;
    if (ProfileTimer* t = Profile::timer())
      t->end(token_, name_, work_);
    else
      Profile::add(name_,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(),
                   work_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* name_;
  OpWork work_;
  int token_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace vit
