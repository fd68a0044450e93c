// How a job's rank 0 hands a blob (NCCL's unique id) to every rank: through MPI under mpirun,
// through the TCP exchange under torchrun / srun (tcp_exchange.h). The NCCL world and
// `vitrain launch-check` take the same path, so the launch check exercises the real one.
#pragma once
#include <string>

#include "dist/comm.h"
#include "dist/launch_env.h"

namespace vit {

// Rank 0's `blob` on every rank (the other ranks' `blob` is ignored). `mpi`: an MPI world of
// the same ranks, or nullptr for the TCP exchange. Bounded by `timeout_s` (0 = forever): past
// it, one error line naming this rank and what did not happen.
std::string share_from_rank0(const LaunchEnv& env, Comm* mpi, const std::string& blob,
                             double timeout_s);

// "mpi" or "tcp HOST:PORT": where share_from_rank0 meets the other ranks.
std::string bootstrap_route(const LaunchEnv& env, const Comm* mpi);

}  // namespace vit
