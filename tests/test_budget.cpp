// Wall-clock budget: duration parsing, the budget, and the stop rule (BudgetPlanner) on a fake
// clock: its arithmetic, then whole simulated runs of each curriculum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/common.h"
#include "train/budget.h"
#include "train/curriculum.h"

namespace {

TEST(Duration, ParsesUnitsAndPlainSeconds) {
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("24h"), 86400.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("90m"), 5400.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("45s"), 45.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("1h30m"), 5400.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("2.5h"), 9000.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("600"), 600.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("0.5"), 0.5);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("1h0m30s"), 3630.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("1m30s"), 90.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds(" 10m "), 600.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("0h5m"), 300.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds(".5m"), 30.0);
}

TEST(Duration, RejectsBadText) {
  for (const char* bad : {"", "   ", "abc", "-5m", "10x", "0s", "0", "0h0m", "h", "1h1h", "30m1h",
                          "1h30", "1.2.3h", "+5m", "5 m", "1e3", "5mm", ".h", "inf"}) {
    try {
      vit::parse_duration_seconds(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const vit::Error& e) {
      EXPECT_NE(std::string(e.what()).find("\"" + std::string(bad) + "\""), std::string::npos)
          << e.what();
    }
  }
}

// Numbers past double's range, or below it, are one vit::Error, not std::stod's out_of_range
// (fuzz_config campaign, 2026-11-25: 400 digits ended `vitrain train` with "error: stod").
TEST(Duration, RejectsNumbersOutOfRange) {
  const std::string huge(400, '9'), tiny = "0." + std::string(400, '0') + "1";
  for (const std::string& bad : {huge, huge + "s", "1h" + huge + "m", tiny, tiny + "h"})
    EXPECT_THROW(vit::parse_duration_seconds(bad), vit::Error) << bad.size() << " chars";
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("1h" + tiny + "s"), 3600.0);  // underflows to 0
}

TEST(TimeBudget, ProgressEndsWhereTrainingEndsNotWhereTheEvaluationDoes) {
  const vit::TimeBudget b{1000, 100};  // 900 s usable
  EXPECT_DOUBLE_EQ(b.usable_s(), 900.0);
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 0, 0, 0), 0.0);
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 450, 0, 0), 0.5);
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 2000, 0, 0), 1.0);
  // 300 s kept for the final evaluation: training ends at 600 s, and so do the schedules.
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 300, 300, 0), 0.5);
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 600, 300, 0), 1.0);
  // A smaller estimate later never takes the progress back.
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 310, 100, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 400, 100, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 480, 100, 0.5), 0.6);
  // No training time left: the schedules are at their end.
  EXPECT_DOUBLE_EQ(vit::budget_progress(b, 10, 950, 0), 1.0);
  EXPECT_THROW(vit::budget_progress(b, 10, -1, 0), vit::Error);
}

TEST(TimeBudget, RejectsBadConfiguration) {
  EXPECT_THROW((vit::TimeBudget{0, 0}.usable_s()), vit::Error);
  EXPECT_THROW((vit::TimeBudget{100, 100}.usable_s()), vit::Error);
  EXPECT_THROW((vit::TimeBudget{100, -1}.usable_s()), vit::Error);
}

// A clock the test moves by hand.
struct FakeClock {
  double t = 0;
  vit::BudgetPlanner::Clock fn() {
    return [this] { return t; };
  }
};

TEST(BudgetPlanner, StopsWhenTheNextStepAndTheFinalEvaluationNoLongerFit) {
  FakeClock c;
  vit::BudgetPlanner p(vit::TimeBudget{100, 5}, {100, 1}, c.fn());  // 95 s usable
  for (double s : {1.0, 1.0, 1.0, 10.0, 1.0}) p.record_step(s);     // median 1: the 10 s is noise
  p.record_probe({0.9, 0.25, 0.15, 0.2});      // the cold first batch left out: 0.2 s x 100 batches
  EXPECT_DOUBLE_EQ(p.final_estimate(), 22.0);  // 20 s x 1.1
  c.t = 50;
  vit::BudgetVerdict v = p.decide();
  EXPECT_DOUBLE_EQ(v.step_s, 1.0);
  EXPECT_DOUBLE_EQ(v.final_s, 22.0);
  EXPECT_FALSE(v.stop);
  c.t = 71;  // 71 + 2 x 1 + 22 = 95: exactly at the limit still trains
  EXPECT_FALSE(p.decide().stop);
  c.t = 71.5;
  v = p.decide();
  EXPECT_TRUE(v.stop);
  EXPECT_FALSE(v.too_small);       // stopped at 71.5 s, past half of the 95 s usable
  EXPECT_FALSE(p.decide(0).stop);  // with no update to run, the evaluation alone fits
  c.t = 60;                        // data parallel: 6 updates until the next check need 12 s
  EXPECT_FALSE(p.decide(6).stop);
  EXPECT_TRUE(p.decide(7).stop);
}

