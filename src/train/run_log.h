// Run folder and the logs a run writes: summary.csv (timm's columns + ours), log.jsonl, and the
// timm-style console lines.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/plot.h"

namespace vit {

// Creates <output>/<YYYYmmdd-HHMMSS>-<model>-<img> (or <output>/<experiment>), creating
// <output> too; the model name's non-alphanumeric characters become '_' (timm's
// safe_model_name); a name that exists gets "-1", "-2", ... appended. Returns the path.
std::string make_run_dir(const std::string& output, const std::string& experiment,
                         const std::string& model, int img_size);

struct SummaryRow {
  int64_t epoch;
  double train_loss, eval_loss, eval_top1, eval_top5, lr;
  int img_size;
  double seconds, img_per_s;
  double budget_s = 0;  // --budget in seconds (0 = none)
  double fraction = 0;  // fraction of the schedule done (epochs, budget or compute)
};

// summary.csv: header `epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,
// img_per_s,budget_s,fraction`, one row per evaluated epoch. Opening an existing file (a resumed
// run) keeps the rows of epochs before `first_epoch` and drops later ones, and a row replaces
// those of its epoch and later ones, so rows are never duplicated.
class SummaryCsv {
 public:
  SummaryCsv(std::string path, int64_t first_epoch);  // empty path: kept in memory only
  void append(const SummaryRow& row);
  const std::vector<SummaryRow>& rows() const { return rows_; }

 private:
  void rewrite();
  std::string path_;
  std::vector<SummaryRow> rows_;
};

// log.jsonl: one JSON object per line, appended and flushed. An existing file is appended to;
// a last line cut short by a kill is terminated first so the next object starts a fresh line.
class JsonlLog {
 public:
  explicit JsonlLog(std::string path);  // empty path: writes nothing
  ~JsonlLog();
  JsonlLog(const JsonlLog&) = delete;
  JsonlLog& operator=(const JsonlLog&) = delete;
  void write(const nlohmann::json& j);

 private:
  std::FILE* f_ = nullptr;
};

// One periodic training log line. The fields after eta_s are optional: a negative value (the
// default) leaves that part out of the line.
struct TrainLine {
  int64_t epoch, update, updates_per_epoch;
  double loss, loss_avg;                 // this window's / the epoch's running mean
  double seconds_per_update, img_per_s;  // over the last window
  double lr, eta_s;
  double seconds_per_update_avg = -1, img_per_s_avg = -1;  // over the epoch so far
  double data_s = -1, data_s_avg = -1;  // batch-assembly time per update: window / epoch
};
// timm's line with an ETA at the end, e.g.
// "Train: 3 [ 200/1251 ( 16%)]  Loss: 5.12 (5.31)  Time: 0.182s, 1406.59/s  (0.185s, 1383.78/s)
//  LR: 7.812e-04  Data: 0.004 (0.006)  ETA: 0:12:40" (one line).
std::string format_train_line(const TrainLine& l);
// "Test: 3  Loss:  0.4123  Acc@1:  85.310  Acc@5:  99.620" ("Test EMA: 3 ..." with that label)
std::string format_eval_line(int64_t epoch, double loss, double top1, double top5,
                             const std::string& label = "Test");
bool stdout_is_tty();

// The plot's mark at a change of image size: "160px".
std::string size_mark_label(int img_size);
// Refills the plot curves and marks from a run's log.jsonl up to optimizer step `max_step`
// (resume).
void load_plot_from_jsonl(const std::string& path, PlotData& plot, int64_t max_step);

}  // namespace vit
