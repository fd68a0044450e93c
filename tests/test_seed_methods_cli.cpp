// End-to-end tests of the seed methods in `vitrain train` on a small generated IDX data set:
// the wall-clock budget (--budget), the Borealis size curriculum (--curriculum size, with a
// bitwise resume mid-curriculum), EfficientTrain++ (--curriculum efficienttrain, both
// --lowfreq modes) and the replay buffer (--replay).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "train/checkpoint.h"
#include "train/curriculum.h"

namespace fs = std::filesystem;
using vit::testing::run_vitrain;
using vit::testing::RunResult;

namespace {

class SeedMethodsCli : public vit::testing::CliTest {
 protected:
  std::string train_flags(const std::string& experiment, const std::string& extra) {
    return "train --data-dir " + data_ + " --model vit_fmnist_tiny --output " +
           (dir_ / "out").string() + " --experiment " + experiment +
           " -b 32 --lr 2e-3 --warmup-epochs 1 --log-interval 1 -j 2 --seed 5 " +
           "--drop-path 0.1 --hflip 0 --crop-pad 0 " + extra;
  }
  std::vector<nlohmann::json> log(const std::string& experiment, const std::string& type) {
    return vit::testing::read_log(dir_ / "out" / experiment, type);
  }
  // summary.csv rows as column name -> text.
  std::vector<std::map<std::string, std::string>> summary(const std::string& experiment) {
    std::ifstream f(dir_ / "out" / experiment / "summary.csv");
    std::string line;
    std::vector<std::string> cols;
    std::vector<std::map<std::string, std::string>> rows;
    auto split = [](const std::string& s) {
      std::vector<std::string> v;
      std::stringstream ss(s);
      std::string c;
      while (std::getline(ss, c, ',')) v.push_back(c);
      return v;
    };
    if (std::getline(f, line)) cols = split(line);
    while (std::getline(f, line)) {
      const auto v = split(line);
      std::map<std::string, std::string> r;
      for (size_t i = 0; i < cols.size() && i < v.size(); ++i) r[cols[i]] = v[i];
      rows.push_back(r);
    }
    return rows;
  }
  int64_t last_step(const std::string& experiment) {
    const auto t = log(experiment, "train");
    return t.empty() ? 0 : t.back().at("step").get<int64_t>();
  }
};

TEST_F(SeedMethodsCli, BudgetRunEndsInsideItsBudgetWithAnEvaluation) {
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r =
      run_vitrain(train_flags("budget", "--img-size 16 --epochs 3 --budget 20s"), dir_.string());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Budget: stopped"), std::string::npos) << r.out;
  const auto rows = summary("budget");
  ASSERT_FALSE(rows.empty());
  const auto& last = rows.back();
  EXPECT_DOUBLE_EQ(std::stod(last.at("budget_s")), 20.0);
  EXPECT_LE(std::stod(last.at("seconds")), 20.0);  // the recorded elapsed time
  EXPECT_GT(std::stod(last.at("fraction")), 0.0);  // (how much is used depends on the load)
  EXPECT_GE(std::stod(last.at("eval_top1")), 0.0);
  std::printf("budget run: wall %.1fs, recorded %.1fs, %zu eval rows, %lld updates\n", wall,
              std::stod(last.at("seconds")), rows.size(), (long long)last_step("budget"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "budget" / "last.safetensors"));
  const auto evals = log("budget", "eval");
  ASSERT_FALSE(evals.empty());
  EXPECT_DOUBLE_EQ(evals.back().at("budget_s").get<double>(), 20.0);
  // Resumed with its budget spent (the same one, or a shorter one), the run trains and
  // evaluates nothing more: the state knows its weights had their final evaluation.
  const int64_t steps = last_step("budget");
  const std::string resume = "train --resume " + (dir_ / "out" / "budget").string();
  for (const std::string extra : {"", " --budget 10s"}) {
    const RunResult again = run_vitrain(resume + extra, dir_.string());
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_NE(again.out.find("Budget: stopped"), std::string::npos) << again.out;
    EXPECT_EQ(summary("budget").size(), rows.size()) << extra;
    EXPECT_EQ(log("budget", "eval").size(), evals.size()) << extra;
    EXPECT_EQ(last_step("budget"), steps) << extra;
  }
  // With more budget it trains on, and summary.csv still has one row per epoch.
  const RunResult more = run_vitrain(resume + " --budget 26s", dir_.string());
  ASSERT_EQ(more.exit_code, 0) << more.err;
  EXPECT_GT(last_step("budget"), steps);
  const auto after = summary("budget");
  for (size_t i = 1; i < after.size(); ++i)
    EXPECT_LT(std::stoll(after[i - 1].at("epoch")), std::stoll(after[i].at("epoch")));
  EXPECT_LE(std::stod(after.back().at("seconds")), 26.0);
}

TEST_F(SeedMethodsCli, SizeCurriculumChangesSizeAndResumesBitwise) {
  // 8 -> 12 -> 16 px (patch 4), one size per epoch, final size 16.
  const std::string flags =
      "--img-size 16 --epochs 3 --curriculum size --init-size 8 "
      "--size-step 4 --size-every 1";
  ASSERT_EQ(run_vitrain(train_flags("straight", flags), dir_.string()).exit_code, 0);
  const auto rows = summary("straight");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].at("img_size"), "8");
  EXPECT_EQ(rows[1].at("img_size"), "12");
  EXPECT_EQ(rows[2].at("img_size"), "16");
  // The model is initialised at the final size and resampled to each curriculum size.
  std::vector<int> resized;
  for (const auto& j : log("straight", "size")) resized.push_back(j.at("img_size").get<int>());
  EXPECT_EQ(resized, (std::vector<int>{8, 12, 16}));
  // The weight files are at the final size.
  const vit::WeightsFile w =
      vit::load_weights((dir_ / "out" / "straight" / "last.safetensors").string());
  EXPECT_EQ(w.cfg.img_size, 16);
  // Interrupted mid-epoch-1 (training at 12 px), then resumed: bitwise identical losses.
  const RunResult a =
      run_vitrain(train_flags("split", flags + " --stop-after-updates 21"), dir_.string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const vit::TrainState st =
      vit::load_train_state((dir_ / "out" / "split" / "state.safetensors").string());
  EXPECT_EQ(st.weights.cfg.img_size, 12);
  const RunResult b =
      run_vitrain("train --resume " + (dir_ / "out" / "split").string(), dir_.string());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  std::map<int64_t, double> ref, got;
  for (const auto& j : log("straight", "train")) ref[j.at("step")] = j.at("loss").get<double>();
  for (const auto& j : log("split", "train")) got[j.at("step")] = j.at("loss").get<double>();
  ASSERT_EQ(ref.size(), 48u);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [step, loss] : ref) EXPECT_EQ(got.at(step), loss) << "step " << step;
  const auto rows2 = summary("split");
  ASSERT_EQ(rows2.size(), 3u);
  EXPECT_EQ(rows2[2].at("eval_top1"), rows[2].at("eval_top1"));
}