// The measured case: a 90-s run with EMA reached its first epoch's end at 37 s with 25 s kept
// for its two evaluations; evaluating then ended the run at 62 s, 69% of the budget, with no
// time for another. The epoch's evaluation is skipped instead.
TEST(BudgetPlanner, AnEpochEvaluationFitsOnlyWithTheFinalOneAfterIt) {
  FakeClock c;
  vit::BudgetPlanner p(vit::TimeBudget{90, 4.5}, {157, 2}, c.fn());  // 85.5 s usable
  EXPECT_TRUE(p.interim_evaluation_fits());                          // nothing measured yet
  p.record_probe({0.2, 0.08, 0.07, 0.08, 0.07, 0.09});  // 11.8 s an evaluation, 25.9 s kept
  c.t = 30;  // 30 + 2 x 25.9 = 81.8: the epoch's evaluation, then the final one
  EXPECT_TRUE(p.interim_evaluation_fits());
  c.t = 37;
  EXPECT_FALSE(p.interim_evaluation_fits());
  EXPECT_FALSE(p.decide().stop);  // and training goes on
}

TEST(BudgetPlanner, KeepsTwoEvaluationsWithEmaOnTheMeanOfRecentEstimates) {
  FakeClock c;
  vit::BudgetPlanner p(vit::TimeBudget{1000, 50}, {10, 2}, c.fn());
  EXPECT_DOUBLE_EQ(p.final_estimate(), 0.0);  // nothing measured yet
  EXPECT_EQ(p.probe_batches(), vit::BudgetPlanner::kFirstProbeBatches);
  p.record_probe({9.0, 9.0, 2.0, 2.0, 1.0, 3.0});  // two cold batches left out: 2 s a batch
  EXPECT_EQ(p.probe_batches(), vit::BudgetPlanner::kProbeBatches);
  EXPECT_DOUBLE_EQ(p.final_estimate(), 2 * 1.1 * 20.0);  // 20 s per evaluation, twice
  p.record_probe({5.0, 1.0, 1.2});                       // median of 1.0 and 1.2: 11 s
  EXPECT_DOUBLE_EQ(p.final_estimate(), 2 * 1.1 * (20.0 + 11.0) / 2);
  p.record_probe({0.5});
  p.record_probe({0.8});  // the last three: 11, 5 and 8 s
  EXPECT_DOUBLE_EQ(p.final_estimate(), 2 * 1.1 * (11.0 + 5.0 + 8.0) / 3);
  p.record_evaluation(24.0);  // a whole end-of-epoch evaluation of both: 12 s each
  EXPECT_DOUBLE_EQ(p.final_estimate(), 2 * 1.1 * 12.0);
}

TEST(BudgetPlanner, AsksForProbesAtTheStartPeriodicallyNearTheEndAndBeforeAStop) {
  FakeClock c;
  vit::BudgetPlanner p(vit::TimeBudget{1000, 50}, {100, 1}, c.fn());  // 950 s usable
  EXPECT_TRUE(p.wants_probe());
  p.record_probe({0.5});  // a 50 s evaluation, 55 s kept
  c.t = 300;
  EXPECT_FALSE(p.wants_probe());  // no update since
  p.record_step(0.1);
  c.t = 237;
  EXPECT_FALSE(p.wants_probe());
  c.t = 238;  // a quarter of the usable budget later
  EXPECT_TRUE(p.wants_probe());
  c.t = 800;
  p.record_probe({0.5});  // slack 950 - 800 - 55 = 95 s
  p.record_step(0.1);
  c.t = 847;
  EXPECT_FALSE(p.wants_probe());
  c.t = 848;  // slack 47 s: halved
  EXPECT_TRUE(p.wants_probe());
  p.record_probe({0.5});
  p.record_step(0.1);
  c.t = 872;  // slack 23 s, halved again
  EXPECT_TRUE(p.wants_probe());
  p.record_probe({0.5});
  p.record_step(0.1);
  c.t = 885;  // slack 10 s, halved again, but under a quarter of the evaluation
  EXPECT_FALSE(p.wants_probe());
  c.t = 894.9;  // 894.9 + 0.2 + 55 > 950: a stop is due; it rests on a fresh probe
  ASSERT_TRUE(p.decide().stop);
  EXPECT_TRUE(p.wants_probe());
  p.record_probe({0.45});  // the machine got faster: 49.5 s kept, and training goes on
  EXPECT_FALSE(p.decide().stop);
  p.record_step(0.1);
  c.t = 902;  // due again, only 7 s (under a hundredth of the budget) after the last probe
  ASSERT_TRUE(p.decide().stop);
  EXPECT_FALSE(p.wants_probe());
}

