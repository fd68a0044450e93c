// The NCCL communicator of GPU data parallelism (comm_nccl.cpp; built into the CUDA library
// where CMake finds NCCL).
#pragma once
#include <memory>

#include "dist/comm.h"
#include "dist/launch_env.h"

namespace vit {

// Joins the NCCL world of `env` (its local rank picks the device). Rank 0's unique id reaches
// the others through `bootstrap` (an MPI world of the same ranks) when given, else through the
// TCP meeting point at MASTER_ADDR:MASTER_PORT, bounded by `timeout_s` (also the collectives'
// timeout). Buffers may be device or host memory.
std::shared_ptr<Comm> make_nccl_comm(const LaunchEnv& env, Comm* bootstrap, double timeout_s);

}  // namespace vit
