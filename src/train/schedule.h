// Learning-rate schedule: linear warmup then cosine, timm's CosineLRScheduler semantics stepped
// per update (--sched-on-updates): t = update index (0-based, the first update uses t = 0),
//   t <  warmup:  lr = warmup_lr + t * (base - warmup_lr) / warmup
//   t >= warmup:  lr = min_lr + 0.5 * (base - min_lr) * (1 + cos(pi * t / total))
//   t >= total:   lr = min_lr
// warmup and total are in updates (epochs * updates_per_epoch). The same function works on a
// fraction of a budget: pass t and total in any common unit.
#pragma once
#include <cstdint>

namespace vit {

struct LrSchedule {
  double base_lr = 5e-4;
  double min_lr = 1e-5;
  double warmup_lr = 1e-6;
  double warmup = 0;  // warmup length, same unit as t
  double total = 1;   // schedule length (t_initial), same unit as t
  double at(double t) const;
};

// Model EMA decay for the update numbered `step` (1 for the first), timm's ModelEmaV3.get_decay
// with update_after_step 0, min_decay 0, gamma 1, power 2/3: the first update copies the weights
// (decay 0); then `decay`, or with warm-up min(decay, 1 - (1 + (step - 1))^(-2/3)).
double ema_decay(int64_t step, double decay, bool warmup);

// The share of a model EMA that is still the weights after the first update once `steps`
// updates ran: the product of ema_decay over updates 2..steps (decay^(steps - 1) without
// warm-up). Above one half the EMA's evaluation shows those early weights more than the run's.
double ema_first_share(int64_t steps, double decay, bool warmup);

}  // namespace vit
