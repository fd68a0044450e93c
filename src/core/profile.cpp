#include "core/profile.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace vit {

bool Profile::enabled() {
  static const bool on = [] {
    const char* v = std::getenv("VIT_PROFILE");
    return v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

std::map<std::string, double>& Profile::totals() {
  static std::map<std::string, double> t;
  return t;
}

void Profile::print(FILE* out) {
  std::vector<std::pair<double, std::string>> rows;
  double sum = 0;
  for (auto& [k, v] : totals()) {
    rows.push_back({v, k});
    sum += v;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::fprintf(out, "%-28s %10s %7s\n", "op", "seconds", "share");
  for (auto& [v, k] : rows)
    std::fprintf(out, "%-28s %10.3f %6.1f%%\n", k.c_str(), v, 100 * v / sum);
}

}  // namespace vit
