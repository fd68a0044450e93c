// The NCCL communicator of GPU data parallelism (comm_nccl.cpp; built into the CUDA library
// where CMake finds NCCL).
#pragma once
#include <memory>

#include "dist/comm.h"
#include "dist/launch_env.h"

namespace vit {

// Joins the NCCL world of `env`. Its local rank picks the device, first, before MPI or NCCL
// open a context; more local ranks than GPUs is an error unless NCCL_MULTI_RANK_GPU_ENABLE=1.
// Rank 0's unique id reaches the others through `bootstrap` (an MPI world of the same ranks)
// when given, else through MPI joined here under mpirun, else through the TCP exchange
// (dist/bootstrap.h). `timeout_s` bounds the exchange, NCCL's init and every collective.
// Buffers may be device or host memory.
std::shared_ptr<Comm> make_nccl_comm(const LaunchEnv& env, Comm* bootstrap, double timeout_s);

}  // namespace vit
