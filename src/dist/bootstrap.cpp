#include "dist/bootstrap.h"

#include <fmt/format.h>

#include "core/common.h"
#include "dist/tcp_exchange.h"

namespace vit {

std::string share_from_rank0(const LaunchEnv& env, Comm* mpi, const std::string& blob,
                             double timeout_s) {
  if (env.size <= 1) return blob;
  if (mpi && mpi->size() > 1) {
    VIT_CHECK(mpi->size() == env.size && mpi->rank() == env.rank,
              fmt::format("rank {}: the MPI world (rank {} of {}) is not the launcher's ({} ranks)",
                          env.rank, mpi->rank(), mpi->size(), env.size));
    mpi->set_timeout(timeout_s);  // the broadcast ends the rank past it (MPI's watchdog)
    return broadcast_string(*mpi, blob, 0);
  }
  return tcp_share_from_rank0(env, blob, timeout_s);
}

std::string bootstrap_route(const LaunchEnv& env, const Comm* mpi) {
  if (env.size <= 1) return "none";
  if (mpi && mpi->size() > 1) return "mpi";
  return fmt::format("tcp:{}:{}", env.master_addr, env.exchange_port);
}

}  // namespace vit