TEST(BudgetPlanner, AStopAtTheStartRestsOnThreeProbes) {
  FakeClock c;
  vit::BudgetPlanner p(vit::TimeBudget{60, 3}, {100, 1}, c.fn());  // 57 s usable
  p.record_probe({0.6});  // 66 s kept: a stop is due before the first update
  ASSERT_TRUE(p.decide().stop);
  EXPECT_TRUE(p.wants_probe());
  p.record_probe({0.5});  // 50 s: the mean of 60 and 50 still calls for a stop
  EXPECT_TRUE(p.wants_probe());
  p.record_probe({0.1});  // 10 s: mean 40 s, 44 s kept, training goes on
  EXPECT_FALSE(p.decide().stop);
  EXPECT_FALSE(p.wants_probe());
}

TEST(BudgetPlanner, ProbesStayWithinTheirShareOfTheBudget) {
  FakeClock c;
  vit::BudgetPlanner p(vit::TimeBudget{200, 10}, {1, 1}, c.fn());  // 190 s usable
  p.record_probe({0.01});                                          // the first probe does not count
  for (int i = 0; i < 2; ++i) {  // 2 x 2 s of probes past the 3.8 s share
    p.record_step(0.1);
    c.t += 48;  // a quarter of the usable budget
    ASSERT_TRUE(p.wants_probe()) << i;
    p.record_probe({2.0});
  }
  p.record_step(0.1);
  c.t += 48;
  EXPECT_FALSE(p.wants_probe());
}

TEST(BudgetPlanner, RejectsBadInput) {
  FakeClock c;
  EXPECT_THROW(vit::BudgetPlanner(vit::TimeBudget{0, 0}, {1, 1}, c.fn()), vit::Error);
  EXPECT_THROW(vit::BudgetPlanner(vit::TimeBudget{10, 1}, {0, 1}, c.fn()), vit::Error);
  EXPECT_THROW(vit::BudgetPlanner(vit::TimeBudget{10, 1}, {1, 0}, c.fn()), vit::Error);
  vit::BudgetPlanner p(vit::TimeBudget{10, 1}, {1, 1}, c.fn());
  EXPECT_THROW(p.record_step(-1), vit::Error);
  EXPECT_THROW(p.record_probe({}), vit::Error);
  EXPECT_THROW(p.record_evaluation(NAN), vit::Error);
  EXPECT_THROW(p.decide(-1), vit::Error);
}

// A whole budget run on the fake clock, as the trainer drives the planner: start-up, then
// before each update a probe when asked for (its first third of batches cold) and the verdict, the
// update at the size the curriculum gives at that fraction of the budget, and after the stop the
// final evaluation(s) and the checkpoint.
struct SimRun {
  const char* name;
  double budget_s;
  const char* curriculum;  // none, size (epochs 6, 4 -> 24 px) or efficienttrain (deit table)
  bool ema;
  double startup_s;
  double step_s;         // one update at the final size 28 px
  double first_step_s;   // the first update (warm-up, or a machine busy at that moment)
  double jitter;         // every time is multiplied by a factor drawn from [1, jitter]
  double eval_batch_s;   // one evaluation batch at the evaluation size, 28 px
  int64_t eval_batches;  // per evaluation
  double slowdown_at;    // from this fraction of the budget on the machine is 2x slower (0: never)
  bool too_small;        // expected: the budget cannot hold start-up and the evaluation
};

