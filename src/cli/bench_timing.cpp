// `vitrain bench`'s timing (bench_timing.h).
#include "cli/bench_timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "cli/bench_variants.h"
#include "core/common.h"
#include "core/profile.h"

namespace vit {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

namespace {

// Times `steps` steps (the untimed ones already waited for), waited for once at the end: the
// whole time gives the figure. Marks on the device's timeline split them into up to kChunks
// chunks, whose rates (median, spread) say whether a moment's slowdown (a clock change, another
// process) moved it, which one short total cannot. The chunks are not waited for: each wait
// drained the queue and made the next chunk's first step wait for its batch's host copy (the
// ViT-S/16 b256 figure fell from 8,590 to 8,050 img/s on an H200, 2026-11-27).
TimedSteps time_steps(Engine& engine, const std::function<void()>& step, int steps, int batch) {
  constexpr int kChunks = 5;
  const int chunks = std::min(steps, kChunks);
  std::vector<int> chunk_steps;
  const auto t0 = std::chrono::steady_clock::now();
  engine.mark_time();
  for (int c = 0; c < chunks; ++c) {
    chunk_steps.push_back(steps / chunks + (c < steps % chunks ? 1 : 0));
    for (int i = 0; i < chunk_steps.back(); ++i) step();
    engine.mark_time();
  }
  const TrainStats ts = engine.read_stats();  // waits for the timed steps
  TimedSteps t;
  t.sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  VIT_CHECK(std::isfinite(ts.loss_sum), "bench: the loss is not finite");
  const std::vector<double> marks = engine.take_marks();
  for (int c = 0; c < chunks; ++c)
    t.chunk_img_per_s.push_back(double(batch) * chunk_steps[size_t(c)] /
                                std::max(marks[size_t(c) + 1] - marks[size_t(c)], 1e-9));
  t.img_per_s = double(batch) * steps / t.sec;
  t.median_img_per_s = median_of(t.chunk_img_per_s);
  return t;
}

}  // namespace

BenchRun warm_up_and_time(Engine& engine, const std::function<void()>& step, int warmup, int steps,
                          int batch) {
  for (int i = 0; i < warmup; ++i) step();
  engine.read_stats();  // waits for the warm-up steps on the device
  const int64_t warmup_replays = engine.graph_stats().replays;
  Profile::reset();
  BenchRun run;
  run.timed = time_steps(engine, step, steps, batch);
  run.graph_replays = engine.graph_stats().replays - warmup_replays;
  return run;
}

std::string rate_list(const std::vector<double>& rates) {
  std::string list;
  for (double r : rates) list += fmt::format("{}{:.2f}", list.empty() ? "" : ",", r);
  return list;
}

}  // namespace vit
