// The meeting point of a torchrun or srun job, which has no MPI: rank 0 hands a blob (NCCL's
// unique id) to every other rank over TCP at MASTER_ADDR, on LaunchEnv::exchange_port (never
// MASTER_PORT, which torchrun's agent store holds). Rank 0 listens; each
// other rank connects (retrying while rank 0 is not up yet) and says who it is; once all have
// come, rank 0 sends the blob to each. So it is also a barrier: it returns on every rank only
// when the whole job has started.
#pragma once
#include <string>

#include "dist/launch_env.h"

namespace vit {

// Returns rank 0's `blob` on every rank (other ranks' `blob` is ignored). Throws vit::Error
// with one line naming this rank, the address and what did not happen when `timeout_s` passes
// first: a rank that never connected (rank 0 lists them), rank 0 not reachable or silent (the
// others). Connections that do not speak this protocol are dropped.
std::string tcp_share_from_rank0(const LaunchEnv& env, const std::string& blob, double timeout_s);

}  // namespace vit
