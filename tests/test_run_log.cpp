// Run folder naming and collisions, summary.csv (header, rows, resume truncation), log.jsonl
// (one parseable object per line, survives a cut-short line), and the console line formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/common.h"
#include "temp_dir.h"
#include "train/run_log.h"

namespace fs = std::filesystem;

namespace {

class RunLog : public ::testing::Test {
 protected:
  vit::testing::TempDir tmp_;
  fs::path dir_ = tmp_.path;
};

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

vit::SummaryRow row(int64_t epoch) {
  return {epoch, 2.0 - 0.1 * double(epoch), 1.5,   70.0 + double(epoch), 95.5, 1e-3,
          28,    12.5 * double(epoch + 1),  1234.5};
}

TEST_F(RunLog, RunDirIsTimmNamed) {
  const fs::path out = dir_ / "out" / "train";  // created, parents too
  const std::string run = vit::make_run_dir(out.string(), "", "vit-tiny/patch4.28", 28);
  EXPECT_TRUE(fs::is_directory(run));
  EXPECT_EQ(fs::path(run).parent_path(), out);
  const std::string name = fs::path(run).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(\d{8}-\d{6}-vit_tiny_patch4_28-28)"))) << name;
}

TEST_F(RunLog, ExperimentNameAndCollisions) {
  const std::string out = (dir_ / "out").string();
  const std::string a = vit::make_run_dir(out, "exp", "m", 28);
  const std::string b = vit::make_run_dir(out, "exp", "m", 28);
  const std::string c = vit::make_run_dir(out, "exp", "m", 28);
  EXPECT_EQ(a, (fs::path(out) / "exp").string());
  EXPECT_EQ(b, (fs::path(out) / "exp-1").string());
  EXPECT_EQ(c, (fs::path(out) / "exp-2").string());
  for (const auto& p : {a, b, c}) EXPECT_TRUE(fs::is_directory(p));
  // Two unnamed runs in the same second get different folders as well.
  const std::string d = vit::make_run_dir(out, "", "m", 28);
  const std::string e = vit::make_run_dir(out, "", "m", 28);
  EXPECT_NE(d, e);
  EXPECT_THROW(vit::make_run_dir(out, "a/b", "m", 28), vit::Error);
  EXPECT_THROW(vit::make_run_dir(out, "..", "m", 28), vit::Error);
  // An output path that is a file cannot hold run folders.
  std::ofstream(dir_ / "file") << "x";
  EXPECT_THROW(vit::make_run_dir((dir_ / "file").string(), "exp", "m", 28), vit::Error);
}

TEST_F(RunLog, SummaryCsvHeaderAndRows) {
  const fs::path p = dir_ / "summary.csv";
  {
    vit::SummaryCsv csv(p.string(), 0);
    auto l = lines_of(p);
    ASSERT_EQ(l.size(), 1u);  // the header is there before the first row
    EXPECT_EQ(l[0],
              "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,img_per_s,budget_"
              "s,fraction");
    csv.append(row(0));
    csv.append(row(1));
    EXPECT_EQ(csv.rows().size(), 2u);
  }
  const auto l = lines_of(p);
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0],
            "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,img_per_s,budget_s,"
            "fraction");
  EXPECT_EQ(l[1], "0,2.000000,1.500000,70.0000,95.5000,1.000000e-03,28,12.50,1234.50,0.00,0.0000");
  EXPECT_EQ(l[2].substr(0, 2), "1,");
  for (const auto& line : l) EXPECT_EQ(std::count(line.begin(), line.end(), ','), 10) << line;
}

TEST_F(RunLog, SummaryCsvResumeDropsLaterEpochs) {
  const fs::path p = dir_ / "summary.csv";
  {
    vit::SummaryCsv csv(p.string(), 0);
    for (int e = 0; e < 4; ++e) csv.append(row(e));
  }
  ASSERT_EQ(lines_of(p).size(), 5u);
  {
    vit::SummaryCsv csv(p.string(), 2);  // resumed at epoch 2: epochs 2 and 3 are redone
    ASSERT_EQ(csv.rows().size(), 2u);
    EXPECT_EQ(csv.rows()[1].epoch, 1);
    EXPECT_DOUBLE_EQ(csv.rows()[1].eval_top1, 71.0);
    EXPECT_EQ(lines_of(p).size(), 3u);  // rewritten at once
    csv.append(row(2));
  }
  const auto l = lines_of(p);
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0].substr(0, 6), "epoch,");
  for (int e = 0; e < 3; ++e) EXPECT_EQ(l[size_t(e) + 1].substr(0, 2), std::to_string(e) + ",");
  // No temp files are left beside it.
  int files = 0;
  for (const auto& f : fs::directory_iterator(dir_)) files += f.is_regular_file();
  EXPECT_EQ(files, 1);
}

// An epoch evaluated again (a run resumed with more budget) replaces its row.
TEST_F(RunLog, SummaryCsvRowReplacesItsEpochs) {
  const fs::path p = dir_ / "summary.csv";
  vit::SummaryCsv csv(p.string(), 0);
  for (int e = 0; e < 3; ++e) csv.append(row(e));
  vit::SummaryRow again = row(2);
  again.eval_top1 = 99.0;
  csv.append(again);
  ASSERT_EQ(csv.rows().size(), 3u);
  EXPECT_DOUBLE_EQ(csv.rows()[2].eval_top1, 99.0);
  EXPECT_EQ(lines_of(p).size(), 4u);
}

