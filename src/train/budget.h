// Wall-clock training budget ("train for 24h"): duration parsing and the stop rule.
#pragma once
#include <string>

namespace vit {

// Parses a positive duration into seconds. Accepted: plain seconds ("600", "2.5"), or one or more
// <number><unit> terms with units h, m, s in that order, each at most once ("24h", "90m", "45s",
// "1h30m", "2.5h", "1h0m30s"). Numbers are non-negative decimals without sign or exponent;
// surrounding whitespace is ignored. Throws vit::Error quoting the text for anything else,
// including "", "abc", "-5m", "10x", "1h1h", "30m1h" and zero durations ("0s").
double parse_duration_seconds(const std::string& text);

// A wall-clock budget of total_s seconds of which reserve_s is kept back as a safety margin
// (the usable budget is total_s - reserve_s). Methods throw vit::Error unless total_s > 0 and
// 0 <= reserve_s < total_s.
struct TimeBudget {
  double total_s = 0;
  double reserve_s = 0;

  double usable_s() const;  // total_s - reserve_s
  // Fraction of the usable budget spent, clamped to [0, 1] (drives time-based schedules).
  double fraction(double elapsed_s) const;
  // True when one more step (step_s, a running estimate of the step time) followed by the final
  // evaluation and checkpoint (final_eval_s, an estimate) would end past the usable budget. Both
  // estimates count kMargin times: the speed of a shared machine swings by 2x between one
  // measurement and the next, and one spare step and evaluation cost little in a long run:
  //   elapsed_s + kMargin * (step_s + final_eval_s) > total_s - reserve_s.
  bool should_stop(double elapsed_s, double step_s, double final_eval_s) const;
  static constexpr double kMargin = 2.0;
};

}  // namespace vit
