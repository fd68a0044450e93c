// What a run leaves in its folder: args.yaml and classes.txt, summary.csv, log.jsonl, the plot,
// the weight files (always at the final training size, so eval and export work whatever size
// the curriculum trains at) and the training state for --resume. All written atomically.
#pragma once
#include <string>
#include <vector>

#include "io/plot.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/run_log.h"

namespace vit {

class RunOutputs {
 public:
  // Opens the logs of `dir` (a resumed run keeps its rows before `first_epoch` and rebuilds
  // its curves up to `first_step`). `data_meta`: what eval/export need to reproduce the input
  // pipeline and name the classes, stored in every weights file. An empty `dir` writes nothing
  // (the worker ranks of a data-parallel run: rank 0 writes).
  RunOutputs(std::string dir, const ModelConfig& final_cfg, Metadata data_meta, int64_t first_epoch,
             int64_t first_step, const std::string& plot_title);

  const std::string& dir() const { return dir_; }
  bool writes() const { return !dir_.empty(); }
  void write_run_files(const std::string& args_yaml, const std::vector<std::string>& classes);
  // <dir>/<name>: the engine's weights mapped to the final size, with the data metadata and
  // `extra` (epoch, metric).
  void save_weights(const std::string& name, Engine& engine, const ModelConfig& current,
                    const Metadata& extra);
  // <dir>/state.safetensors: weights, AdamW moments and `st` (whose step is set here).
  // state.safetensors, and kernels.json beside it (the plan as it stands: shapes first met
  // since the last save, tuned picks included).
  void save_state(Engine& engine, const ModelConfig& current, TrainState& st);
  // kernels.json: the engine's resolved kernel plan (ops/kernel_plan.h), which --resume replays.
  void write_kernel_plan(const Engine& engine);
  void write_plot();

  SummaryCsv summary;
  JsonlLog log;
  PlotData plot;

 private:
  std::string dir_;
  ModelConfig final_cfg_;
  ParamTable final_table_;
  Metadata data_meta_;
};

}  // namespace vit
