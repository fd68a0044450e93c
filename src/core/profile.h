// Optional per-op wall-clock profile of the training step, switched on with VIT_PROFILE=1.
// Off, it costs one branch per op. `vitrain bench` prints the table when it is on.
#pragma once
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

namespace vit {

struct Profile {
  static bool enabled();
  static std::map<std::string, double>& totals();  // seconds per op name
  static void print(FILE* out);
  static void reset() { totals().clear(); }
};

// Times the enclosing scope under `name` when profiling is on.
class ProfileScope {
 public:
  explicit ProfileScope(const char* name) : name_(Profile::enabled() ? name : nullptr) {
    if (name_) t0_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (name_)
      Profile::totals()[name_] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  const char* name_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace vit
