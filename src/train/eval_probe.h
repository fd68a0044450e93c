// Timing a few evaluation batches, for the time budget's stop rule (train/budget.h): what the
// final evaluation costs is measured at the evaluation size, not guessed from training steps.
#pragma once
#include <vector>

#include "data/batch.h"
#include "data/source.h"
#include "train/engine.h"

namespace vit {

// Runs the first `batches` evaluation batches of `d` (at most all of them) on `model` as
// evaluate() does (load, then inference; in this process alone, whatever the data-parallel
// world) and returns each one's wall-clock seconds. The results are not kept.
std::vector<double> time_eval_batches(Engine& model, const data::Source& d,
                                      const data::BatchConfig& cfg, Index batch, int batches,
                                      int workers);

}  // namespace vit
