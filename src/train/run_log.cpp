#include "train/run_log.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
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
    std::string safe = model;
    for (char& c : safe)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
    name = fmt::format("{}-{}-{}", stamp, safe, img_size);
  }
  std::error_code ec;
  fs::create_directories(output, ec);
  if (ec) throw Error(fmt::format("cannot create output folder '{}': {}", output, ec.message()));
  std::string path = (fs::path(output) / name).string();
  for (int i = 1; fs::exists(path); ++i) path = (fs::path(output) / fmt::format("{}-{}", name, i)).string();
  if (!fs::create_directory(path, ec) || ec)
    throw Error(fmt::format("cannot create run folder '{}': {}", path, ec.message()));
  return path;
}

SummaryCsv::SummaryCsv(std::string path, int64_t first_epoch) : path_(std::move(path)) {
  std::ifstream in(path_);
  std::string line;
  if (in && std::getline(in, line)) {
    while (std::getline(in, line)) {
      SummaryRow r{};
      if (std::sscanf(line.c_str(), "%ld,%lf,%lf,%lf,%lf,%lf,%d,%lf,%lf", &r.epoch, &r.train_loss,
                      &r.eval_loss, &r.eval_top1, &r.eval_top5, &r.lr, &r.img_size, &r.seconds,
                      &r.img_per_s) == 9 &&
          r.epoch < first_epoch)
        rows_.push_back(r);
    }
  }
  rewrite();
}

void SummaryCsv::append(const SummaryRow& row) {
  rows_.push_back(row);
  rewrite();
}

void SummaryCsv::rewrite() {
  std::string s = "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,img_per_s\n";
  for (const auto& r : rows_)
    s += fmt::format("{},{:.6f},{:.6f},{:.4f},{:.4f},{:.6e},{},{:.2f},{:.2f}\n", r.epoch,
                     r.train_loss, r.eval_loss, r.eval_top1, r.eval_top5, r.lr, r.img_size,
                     r.seconds, r.img_per_s);
  io::write_file_atomic(path_, s);
}

JsonlLog::JsonlLog(std::string path) {
  f_ = std::fopen(path.c_str(), "a");
  if (!f_) throw Error(fmt::format("cannot open '{}' for writing", path));
}

JsonlLog::~JsonlLog() {
  if (f_) std::fclose(f_);
}

void JsonlLog::write(const nlohmann::json& j) {
  const std::string s = j.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fflush(f_);
}

std::string format_train_line(const TrainLine& l) {
  const long eta = long(std::max(0.0, l.eta_s));
  return fmt::format(
      "Train: {} [{:>4d}/{} ({:>3.0f}%)]  Loss: {:#.3g} ({:#.3g})  Time: {:.3f}s, {:>7.2f}/s  "
      "LR: {:.3e}  ETA: {}:{:02d}:{:02d}",
      l.epoch, l.update, l.updates_per_epoch, 100.0 * l.update / l.updates_per_epoch, l.loss,
      l.loss_avg, l.seconds_per_update, l.img_per_s, l.lr, eta / 3600, int(eta / 60 % 60),
      int(eta % 60));
}

std::string format_eval_line(int64_t epoch, double loss, double top1, double top5) {
  return fmt::format("Test: {}  Loss: {:>7.4f}  Acc@1: {:>7.3f}  Acc@5: {:>7.3f}", epoch, loss,
                     top1, top5);
}

bool stdout_is_tty() { return isatty(STDOUT_FILENO) == 1; }

void load_plot_from_jsonl(const std::string& path, PlotData& plot, int64_t max_step) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a line cut short by a kill
    }
    if (j.value("step", int64_t(0)) > max_step) continue;
    const double t = j.value("elapsed_s", 0.0);
    if (j.value("type", "") == "train") {
      plot.train_loss.push_back({t, j.value("loss_window", 0.0)});
      plot.lr.push_back({t, j.value("lr", 0.0)});
    } else if (j.value("type", "") == "eval") {
      plot.eval_loss.push_back({t, j.value("eval_loss", 0.0)});
      plot.eval_top1.push_back({t, j.value("eval_top1", 0.0)});
    }
  }
}

}  // namespace vit
