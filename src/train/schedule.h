// Learning-rate schedule: linear warmup then cosine, timm's CosineLRScheduler semantics stepped
// per update (--sched-on-updates): t = update index (0-based, the first update uses t = 0),
//   t <  warmup:  lr = warmup_lr + t * (base - warmup_lr) / warmup
//   t >= warmup:  lr = min_lr + 0.5 * (base - min_lr) * (1 + cos(pi * t / total))
//   t >= total:   lr = min_lr
// warmup and total are in updates (epochs * updates_per_epoch). The same function works on a
// fraction of a budget: pass t and total in any common unit.
#pragma once

namespace vit {

struct LrSchedule {
  double base_lr = 5e-4;
  double min_lr = 1e-5;
  double warmup_lr = 1e-6;
  double warmup = 0;  // warmup length, same unit as t
  double total = 1;   // schedule length (t_initial), same unit as t
  double at(double t) const;
};

}  // namespace vit