struct SimResult {
  double end_s = 0;
  double train_end_s = 0;  // the clock at the stop, before the final evaluation
  int64_t updates = 0;
  double last_progress = 0;                    // the schedules' progress at the last update
  std::vector<std::pair<int, double>> stages;  // EfficientTrain++: (stage, clock at its start)
  bool too_small = false;
  std::string line;
};

SimResult simulate(const SimRun& r) {
  constexpr int kFinal = 28, kPatch = 4;
  FakeClock c;
  c.t = r.startup_s;
  uint64_t rng = 12345;
  auto factor = [&] {  // the load: [1, jitter], x2 after slowdown_at
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    const double u = double(rng >> 11) / double(1ull << 53);
    const double slow = r.slowdown_at > 0 && c.t >= r.slowdown_at * r.budget_s ? 2.0 : 1.0;
    return slow * (1.0 + (r.jitter - 1.0) * u);
  };
  const vit::TimeBudget budget{r.budget_s, std::min(0.05 * r.budget_s, 60.0)};
  vit::BudgetPlanner p(budget, {r.eval_batches, r.ema ? 2 : 1}, c.fn());
  const vit::EtSchedule et = vit::et_schedule_deit(kFinal, kPatch);
  const std::string cur = r.curriculum;
  SimResult out;
  for (;;) {
    if (p.wants_probe()) {
      std::vector<double> times;
      const int n = p.probe_batches();
      for (int k = 0; k < n; ++k) {
        const double dt = r.eval_batch_s * factor() * (k < n / 3 ? 3.0 : 1.0);
        c.t += dt;
        times.push_back(dt);
      }
      p.record_probe(times);
    }
    const vit::BudgetVerdict v = p.decide();
    if (v.stop) {
      out.too_small = v.too_small;
      if (v.too_small) out.line = p.too_small_line(out.updates);
      break;
    }
    const double frac = out.last_progress =
        vit::budget_progress(budget, c.t, p.final_estimate(), out.last_progress);
    if (out.stages.empty() || out.stages.back().first != vit::et_stage(frac))
      out.stages.emplace_back(vit::et_stage(frac), c.t);
    const int size = cur == "size"             ? vit::size_curriculum(int(frac * 6), 4, 4, 1, 28, 4)
                     : cur == "efficienttrain" ? vit::et_size(et, frac)
                                               : kFinal;
    const double at_size = r.step_s * std::max(0.05, double(size * size) / (kFinal * kFinal));
    const double dt = (out.updates == 0 ? r.first_step_s : at_size) * factor();
    c.t += dt;
    p.record_step(dt);
    ++out.updates;
  }
  out.train_end_s = c.t;
  for (int e = 0; e < (r.ema ? 2 : 1); ++e)
    for (int64_t k = 0; k < r.eval_batches; ++k) c.t += r.eval_batch_s * factor();
  c.t += 0.2;  // weights, state and plot
  out.end_s = c.t;
  return out;
}

