#include "train/budget.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/common.h"

namespace vit {

namespace {

[[noreturn]] void bad_duration(const std::string& text, const std::string& why) {
  throw Error("bad duration \"" + text + "\": " + why +
              " (expected e.g. 24h, 90m, 45s, 1h30m, 2.5h or plain seconds 600)");
}

}  // namespace

double parse_duration_seconds(const std::string& text) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  if (b == e) bad_duration(text, "empty");
  const std::string s = text.substr(b, e - b);

  double total = 0;
  int last_unit = -1;  // index into "hms" of the previous term's unit
  size_t i = 0;
  while (i < s.size()) {
    // number: digits [. digits]
    const size_t start = i;
    size_t digits = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
    if (i < s.size() && s[i] == '.') {
      ++i;
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
    }
    if (digits == 0) bad_duration(text, "expected a number at \"" + s.substr(start) + "\"");
    // strtod, not stod: a number past double's range is inf (refused below), not an
    // exception (fuzz_config: 400 digits ended the process with "error: stod").
    const double value = std::strtod(s.substr(start, i - start).c_str(), nullptr);
    if (!std::isfinite(value)) bad_duration(text, "number too large");
    if (i == s.size()) {
      if (last_unit != -1) bad_duration(text, "missing unit after the last number");
      total = value;
      break;
    }
    static const char kUnits[] = "hms";
    static const double kScale[] = {3600.0, 60.0, 1.0};
    const char* u = std::char_traits<char>::find(kUnits, 3, s[i]);
    if (!u) bad_duration(text, std::string("unknown unit '") + s[i] + "'");
    const int unit = int(u - kUnits);
    if (unit <= last_unit) bad_duration(text, "units must appear once each, in the order h, m, s");
    last_unit = unit;
    total += value * kScale[unit];
    ++i;
  }
  if (!std::isfinite(total)) bad_duration(text, "not finite");
  if (!(total > 0)) bad_duration(text, "must be positive");
  return total;
}

namespace {
void check_budget(const TimeBudget& b) {
  VIT_CHECK(b.total_s > 0 && std::isfinite(b.total_s),
            "time budget: total must be > 0 seconds, got " + std::to_string(b.total_s));
  VIT_CHECK(b.reserve_s >= 0 && b.reserve_s < b.total_s,
            "time budget: reserve must be in [0, total), got " + std::to_string(b.reserve_s) +
                " of " + std::to_string(b.total_s));
}
}  // namespace

double TimeBudget::usable_s() const {
  check_budget(*this);
  return total_s - reserve_s;
}

double TimeBudget::fraction(double elapsed_s) const {
  return std::clamp(elapsed_s / usable_s(), 0.0, 1.0);
}

bool TimeBudget::should_stop(double elapsed_s, double step_s, double final_eval_s) const {
  VIT_CHECK(step_s >= 0 && final_eval_s >= 0,
            "time budget: step and final-evaluation estimates must be >= 0");
  return elapsed_s + kMargin * (step_s + final_eval_s) > usable_s();
}

}  // namespace vit
