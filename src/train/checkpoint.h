// Model weights and training state on disk, both as safetensors written atomically.
//  * Weights file (last.safetensors, model_best.safetensors): every parameter under its timm key
//    as F32, plus __metadata__ {"format": "pt", "vitrain_model": <ModelConfig JSON>, ...}.
//  * Training state (state.safetensors): the weights file's content plus the AdamW moments
//    ("optimizer.exp_avg", "optimizer.exp_avg_sq", flat in parameter-table layout) and the loop
//    position, RNG seed and early-stopping counters in metadata. One file, so a kill can never
//    leave weights and optimizer state from different steps.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace vit {

std::string model_config_to_json(const ModelConfig& cfg);
ModelConfig model_config_from_json(const std::string& json);  // throws vit::Error

using Metadata = std::map<std::string, std::string>;

void save_weights(const std::string& path, const ModelConfig& cfg, const ParamTable& table,
                  const float* params, const Metadata& extra = {});

struct WeightsFile {
  ModelConfig cfg;
  std::vector<float> params;  // (table.total) in the table layout of cfg
  Metadata metadata;
};
// Reads a vitrain weights or state file; checks that every key of the model exists with the
// right shape and that nothing unexpected is present.
WeightsFile load_weights(const std::string& path);

struct TrainState {
  WeightsFile weights;
  std::vector<float> exp_avg, exp_avg_sq;  // (table.total)
  std::vector<float> ema;                  // (table.total) model EMA; empty without one
  int64_t step = 0;                        // optimizer updates done
  int64_t epoch = 0;                       // epoch to continue in
  int64_t update_in_epoch = 0;             // updates of that epoch already done
  double best_metric = -1;                 // best eval top-1 so far
  int64_t best_epoch = -1;
  int64_t bad_epochs = 0;       // epochs without improvement (early stopping)
  double elapsed_s = 0;         // training wall time so far
  double compute_consumed = 0;  // EfficientTrain++: final-size-equivalent images trained so far
  int64_t skipped_steps = 0;    // updates skipped for a non-finite loss or grad norm
  // Updates since the last evaluation: 0 when these weights were evaluated (a spent budget's
  // final evaluation, which --resume must not repeat); -1 unknown (states before 2026-11-26).
  int64_t updates_since_eval = -1;
  // The --budget (seconds) the run ended on; 0: not ended by a budget. --resume with the same
  // budget or a smaller one has nothing left to train (its time estimates start afresh).
  double spent_budget_s = 0;
  std::string args_yaml;  // the run's effective arguments
};

void save_train_state(const std::string& path, const ModelConfig& cfg, const ParamTable& table,
                      const float* params, const TrainState& state);
TrainState load_train_state(const std::string& path);

}  // namespace vit
