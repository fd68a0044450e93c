// Input-size / augmentation curricula of the seed methods (pure functions, no state besides the
// compute counter). See docs/reference methods.md §1.4 (Borealis multi-size training) and §2.3
// (EfficientTrain++).
//
// Borealis size curriculum: size(e) = min(final, init + step * floor(e / every)), rounded down to a
// multiple of the patch size (at least one patch). Best 1-GPU config: init 32, step 32, every 5,
// final 224 -> 32, 64, 96, 128, 160, 192, 224 at epochs 0, 5, ..., 30.
//
// EfficientTrain++: 10 stages, each one tenth of the total compute, where the compute of one image
// at size B is (B / final)^2 of an image at the final size. The progress p in [0, 1] is
// compute spent / total compute (ComputeBudget). Stage s = min(9, floor(10 p)); input size
// sizes[s]; RandAugment magnitude m = s; LR is a timm cosine in p with linear warm-up over the
// first 20% of compute.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vit {

// Borealis multi-size schedule. Throws vit::Error on epoch < 0, init_size < 1, step < 0,
// every < 1, patch < 1 or final_size < patch.
int size_curriculum(int epoch, int init_size, int step, int every, int final_size, int patch);

struct EtSchedule {
  std::vector<int> sizes;  // 10 stage sizes (pixels), each a multiple of the patch size
  int final_size = 224;
};

// DeiT-S's table [96,96,160,160,160,160,192,192,224,224] for final 224; for another final size
// every entry becomes size * final / 224 rounded to the nearest multiple of patch (ties away from
// zero), at least one patch. final_size must be a positive multiple of patch.
EtSchedule et_schedule_deit(int final_size, int patch);
// The table named by --et-table: "deit" (above), "swin" [96x2, 160x4, 224x4] or "convnext"
// [160x6, 224x4] (the paper's tables for those models), scaled as above; or ten comma-separated
// sizes in pixels ("12,12,20,20,20,20,24,24,28,28"), each a multiple of patch and at most
// final_size, used as given. Throws vit::Error with a one-line message otherwise.
EtSchedule et_schedule(const std::string& table, int final_size, int patch);
bool is_named_et_table(const std::string& name);

// Stage index min(9, floor(10 p)); p >= 1 gives 9. Throws vit::Error for p < 0 or NaN.
int et_stage(double p);
// Input size of stage et_stage(p). Throws vit::Error unless the schedule has 10 sizes.
int et_size(const EtSchedule& s, double p);
// RandAugment magnitude m = min(9, floor(10 p)) (0..9).
int et_magnitude(double p);
// Compute of one image at `size` relative to one at `final_size`: (size / final_size)^2.
double et_compute_weight(int size, int final_size);

// LR at progress p with timm CosineLRScheduler semantics in p (t = p, t_initial = 1):
//   p <  warmup_frac: warmup_lr + p * (base - warmup_lr) / warmup_frac
//   p >= warmup_frac: min_lr + 0.5 * (base - min_lr) * (1 + cos(pi * p))   (not shifted by warm-up)
//   p >= 1:           min_lr
// warmup_frac = 0 disables warm-up. Throws vit::Error for p < 0 / NaN or warmup_frac outside [0,
// 1).
double et_lr(double p, double base, double min_lr, double warmup_lr, double warmup_frac = 0.2);

// Compute counter for ET++ progress. The budget is `equiv_epochs` epochs of `epoch_images` images
// at the final size; add() accumulates images * (size / final)^2.
struct ComputeBudget {
  double equiv_epochs = 0;   // total budget, in epochs at the final size (ET++ "--epoch" E)
  int64_t epoch_images = 0;  // images in one epoch (dataset size, or steps * batch)
  int final_size = 224;
  double consumed = 0;  // final-size-equivalent images spent so far (saved in checkpoints)

  ComputeBudget() = default;
  // Throws vit::Error unless equiv_epochs > 0, epoch_images > 0, final_size > 0.
  ComputeBudget(double equiv_epochs, int64_t epoch_images, int final_size);

  double total() const;                // equiv_epochs * epoch_images
  void add(int64_t images, int size);  // consumed += images * (size / final)^2
  double progress() const;             // p = consumed / total, clamped to [0, 1]
  bool done() const;                   // consumed >= total
};

}  // namespace vit
