// `vitrain train`: the training loop with evaluation, logs, checkpoints, resume and early
// stopping.
#pragma once
#include <string>

#include "cli/train_args.h"

namespace vit {

// Runs a training as configured; returns the process exit code. Throws vit::Error on bad input.
int run_train(const TrainArgs& args);

}  // namespace vit
