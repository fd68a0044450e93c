#include "train/run_log.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/common.h"
#include "io/atomic_file.h"

namespace vit {

namespace fs = std::filesystem;

std::string make_run_dir(const std::string& output, const std::string& experiment,
                         const std::string& model, int img_size) {
  std::string name = experiment;
  if (name.empty()) {
    std::string safe = model;  // timm's safe_model_name
    for (char& c : safe)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
    name = fmt::format("{}-{}-{}", stamp, safe, img_size);
  } else if (name == "." || name == ".." || name.find('/') != std::string::npos) {
    throw Error(
        fmt::format("--experiment '{}': give a folder name, not a path (the folder is "
                    "created under --output)",
                    name));
  }
  std::error_code ec;
  fs::create_directories(output.empty() ? "." : output, ec);
  if (ec) throw Error(fmt::format("cannot create output folder '{}': {}", output, ec.message()));
  // create_directory reports "already existed" atomically, so two runs started in the same
  // second never share a folder.
  for (int i = 0;; ++i) {
    const std::string path =
        (fs::path(output) / (i == 0 ? name : fmt::format("{}-{}", name, i))).string();
    if (fs::create_directory(path, ec)) return path;
    if (ec) throw Error(fmt::format("cannot create run folder '{}': {}", path, ec.message()));
    if (i >= 100000) throw Error(fmt::format("cannot create run folder '{}': too many runs", path));
  }
}

SummaryCsv::SummaryCsv(std::string path, int64_t first_epoch) : path_(std::move(path)) {
  if (path_.empty()) return;  // in memory only
  std::ifstream in(path_);
  std::string line;
  if (in && std::getline(in, line)) {
    while (std::getline(in, line)) {
      SummaryRow r{};
      if (std::sscanf(line.c_str(), "%" SCNd64 ",%lf,%lf,%lf,%lf,%lf,%d,%lf,%lf,%lf,%lf", &r.epoch,
                      &r.train_loss, &r.eval_loss, &r.eval_top1, &r.eval_top5, &r.lr, &r.img_size,
                      &r.seconds, &r.img_per_s, &r.budget_s, &r.fraction) >= 9 &&
          r.epoch < first_epoch)
        rows_.push_back(r);
    }
  }
  rewrite();
}

void SummaryCsv::append(const SummaryRow& row) {
  // A row per epoch: an epoch evaluated again (a resumed run with more budget) replaces its row.
  while (!rows_.empty() && rows_.back().epoch >= row.epoch) rows_.pop_back();
  rows_.push_back(row);
  rewrite();
}

void SummaryCsv::rewrite() {
  if (path_.empty()) return;
  std::string s =
      "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,img_per_s,budget_s,"
      "fraction\n";
  for (const auto& r : rows_)
    s += fmt::format("{},{:.6f},{:.6f},{:.4f},{:.4f},{:.6e},{},{:.2f},{:.2f},{:.2f},{:.4f}\n",
                     r.epoch, r.train_loss, r.eval_loss, r.eval_top1, r.eval_top5, r.lr, r.img_size,
                     r.seconds, r.img_per_s, r.budget_s, r.fraction);
  io::write_file_atomic(path_, s);
}

JsonlLog::JsonlLog(std::string path) {
  if (path.empty()) return;  // writes nothing
  f_ = std::fopen(path.c_str(), "a+");
  if (!f_) throw Error(fmt::format("cannot open '{}' for writing", path));
  // "a+" reads from the start and writes at the end: look at the last byte.
  const bool cut_short = std::fseek(f_, -1, SEEK_END) == 0 && std::fgetc(f_) != '\n';
  std::fseek(f_, 0, SEEK_END);  // C requires a positioning call between reading and writing
  if (cut_short) {
    std::fputc('\n', f_);
    std::fflush(f_);
  }
}

JsonlLog::~JsonlLog() {
  if (f_) std::fclose(f_);
}

void JsonlLog::write(const nlohmann::json& j) {
  if (!f_) return;
  // nlohmann writes NaN/inf (a diverged loss) as null; invalid UTF-8 in strings is replaced.
  const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    throw Error("cannot write the training log (log.jsonl): disk full?");
}

namespace {
// h:mm:ss, e.g. 0:12:40 or 27:03:09 (negative and non-finite read as 0).
std::string eta_text(double seconds) {
  const long s = std::isfinite(seconds) && seconds > 0 ? long(seconds + 0.5) : 0;
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, int(s / 60 % 60), int(s % 60));
}
}  // namespace

std::string format_train_line(const TrainLine& l) {
  const double pct = l.updates_per_epoch > 0 ? 100.0 * l.update / l.updates_per_epoch : 0.0;
  std::string s = fmt::format(
      "Train: {} [{:>4d}/{} ({:>3.0f}%)]  Loss: {:#.3g} ({:#.3g})  Time: {:.3f}s, {:>7.2f}/s",
      l.epoch, l.update, l.updates_per_epoch, pct, l.loss, l.loss_avg, l.seconds_per_update,
      l.img_per_s);
  if (l.seconds_per_update_avg >= 0 && l.img_per_s_avg >= 0)
    s += fmt::format("  ({:.3f}s, {:>7.2f}/s)", l.seconds_per_update_avg, l.img_per_s_avg);
  s += fmt::format("  LR: {:.3e}", l.lr);
  if (l.data_s >= 0)
    s += l.data_s_avg >= 0 ? fmt::format("  Data: {:.3f} ({:.3f})", l.data_s, l.data_s_avg)
                           : fmt::format("  Data: {:.3f}", l.data_s);
  s += "  ETA: " + eta_text(l.eta_s);
  return s;
}

std::string format_eval_line(int64_t epoch, double loss, double top1, double top5,
                             const std::string& label) {
  return fmt::format("{}: {}  Loss: {:>7.4f}  Acc@1: {:>7.3f}  Acc@5: {:>7.3f}", label, epoch, loss,
                     top1, top5);
}

bool stdout_is_tty() {
  return isatty(STDOUT_FILENO) == 1;
}

std::string size_mark_label(int img_size) {
  return fmt::format("{}px", img_size);
}

void load_plot_from_jsonl(const std::string& path, PlotData& plot, int64_t max_step) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("step", int64_t(0)) > max_step) continue;
      const double t = j.value("elapsed_s", 0.0);
      if (j.value("type", "") == "train") {
        // A window whose updates were all skipped has no loss (null), as in the live plot.
        if (j.contains("loss_window") && j["loss_window"].is_number())
          plot.train_loss.push_back({t, j["loss_window"].get<double>()});
        plot.lr.push_back({t, j.value("lr", 0.0)});
      } else if (j.value("type", "") == "eval") {
        plot.eval_loss.push_back({t, j.value("eval_loss", 0.0)});
        plot.eval_top1.push_back({t, j.value("eval_top1", 0.0)});
      } else if (j.value("type", "") == "size") {
        plot.marks.push_back({t, size_mark_label(j.value("img_size", 0))});
      }
    } catch (const nlohmann::json::exception&) {
      continue;  // a line cut short by a kill, or one without the expected types
    }
  }
}

}  // namespace vit
