// `vitrain launch-check`: whether a launcher's ranks find each other, without a GPU or data.
#pragma once

namespace vit {

// Each rank reads its launcher's environment, receives rank 0's random 128-byte id the way the
// NCCL world would (MPI under mpirun, the TCP exchange under torchrun / srun) and prints one
// line: rank, size, local rank, launcher, route and the id's hash. Exit 0 when the exchange
// worked; the lines of one job must agree on size and id and cover every rank once.
int run_launch_check(int argc, char** argv);

}  // namespace vit
