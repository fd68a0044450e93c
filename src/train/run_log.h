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

// Creates <output>/<YYYYmmdd-HHMMSS>-<model>-<img> (or <output>/<experiment>); a name that
// exists gets "-1", "-2", ... appended. Returns the path.
std::string make_run_dir(const std::string& output, const std::string& experiment,
                         const std::string& model, int img_size);

struct SummaryRow {
  int64_t epoch;
  double train_loss, eval_loss, eval_top1, eval_top5, lr;
  int img_size;
  double seconds, img_per_s;
};

// summary.csv: header `epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,
// img_per_s`, one row per evaluated epoch. Opening an existing file (a resumed run) keeps the
// rows of epochs before `first_epoch` and drops later ones, so rows are never duplicated.
class SummaryCsv {
 public:
  SummaryCsv(std::string path, int64_t first_epoch);
  void append(const SummaryRow& row);
  const std::vector<SummaryRow>& rows() const { return rows_; }

 private:
  void rewrite();
  std::string path_;
  std::vector<SummaryRow> rows_;
};

// log.jsonl: one JSON object per line, appended and flushed.
class JsonlLog {
 public:
  explicit JsonlLog(std::string path);
  ~JsonlLog();
  void write(const nlohmann::json& j);

 private:
  std::FILE* f_ = nullptr;
};

struct TrainLine {
  int64_t epoch, update, updates_per_epoch;
  double loss, loss_avg, seconds_per_update, img_per_s, lr, eta_s;
};
// timm's line plus ETA, e.g.
// "Train: 3 [ 200/1251 ( 16%)]  Loss: 5.12 (5.31)  Time: 0.182s, 1406.59/s  LR: 7.812e-04  ETA: 0:12:40"
std::string format_train_line(const TrainLine& l);
std::string format_eval_line(int64_t epoch, double loss, double top1, double top5);
bool stdout_is_tty();

// Refills the plot curves from a run's log.jsonl up to optimizer step `max_step` (resume).
void load_plot_from_jsonl(const std::string& path, PlotData& plot, int64_t max_step);

}  // namespace vit
