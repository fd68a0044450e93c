// `vitrain train`: the training loop with evaluation, logs, checkpoints, resume and early
// stopping.
#pragma once
#include <string>

#include "train/train_args.h"

namespace vit {

// Runs a training as configured; returns the process exit code. Throws vit::Error on bad input.
// `args_yaml` is the effective configuration as the CLI dumps it (written as args.yaml and kept
// in the training state, so --resume can rebuild the run).
int run_train(const TrainArgs& args, const std::string& args_yaml);

}  // namespace vit