TEST_F(RunLog, JsonlLinesParse) {
  const fs::path p = dir_ / "log.jsonl";
  {
    vit::JsonlLog log(p.string());
    log.write({{"type", "train"}, {"step", 1}, {"loss", 2.5}});
    log.write({{"type", "eval"}, {"step", 2}, {"eval_top1", 80.25}, {"nan", std::nan("")}});
    EXPECT_EQ(lines_of(p).size(), 2u);  // flushed as written
  }
  // A line cut short by a kill: the next object still starts on its own line.
  { std::ofstream(p, std::ios::app) << R"({"type": "train", "st)"; }
  {
    vit::JsonlLog log(p.string());
    log.write({{"type", "train"}, {"step", 3}, {"loss", 1.0}});
  }
  const auto l = lines_of(p);
  ASSERT_EQ(l.size(), 4u);
  auto j0 = nlohmann::json::parse(l[0]);
  EXPECT_EQ(j0["type"], "train");
  EXPECT_DOUBLE_EQ(j0["loss"].get<double>(), 2.5);
  auto j1 = nlohmann::json::parse(l[1]);
  EXPECT_DOUBLE_EQ(j1["eval_top1"].get<double>(), 80.25);
  EXPECT_TRUE(j1["nan"].is_null());
  EXPECT_THROW(
      {
        auto bad = nlohmann::json::parse(l[2]);
        (void)bad;
      },
      nlohmann::json::exception);
  EXPECT_EQ(nlohmann::json::parse(l[3])["step"], 3);
}

TEST_F(RunLog, PlotCurvesReloadFromJsonl) {
  const fs::path p = dir_ / "log.jsonl";
  {
    vit::JsonlLog log(p.string());
    for (int s = 1; s <= 4; ++s)
      log.write({{"type", "train"},
                 {"step", s},
                 {"loss_window", 3.0 - s},
                 {"lr", 1e-3 * s},
                 {"elapsed_s", 10.0 * s}});
    log.write({{"type", "eval"},
               {"step", 2},
               {"eval_loss", 1.25},
               {"eval_top1", 60.5},
               {"elapsed_s", 21.0}});
    log.write({{"type", "eval"},
               {"step", 4},
               {"eval_loss", 1.0},
               {"eval_top1", 70.5},
               {"elapsed_s", 41.0}});
  }
  vit::PlotData plot;
  vit::load_plot_from_jsonl(p.string(), plot, 2);  // resumed at step 2: later lines are redone
  ASSERT_EQ(plot.train_loss.size(), 2u);
  EXPECT_DOUBLE_EQ(plot.train_loss[1].t, 20.0);
  EXPECT_DOUBLE_EQ(plot.train_loss[1].v, 1.0);
  ASSERT_EQ(plot.lr.size(), 2u);
  ASSERT_EQ(plot.eval_top1.size(), 1u);
  EXPECT_DOUBLE_EQ(plot.eval_top1[0].v, 60.5);
  EXPECT_DOUBLE_EQ(plot.eval_loss[0].v, 1.25);
}

TEST(RunLogFormat, TrainLineIsTimms) {
  vit::TrainLine l{3, 200, 1251, 5.12, 5.31, 0.182, 1406.59, 7.812e-4, 760.0};
  EXPECT_EQ(vit::format_train_line(l),
            "Train: 3 [ 200/1251 ( 16%)]  Loss: 5.12 (5.31)  Time: 0.182s, 1406.59/s  "
            "LR: 7.812e-04  ETA: 0:12:40");
  l.seconds_per_update_avg = 0.185;
  l.img_per_s_avg = 1383.78;
  l.data_s = 0.004;
  l.data_s_avg = 0.006;
  EXPECT_EQ(vit::format_train_line(l),
            "Train: 3 [ 200/1251 ( 16%)]  Loss: 5.12 (5.31)  Time: 0.182s, 1406.59/s  "
            "(0.185s, 1383.78/s)  LR: 7.812e-04  Data: 0.004 (0.006)  ETA: 0:12:40");
  // Last batch, small numbers, long ETA; an empty epoch does not divide by zero.
  const vit::TrainLine m{0, 469, 469, 0.4, 0.41, 0.05, 2560.0, 1e-5, 3.0 * 3600 + 61};
  EXPECT_EQ(vit::format_train_line(m),
            "Train: 0 [ 469/469 (100%)]  Loss: 0.400 (0.410)  Time: 0.050s, 2560.00/s  "
            "LR: 1.000e-05  ETA: 3:01:01");
  const vit::TrainLine z{0, 0, 0, 1, 1, 0, 0, 0, -5};
  EXPECT_NE(vit::format_train_line(z).find("(  0%)"), std::string::npos);
  EXPECT_NE(vit::format_train_line(z).find("ETA: 0:00:00"), std::string::npos);
}

TEST(RunLogFormat, EvalLine) {
  EXPECT_EQ(vit::format_eval_line(3, 0.41234, 85.31, 99.62),
            "Test: 3  Loss:  0.4123  Acc@1:  85.310  Acc@5:  99.620");
  (void)vit::stdout_is_tty();  // callable; the answer depends on how the test is run
}

}  // namespace