TEST_F(SeedMethodsCli, EfficientTrainMakesMoreCheaperUpdatesFollowingTheTable) {
  const std::string base = "--img-size 32 --epochs 2";
  ASSERT_EQ(run_vitrain(train_flags("plain", base), dir_.string()).exit_code, 0);
  const int64_t plain_updates = last_step("plain");
  EXPECT_EQ(plain_updates, 32);
  const vit::EtSchedule sched = vit::et_schedule_deit(32, 4);
  for (const std::string mode : {"fft", "downsample"}) {
    const std::string exp = "et_" + mode;
    const RunResult r = run_vitrain(
        train_flags(exp, base + " --curriculum efficienttrain --lowfreq " + mode), dir_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("Compute budget spent"), std::string::npos) << r.out;
    EXPECT_GT(last_step(exp), plain_updates) << mode;
    std::set<int> sizes;
    int last_stage = -1;
    for (const auto& j : log(exp, "train")) {
      const int stage = j.at("stage"), size = j.at("img_size");
      ASSERT_GE(stage, 0);
      ASSERT_LT(stage, 10);
      EXPECT_EQ(size, sched.sizes[size_t(stage)]) << mode << " step " << j.at("step");
      EXPECT_EQ(j.at("magnitude").get<int>(), stage);
      EXPECT_GE(stage, last_stage);
      last_stage = stage;
      sizes.insert(size);
    }
    EXPECT_EQ(last_stage, 9);
    EXPECT_EQ(sizes, (std::set<int>{12, 24, 28, 32})) << mode;
    const auto rows = summary(exp);
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(rows.back().at("img_size"), "32");
    const vit::WeightsFile w =
        vit::load_weights((dir_ / "out" / exp / "last.safetensors").string());
    EXPECT_EQ(w.cfg.img_size, 32);
    std::printf("efficienttrain %s: %lld updates vs %lld plain\n", mode.c_str(),
                (long long)last_step(exp), (long long)plain_updates);
  }
}

TEST_F(SeedMethodsCli, EfficientTrainTakesAnExplicitTableAndWarmup) {
  const RunResult r =
      run_vitrain(train_flags("et_table",
                              "--img-size 32 --epochs 2 --curriculum efficienttrain --et-table "
                              "16,16,16,16,16,24,24,32,32,32 --et-warmup 0"),
                  dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<int> table = {16, 16, 16, 16, 16, 24, 24, 32, 32, 32};
  std::set<int> sizes;
  const auto train = log("et_table", "train");
  ASSERT_FALSE(train.empty());
  for (const auto& j : train) {
    EXPECT_EQ(j.at("img_size").get<int>(), table[j.at("stage").get<size_t>()]);
    sizes.insert(j.at("img_size").get<int>());
  }
  EXPECT_EQ(sizes, (std::set<int>{16, 24, 32}));
  // No warm-up: the first update already runs at (nearly) the base LR of the cosine.
  EXPECT_GT(train.front().at("lr").get<double>(), 0.99 * 2e-3);
  // A bad table is a one-line error before training.
  const RunResult bad = run_vitrain(
      train_flags("et_bad", "--img-size 32 --curriculum efficienttrain --et-table 16,20"),
      dir_.string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--et-table"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find('\n'), bad.err.size() - 1) << bad.err;
}

TEST_F(SeedMethodsCli, ReplayTrainsEachFreshBatchSeveralTimes) {
  const RunResult r =
      run_vitrain(train_flags("replay", "--img-size 8 --epochs 1 --replay 2"), dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(last_step("replay"), 16);
  EXPECT_EQ(summary("replay").size(), 1u);
}

TEST_F(SeedMethodsCli, BadSeedFlagsAreOneLineErrors) {
  for (const std::string bad : {"--curriculum size --init-size 64 --img-size 16",
                                "--eval-size 10 --img-size 16", "--budget 3x"}) {
    const RunResult r = run_vitrain(train_flags("bad", bad), dir_.string());
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_FALSE(r.err.empty()) << bad;
  }
}

}  // namespace
