#include "core/profile.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace vit {

namespace {

struct ProfileState {
  bool enabled = [] {
    const char* v = std::getenv("VIT_PROFILE");
    return v && std::strcmp(v, "0") != 0;
  }();
  ProfileTimer* timer = nullptr;
  std::map<std::string, OpTotals> totals;
};

ProfileState& state() {
  static ProfileState s;
  return s;
}

}  // namespace

bool Profile::enabled() {
  return state().enabled;
}

void Profile::set_enabled(bool on) {
  state().enabled = on;
}

void Profile::set_timer(ProfileTimer* timer) {
  state().timer = timer;
}

ProfileTimer* Profile::timer() {
  return state().timer;
}

const std::map<std::string, OpTotals>& Profile::totals() {
  ProfileState& s = state();
  if (s.timer) s.timer->collect(s.totals);
  return s.totals;
}

void Profile::add(const char* name, double seconds, const OpWork& work) {
  OpTotals& t = state().totals[name];
  t.seconds += seconds;
  t.flops += work.flops;
  t.bytes += work.bytes;
  ++t.calls;
}

void Profile::reset() {
  ProfileState& s = state();
  if (s.timer) s.timer->collect(s.totals);  // drop what was pending too
  s.totals.clear();
}

void Profile::print(FILE* out, int steps) {
  std::vector<std::pair<double, std::string>> rows;
  double sum = 0;
  for (const auto& [name, t] : totals()) {
    rows.push_back({t.seconds, name});
    sum += t.seconds;
  }
  std::sort(rows.rbegin(), rows.rend());
  const double per = steps > 0 ? 1.0 / steps : 1.0;
  std::fprintf(out, "%-30s %9s %6s %7s %14s\n", "op", "ms/step", "share", "calls", "rate");
  for (const auto& [seconds, name] : rows) {
    const OpTotals& t = state().totals.at(name);
    char rate[32] = "";
    if (seconds > 0 && t.flops > 0)
      std::snprintf(rate, sizeof rate, "%.2f TFLOP/s", t.flops / seconds / 1e12);
    else if (seconds > 0 && t.bytes > 0)
      std::snprintf(rate, sizeof rate, "%.1f GB/s", t.bytes / seconds / 1e9);
    std::fprintf(out, "%-30s %9.3f %5.1f%% %7.1f %14s\n", name.c_str(), 1e3 * seconds * per,
                 sum > 0 ? 100 * seconds / sum : 0.0, double(t.calls) * per, rate);
  }
  std::fprintf(out, "%-30s %9.3f\n", "total (profiled ops)", 1e3 * sum * per);
}

}  // namespace vit