// The runs of the issue: 60 s, 90 s and 5 min, each curriculum, with and without EMA, on a
// machine whose times jitter by 2x, with a slow first step, a load that arrives late in the run,
// and a day-long run; and budgets too small for their evaluation.
TEST(BudgetPlanner, SimulatedRunsUseTheirBudgetAndEndInsideIt) {
  // name, budget, curriculum, ema, start-up, step, first step, jitter, eval batch, batches,
  // slowdown at, too small
  const SimRun runs[] = {
      {"quiet none", 60, "none", false, 2, 0.05, 0.05, 1.0, 0.02, 157, 0, false},
      {"slow first step, size", 90, "size", false, 3, 0.05, 12.0, 1.0, 0.02, 157, 0, false},
      {"slow first step, et", 90, "efficienttrain", false, 3, 0.05, 12.0, 1.0, 0.02, 157, 0, false},
      {"noisy none", 60, "none", false, 2, 0.05, 0.05, 2.0, 0.02, 157, 0, false},
      {"noisy size", 60, "size", false, 2, 0.05, 0.3, 2.0, 0.02, 157, 0, false},
      {"noisy et", 60, "efficienttrain", false, 2, 0.05, 0.3, 2.0, 0.02, 157, 0, false},
      {"noisy none ema", 60, "none", true, 2, 0.05, 0.05, 2.0, 0.02, 157, 0, false},
      {"noisy size ema", 60, "size", true, 2, 0.05, 0.3, 2.0, 0.02, 157, 0, false},
      {"noisy et ema", 60, "efficienttrain", true, 2, 0.05, 0.3, 2.0, 0.02, 157, 0, false},
      {"noisy size ema 90s", 90, "size", true, 2, 0.1, 1.0, 2.0, 0.04, 157, 0, false},
      {"noisy et ema 5min", 300, "efficienttrain", true, 2, 0.1, 1.0, 2.0, 0.04, 157, 0, false},
      {"late load, none ema", 90, "none", true, 2, 0.05, 0.05, 1.3, 0.02, 157, 0.7, false},
      {"late load, size", 300, "size", false, 2, 0.05, 0.05, 1.3, 0.02, 157, 0.9, false},
      {"a day, et ema", 86400, "efficienttrain", true, 60, 0.3, 5.0, 1.5, 0.1, 1000, 0, false},
      {"too small", 10, "none", false, 2, 0.05, 0.05, 1.0, 0.04, 157, 0, true},
      {"too small ema", 20, "size", true, 4, 0.05, 0.05, 1.0, 0.04, 157, 0, true},
  };
  for (const SimRun& r : runs) {
    const SimResult s = simulate(r);
    std::printf("%-22s ended at %8.1f of %6.0f s (%.1f%%), %lld updates\n", r.name, s.end_s,
                r.budget_s, 100 * s.end_s / r.budget_s, (long long)s.updates);
    EXPECT_EQ(s.too_small, r.too_small) << r.name;
    if (r.too_small) {
      EXPECT_NE(s.line.find("too small"), std::string::npos) << r.name << ": " << s.line;
      continue;
    }
    EXPECT_LE(s.end_s, r.budget_s) << r.name;
    EXPECT_GE(s.end_s / r.budget_s, 0.85) << r.name << ": ended at " << s.end_s;
    EXPECT_GT(s.updates, 100) << r.name;
    // The schedules (learning rate, curriculum stages) run to their end before the stop.
    EXPECT_GE(s.last_progress, 0.95) << r.name;
  }
}

// The case: on a busy machine the first update at the curriculum's smallest size took
// long, and the old rule scaled it to the evaluation size and stopped after one update. Here a
// first update of a fifth of the budget still leaves the run training to the end.
TEST(BudgetPlanner, OneSlowFirstStepDoesNotEndTheRun) {
  const SimRun r{"first step 18 s", 90, "size", false, 3, 0.05, 18.0, 1.5, 0.02, 157, 0, false};
  const SimResult s = simulate(r);
  EXPECT_FALSE(s.too_small);
  EXPECT_GT(s.updates, 500);
  EXPECT_GE(s.end_s / r.budget_s, 0.85);
  EXPECT_LE(s.end_s, r.budget_s);
}

// The 24-hour recipe scaled down to minutes keeps its schedule's shape: every EfficientTrain++
// stage runs, each starting at the same share of the training time as in the day-long run
// (within 3% of it), although the final evaluation takes over a tenth of the short budget and a
// thousandth of the long one.
TEST(BudgetPlanner, AScaledDownBudgetKeepsTheDayLongScheduleShape) {
  const SimRun day{"a day", 86400, "efficienttrain", true, 60, 0.3, 5.0, 1.5, 0.1, 1000, 0, false};
  const SimRun minutes{"5 min", 300, "efficienttrain", true, 2, 0.05, 1.0, 1.5, 0.1, 157, 0, false};
  const SimResult a = simulate(day), b = simulate(minutes);
  ASSERT_EQ(a.stages.size(), 10u);
  ASSERT_EQ(b.stages.size(), a.stages.size());
  auto share = [](const SimResult& s, const SimRun& r, size_t k) {
    return (s.stages[k].second - r.startup_s) / (s.train_end_s - r.startup_s);
  };
  for (size_t k = 0; k < a.stages.size(); ++k) {
    EXPECT_EQ(a.stages[k].first, int(k));
    EXPECT_EQ(b.stages[k].first, int(k));
    EXPECT_NEAR(share(b, minutes, k), share(a, day, k), 0.03) << "stage " << k;
  }
  EXPECT_GT(b.end_s - b.train_end_s, 0.1 * minutes.budget_s);  // the evaluation's share
}

}  // namespace
