#include "dist/launch_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "core/common.h"

namespace vit {

namespace {

// The variables, from the map or the process environment.
class Env {
 public:
  explicit Env(const std::map<std::string, std::string>* m) : m_(m) {}
  const char* get(const char* name) const {
    if (!m_) return std::getenv(name);
    auto it = m_->find(name);
    return it == m_->end() ? nullptr : it->second.c_str();
  }
  bool has(const char* name) const { return get(name) != nullptr; }
  // A non-negative integer variable; `required` ones must be present.
  int integer(const char* name, bool required, int fallback = 0) const {
    const char* v = get(name);
    if (!v) {
      VIT_CHECK(!required, fmt::format("launcher environment: {} is not set", name));
      return fallback;
    }
    errno = 0;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    VIT_CHECK(end != v && *end == '\0' && errno == 0 && x >= 0 && x <= INT_MAX,
              fmt::format("launcher environment: {}='{}' is not a non-negative integer", name, v));
    return int(x);
  }

 private:
  const std::map<std::string, std::string>* m_;
};

void check_ranks(const LaunchEnv& e, const char* rank_var, const char* size_var) {
  VIT_CHECK(e.size >= 1, fmt::format("launcher environment: {} must be at least 1", size_var));
  VIT_CHECK(e.rank < e.size, fmt::format("launcher environment: {}={} is not below {}={}", rank_var,
                                         e.rank, size_var, e.size));
}

void read_master(LaunchEnv& e, const Env& env) {
  if (e.size == 1) return;  // a world of one meets nobody
  const char* addr = env.get("MASTER_ADDR");
  VIT_CHECK(addr && *addr,
            fmt::format("launcher environment ({}): MASTER_ADDR is not set (the host of rank 0, "
                        "where the ranks meet)",
                        launcher_name(e.launcher)));
  e.master_addr = addr;
  e.master_port = env.integer("MASTER_PORT", true);
  VIT_CHECK(
      e.master_port >= 1 && e.master_port <= 65535,
      fmt::format("launcher environment: MASTER_PORT={} is not a port (1-65535)", e.master_port));
  e.exchange_port = e.master_port < 65535 ? e.master_port + 1 : e.master_port - 1;
  e.exchange_port = env.integer("VIT_EXCHANGE_PORT", false, e.exchange_port);
  VIT_CHECK(e.exchange_port >= 1 && e.exchange_port <= 65535 && e.exchange_port != e.master_port,
            fmt::format("launcher environment: VIT_EXCHANGE_PORT={} is not a port (1-65535) "
                        "other than MASTER_PORT",
                        e.exchange_port));
}

}  // namespace

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::Mpi:
      return "mpirun";
    case Launcher::Torchrun:
      return "torchrun";
    case Launcher::Slurm:
      return "srun";
    case Launcher::None:
      break;
  }
  return "none";
}

LaunchEnv read_launch_env(const std::map<std::string, std::string>* vars) {
  const Env env(vars);
  LaunchEnv e;
  if (env.has("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = Launcher::Mpi;
    e.size = env.integer("OMPI_COMM_WORLD_SIZE", true);
    e.rank = env.integer("OMPI_COMM_WORLD_RANK", true);
    e.local_rank = env.integer("OMPI_COMM_WORLD_LOCAL_RANK", false, e.rank);
    e.local_size = env.integer("OMPI_COMM_WORLD_LOCAL_SIZE", false, 0);
    check_ranks(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  } else if (env.has("WORLD_SIZE")) {
    e.launcher = Launcher::Torchrun;
    e.size = env.integer("WORLD_SIZE", true);
    e.rank = env.integer("RANK", true);
    e.local_rank = env.integer("LOCAL_RANK", false, e.rank);
    e.local_size = env.integer("LOCAL_WORLD_SIZE", false, 0);
    check_ranks(e, "RANK", "WORLD_SIZE");
    read_master(e, env);
  } else if (env.has("SLURM_NTASKS") && env.has("SLURM_PROCID")) {
    e.launcher = Launcher::Slurm;
    e.size = env.integer("SLURM_NTASKS", true);
    e.rank = env.integer("SLURM_PROCID", true);
    e.local_rank = env.integer("SLURM_LOCALID", false, 0);
    // SLURM_NTASKS_PER_NODE may read "2(x3)"; only a plain count is taken.
    const char* per_node = env.get("SLURM_NTASKS_PER_NODE");
    if (per_node && *per_node &&
        std::string(per_node).find_first_not_of("0123456789") == std::string::npos)
      e.local_size = env.integer("SLURM_NTASKS_PER_NODE", false, 0);
    check_ranks(e, "SLURM_PROCID", "SLURM_NTASKS");
    read_master(e, env);
  }
  return e;
}

int choose_gpu(const LaunchEnv& e, int devices, const std::map<std::string, std::string>* vars) {
  const Env env(vars);
  VIT_CHECK(devices > 0, fmt::format("rank {}: no CUDA device", e.rank));
  const int local = std::max(e.local_size, e.local_rank + 1);
  const char* shared = env.get("NCCL_MULTI_RANK_GPU_ENABLE");
  const bool allowed = (shared && std::string(shared) == "1") ||
                       (e.launcher == Launcher::Slurm && env.has("SLURM_GPUS_PER_TASK"));
  VIT_CHECK(local <= devices || allowed,
            fmt::format("rank {}: {} ranks on this host and {} GPU{}: launch one rank per GPU, "
                        "or set NCCL_MULTI_RANK_GPU_ENABLE=1 to run several on one GPU (needs "
                        "NCCL >= 2.30; experimental)",
                        e.rank, local, devices, devices == 1 ? "" : "s"));
  return e.local_rank % devices;
}

int rank_in_multi_rank_job() noexcept {
  try {
    const LaunchEnv e = read_launch_env();
    return e.size > 1 ? e.rank : -1;
  } catch (...) {
    return -1;
  }
}

}  // namespace vit
