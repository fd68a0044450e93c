// The training batches of a run, as the model is fed them: the threaded loader, EfficientTrain++'s
// low-frequency crop from the final size, mixup/cutmix, and the replay buffer, at the current
// training size. The trainer asks for micro-batch `mb` of an epoch and gets host arrays.
#pragma once
#include <memory>
#include <vector>

#include "data/augment.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "train/replay.h"
#include "train/run_plan.h"
#include "train/train_args.h"

namespace vit {

class TrainBatches {
 public:
  // `step`: the optimizer step the run starts at (seeds the replay buffer). Data parallel:
  // this is rank `rank` of `world`, and it loads its 1/world share of each global batch.
  TrainBatches(const TrainArgs& args, const RunPlan& plan, const data::DataSplits& data,
               int img_size, int64_t step, int rank = 0, int world = 1);
  int workers() const { return loader_.workers(); }
  // A new training size; the replay buffer restarts, seeded by `step`.
  void set_size(int size, int64_t step);
  // EfficientTrain++'s RandAugment magnitude for the coming batches.
  void set_magnitude(double m);
  // Fills images() (n, Cin, S, S) and targets() (n, K) with micro-batch `mb` of `epoch`
  // (replayed samples included); returns n. `data_seconds` receives the time spent producing
  // the fresh samples (loading, cropping, mixing).
  Index load(int64_t epoch, Index mb, double* data_seconds);
  const float* images() const { return images_.data(); }
  const float* targets() const { return targets_.data(); }

  // With --augment-on-device: micro-batch `mb` as a plan (plan(), lut()) and targets(); returns
  // its sample count. The images are made where the model runs (Engine::forward_backward_planned).
  bool planned() const { return planned_; }
  Index load_planned(int64_t epoch, Index mb, double* data_seconds);
  const data::PlannedBatch& plan() const { return plan_batch_; }
  const std::vector<float>& lut() const { return lut_; }

 private:
  void load_fresh(int64_t epoch, Index mb, float* images, float* targets);
  void check_plannable(const data::Source& train) const;
  void make_replay(int64_t step);

  const TrainArgs& args_;
  const RunPlan& plan_;
  int rank_;                            // data parallel: this rank (its own replay draws)
  Index B_, cap_;                       // this rank's batch and samples per forward pass
  Index C_, K_, Kd_;                    // input channels, model classes, data classes
  int size_;                            // S
  data::BatchConfig train_bc_, et_bc_;  // et_bc_: ET++ makes batches at the final size
  data::MixupConfig mix_;
  data::Loader loader_;
  std::vector<float> images_, targets_;              // (B*R, Cin, S, S), (B*R, K)
  std::vector<float> full_images_;                   // ET++: (B, Cin, F, F)
  std::vector<float> fresh_images_, fresh_targets_;  // replay: the fresh batch
  std::unique_ptr<ReplayBuffer> replay_;
  bool planned_ = false;           // --augment-on-device
  data::PlannedBatch plan_batch_;  // the current planned micro-batch
  std::vector<float> lut_;         // (Cin, 256) normalisation table of the planned batches
};

}  // namespace vit
