// Wall-clock training budget ("train for 24h"): duration parsing, the budget, and the stop rule
// that decides when training ends so that the final evaluation still fits.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

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
};

// Progress of a budget run's time-based schedules (learning rate, size curriculum,
// EfficientTrain++ stages) at `clock` seconds: the share of the time until training is due to
// end, usable - final_s, with final_s the time the stop rule keeps for the final evaluation, so
// that the schedules finish where training does, not where the final evaluation does (on a
// 60-s budget whose evaluation takes 20 s, clock / usable would stop them two thirds of the way).
// final_s moves as its estimate improves, so the progress is at least `previous`: running back
// could take the size curriculum down a size and up again. 1 once no training time is left.
double budget_progress(const TimeBudget& budget, double clock, double final_s, double previous);

// What a budget run's final evaluation runs: `batches` evaluation batches in this process (its
// share, data parallel), `evals` times (2 with a model EMA: the weights, then the EMA's).
struct FinalEvalShape {
  int64_t batches = 1;
  int evals = 1;
};

// The stop rule's verdict before the next updates, with the estimates it rests on.
struct BudgetVerdict {
  bool stop = false;
  // Stopping while less than half of the time after start-up was trained: the budget is too
  // small for the start-up and the final evaluation (BudgetPlanner::too_small_line says so).
  bool too_small = false;
  double step_s = 0;   // the robust step time (median of the recent steps)
  double final_s = 0;  // the time kept for the final evaluation(s), margin included
};

// The stop rule of a budget run, fed with measurements and asked before each update (or group
// of updates, data parallel) whether to stop and run the final evaluation. It never guesses the
// evaluation from training steps at another image size: it times real evaluation batches at the
// evaluation size (probes), and whole evaluations when the run makes them. With the injected
// clock (the run's elapsed seconds) it stops when
//   now + kStepMargin * updates * median(the last kStepWindow steps) + final_s > usable,
//   final_s = evals * kEvalMargin * mean(the last kEvalHistory one-evaluation estimates),
// so one slow step moves the median little, probes taken at different moments of a load that
// comes and goes average out, and every stop rests on kEvalHistory probes, the last taken after
// the last update: a stop that the estimates call for first asks for a fresh probe
// (wants_probe).
class BudgetPlanner {
 public:
  using Clock = std::function<double()>;
  static constexpr double kStepMargin = 2.0;  // a busy machine's step times jitter by 2x
  // An evaluation sums many batches, so its time varies far less than a step's; the reserve
  // (TimeBudget::reserve_s) takes the rest.
  static constexpr double kEvalMargin = 1.1;
  static constexpr size_t kStepWindow = 15, kEvalHistory = 3;
  // Probes: the first times more batches (a new evaluation model's first ones pay for cold
  // buffers and caches); the first third of a probe's batches is left out of its median. All
  // probes but the first and a stop's together take at most kProbeShare of the usable budget.
  static constexpr int kFirstProbeBatches = 6, kProbeBatches = 4;
  static constexpr double kProbeShare = 0.02;

  // Throws vit::Error for a bad budget (TimeBudget's rules), batches < 1 or evals < 1.
  BudgetPlanner(TimeBudget budget, FinalEvalShape shape, Clock clock);

  void record_step(double seconds);  // one training update took `seconds`
  // True when evaluation batches should be timed (probe_batches() of them, then record_probe)
  // before the next decision: none yet; a stop is due on the current estimates and fewer than
  // kEvalHistory estimates were made, or the last probe is older than the last update and than
  // a hundredth of the usable budget; or, within
  // kProbeShare, a quarter of the usable budget since the last, or the slack (the time left after
  // the final evaluation) halved since the last while still over a quarter of one evaluation.
  bool wants_probe() const;
  int probe_batches() const { return last_probe_s_ < 0 ? kFirstProbeBatches : kProbeBatches; }
  // The times of consecutive evaluation batches at the evaluation size: their median, without
  // the first third, times the batches of one evaluation is a new estimate of one.
  void record_probe(const std::vector<double>& batch_seconds);
  // A whole end-of-epoch evaluation (all `evals`): it replaces the probes' estimates.
  void record_evaluation(double seconds);
  BudgetVerdict decide(int64_t updates = 1) const;
  // Whether an evaluation before the stop (an epoch's, at --eval-interval) leaves time for the
  // final one: now + 2 final_s <= usable. One that does not would end the run right after it
  // with the rest of the budget unused; the final evaluation at the stop comes instead.
  bool interim_evaluation_fits() const;
  double final_estimate() const;  // final_s of decide()
  double one_eval() const;        // the mean of the last kEvalHistory estimates (-1: none)
  // One line for a run stopped with verdict.too_small: what took the budget, and a budget that
  // would train for half of the time after start-up.
  std::string too_small_line(int64_t updates) const;

 private:
  double slack(double now) const { return budget_.usable_s() - now - final_estimate(); }
  void set_eval_estimate(double one_eval_s);

  TimeBudget budget_;
  FinalEvalShape shape_;
  Clock clock_;
  double start_s_ = 0;         // the clock when the planner was made (after start-up)
  std::deque<double> steps_;   // the last kStepWindow step times
  std::deque<double> evals_;   // the last kEvalHistory estimates of one evaluation
  double last_probe_s_ = -1;   // the clock at the last probe (-1: none yet)
  double slack_at_probe_ = 0;  // slack() right after it
  double probe_spent_s_ = 0;   // the probes' time after the first
  int64_t steps_since_probe_ = 0;
};

}  // namespace vit
