// `vitrain bench-data`: images/s of the training input pipeline (decode + RandomResizedCrop +
// flip + the augmentation flags + normalise into (B, 3, S, S) batches) on an ImageFolder root or
// a prepared folder; with --device, into that device's model input as training makes it.
#pragma once

namespace vit {

int run_bench_data(int argc, char** argv);  // argv[0] is the subcommand name

}  // namespace vit
