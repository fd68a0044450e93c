#include "train/run_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "data/source.h"

namespace vit {

namespace {

// The model a run trains: the preset, adapted to the data and the flags.
ModelConfig model_for_run(const TrainArgs& a, const data::DataSplits& d) {
  ModelConfig cfg = model_preset(a.model);
  if (a.img_size > 0) cfg.img_size = a.img_size;
  cfg.in_chans = int(d.train->channels());
  cfg.num_classes = a.num_classes > 0 ? a.num_classes : d.train->num_classes();
  VIT_CHECK(cfg.num_classes >= d.train->num_classes(),
            fmt::format("--num-classes {} is smaller than the {} classes in the data",
                        cfg.num_classes, d.train->num_classes()));
  if (!a.gp.empty()) cfg.classifier = classifier_from_string(a.gp);
  if (!a.ffn.empty()) cfg.ffn = ffn_from_string(a.ffn);
  if (!a.stem.empty()) cfg.stem = stem_from_string(a.stem);
  cfg.drop_path = a.drop_path;
  cfg.validate();
  return cfg;
}

}  // namespace

RunPlan plan_run(const TrainArgs& args, const data::DataSplits& data) {
  RunPlan p;
  p.final_cfg = model_for_run(args, data);
  const int F = p.final_size = p.final_cfg.img_size;
  const int P = p.patch = p.final_cfg.patch_size;
  const Index n_train = data.train->size();
  p.batch = args.batch_size;
  p.accum = args.grad_accum_steps;
  p.updates_per_epoch = n_train / (p.batch * p.accum);
  VIT_CHECK(p.updates_per_epoch > 0,
            fmt::format("batch size {} x {} accumulation steps exceeds the {} training images",
                        p.batch, p.accum, n_train));

  // Seed methods (methods.md §1.4, §2.3): which one, its schedule, the budget, the replay.
  p.efficienttrain = args.curriculum == "efficienttrain";
  p.size_curriculum = args.curriculum == "size";
  p.eval_size = args.eval_size > 0 ? args.eval_size : F;
  VIT_CHECK(p.eval_size % P == 0,
            fmt::format("--eval-size {} must be a multiple of the patch size {}", p.eval_size, P));
  p.size_step = args.size_step > 0 ? args.size_step : P;
  p.init_size = args.init_size > 0 ? args.init_size : p.size_step;
  if (p.size_curriculum) {
    VIT_CHECK(p.init_size <= F,
              fmt::format("--init-size {} is larger than the final size {}", p.init_size, F));
    (void)size_curriculum(0, p.init_size, p.size_step, args.size_every, F, P);  // validates
  }
  if (p.efficienttrain) {
    p.et = et_schedule(args.et_table, F, P);
    if (args.lowfreq == "fft")
      for (int b : p.et.sizes)
        VIT_CHECK(b % 2 == 0, fmt::format("--lowfreq fft needs even sizes; the efficienttrain "
                                          "schedule has {} (use --lowfreq downsample)",
                                          b));
  }
  if (!args.budget.empty()) {
    const double total = parse_duration_seconds(args.budget);
    p.budget = TimeBudget{total, std::min(0.05 * total, 60.0)};
  }
  p.replay = args.replay;
  p.max_samples = p.batch * p.replay;
  const double upe = double(p.updates_per_epoch);
  p.lr = LrSchedule{args.lr, args.min_lr, args.warmup_lr, args.warmup_epochs * upe,
                    double(args.epochs) * upe};
  return p;
}

int RunPlan::target_size(const TrainArgs& a, int64_t epoch, double fraction) const {
  if (efficienttrain) return et_size(et, fraction);
  if (size_curriculum) {
    const int e = budget ? int(std::floor(fraction * a.epochs)) : int(epoch);
    return vit::size_curriculum(e, init_size, size_step, a.size_every, final_size, patch);
  }
  return final_size;
}

double RunPlan::lr_at(const TrainArgs& a, int64_t step, double fraction) const {
  if (efficienttrain) return et_lr(fraction, a.lr, a.min_lr, a.warmup_lr, a.et_warmup);
  if (budget) return lr.at(fraction * double(a.epochs) * double(updates_per_epoch));
  return lr.at(double(step));
}

}  // namespace vit
