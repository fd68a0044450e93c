#include "train/budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

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

double budget_progress(const TimeBudget& budget, double clock, double final_s, double previous) {
  VIT_CHECK(final_s >= 0 && std::isfinite(final_s),
            "time budget: the final evaluation's time must be >= 0");
  const double horizon = budget.usable_s() - final_s;
  const double progress = horizon > 0 ? std::clamp(clock / horizon, 0.0, 1.0) : 1.0;
  return std::max(previous, progress);
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

BudgetPlanner::BudgetPlanner(TimeBudget budget, FinalEvalShape shape, Clock clock)
    : budget_(budget), shape_(shape), clock_(std::move(clock)) {
  check_budget(budget_);
  VIT_CHECK(shape_.batches >= 1 && shape_.evals >= 1,
            "time budget: the final evaluation needs >= 1 batch and >= 1 evaluation");
  VIT_CHECK(bool(clock_), "time budget: no clock");
  start_s_ = clock_();
}

void BudgetPlanner::record_step(double seconds) {
  VIT_CHECK(seconds >= 0 && std::isfinite(seconds), "time budget: a step time must be >= 0");
  steps_.push_back(seconds);
  if (steps_.size() > kStepWindow) steps_.pop_front();
  ++steps_since_probe_;
}

void BudgetPlanner::set_eval_estimate(double one_eval_s) {
  VIT_CHECK(one_eval_s >= 0 && std::isfinite(one_eval_s),
            "time budget: an evaluation time must be >= 0");
  evals_.push_back(one_eval_s);
  if (evals_.size() > kEvalHistory) evals_.pop_front();
}

bool BudgetPlanner::wants_probe() const {
  if (last_probe_s_ < 0) return true;
  // A stop rests on kEvalHistory estimates, the last after the last update.
  const bool due = decide().stop;
  if (due && evals_.size() < kEvalHistory) return true;
  if (steps_since_probe_ == 0) return false;  // nothing new since the last
  const double now = clock_(), usable = budget_.usable_s(), since = now - last_probe_s_;
  if (due) return since >= 0.01 * usable;
  if (probe_spent_s_ >= kProbeShare * usable) return false;
  if (since >= 0.25 * usable) return true;
  const double left = slack(now);
  return left < 0.5 * slack_at_probe_ && left > 0.25 * one_eval();
}

void BudgetPlanner::record_probe(const std::vector<double>& batch_seconds) {
  VIT_CHECK(!batch_seconds.empty(), "time budget: a probe needs at least one batch time");
  const size_t cold = batch_seconds.size() / 3;
  set_eval_estimate(median({batch_seconds.begin() + long(cold), batch_seconds.end()}) *
                    double(shape_.batches));
  if (last_probe_s_ >= 0)
    for (double t : batch_seconds) probe_spent_s_ += t;
  last_probe_s_ = clock_();
  slack_at_probe_ = slack(last_probe_s_);
  steps_since_probe_ = 0;
}

void BudgetPlanner::record_evaluation(double seconds) {
  evals_.clear();  // a whole evaluation outweighs the probes before it
  set_eval_estimate(seconds / double(shape_.evals));
}

double BudgetPlanner::one_eval() const {
  if (evals_.empty()) return -1;
  double sum = 0;
  for (double e : evals_) sum += e;
  return sum / double(evals_.size());
}

double BudgetPlanner::final_estimate() const {
  return evals_.empty() ? 0.0 : double(shape_.evals) * kEvalMargin * one_eval();
}

BudgetVerdict BudgetPlanner::decide(int64_t updates) const {
  VIT_CHECK(updates >= 0, "time budget: updates until the next decision must be >= 0");
  BudgetVerdict v;
  v.step_s = steps_.empty() ? 0.0 : median({steps_.begin(), steps_.end()});
  v.final_s = final_estimate();
  const double now = clock_(), usable = budget_.usable_s();
  v.stop = now + kStepMargin * double(updates) * v.step_s + v.final_s > usable;
  v.too_small = v.stop && now - start_s_ < 0.5 * (usable - start_s_);
  return v;
}

bool BudgetPlanner::interim_evaluation_fits() const {
  return clock_() + 2.0 * final_estimate() <= budget_.usable_s();
}

std::string BudgetPlanner::too_small_line(int64_t updates) const {
  const double final_s = final_estimate(), now = clock_();
  // Half of the time after start-up trains when usable - start >= 2 final, with
  // usable = total * (1 - the reserve's share).
  const double share = 1.0 - budget_.reserve_s / budget_.total_s;
  const double at_least = (start_s_ + 2.0 * final_s) / share;
  return fmt::format(
      "Budget: {:.1f}s is too small for this run: its final evaluation needs about {:.1f}s, so "
      "training stops after {:.1f}s and {} updates; a budget of at least {:.0f}s trains for half "
      "of it",
      budget_.total_s, final_s, now - start_s_, updates, std::ceil(at_least));
}

}  // namespace vit
