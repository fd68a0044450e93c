// The run plan: what a training run will do, derived from its options and its data before any
// model exists. The model at its final size, batches and updates per epoch, the seed method
// (size curriculum or EfficientTrain++) with its schedule, the time budget, the replay factor
// and the learning-rate schedule; plus the rules that map progress to an image size and a
// learning rate. Every inconsistency of the flags is reported here, as one clear error.
#pragma once
#include <optional>

#include "data/dataset.h"
#include "model/config.h"
#include "train/budget.h"
#include "train/curriculum.h"
#include "train/schedule.h"
#include "train/train_args.h"

namespace vit {

struct RunPlan {
  ModelConfig final_cfg;  // the model at the final training size
  int final_size = 0;     // F
  int patch = 0;          // P
  int eval_size = 0;
  Index batch = 0;              // B: fresh samples per micro-batch
  Index accum = 1;              // micro-batches per update
  Index updates_per_epoch = 0;  // drop-last
  int replay = 1;               // R: replays per fresh batch
  Index max_samples = 0;        // B * R: samples per forward pass
  bool size_curriculum = false, efficienttrain = false;
  int init_size = 0, size_step = 0;  // size curriculum
  EtSchedule et;                     // EfficientTrain++
  std::optional<TimeBudget> budget;
  LrSchedule lr;
  // Stops on compute (ET++) or time (budget), not after --epochs.
  bool open_ended() const { return efficienttrain || budget.has_value(); }
  // The image size to train at in `epoch`, at `fraction` of the schedule.
  int target_size(const TrainArgs& a, int64_t epoch, double fraction) const;
  // The learning rate at optimizer step `step`, at `fraction` of the schedule.
  double lr_at(const TrainArgs& a, int64_t step, double fraction) const;
};

RunPlan plan_run(const TrainArgs& args, const data::DataSplits& data);

}  // namespace vit
