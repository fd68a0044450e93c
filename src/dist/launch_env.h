// Where this process sits in a multi-process job, read from its launcher's environment:
//  * mpirun (OpenMPI): OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; MPI itself bootstraps.
//  * torchrun (--no-python): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
//  * Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; MASTER_ADDR / MASTER_PORT from the
//    environment (the batch script exports them, as for torchrun under Slurm).
// torchrun and srun jobs have no MPI: the ranks meet over TCP at MASTER_ADDR, on the exchange
// port (tcp_exchange.h): MASTER_PORT + 1 (MASTER_PORT - 1 when that is 65535), or
// VIT_EXCHANGE_PORT when set. Never MASTER_PORT itself: torchrun's elastic agent already listens
// there with its TCP store on rank 0's host. The local rank picks the GPU.
#pragma once
#include <map>
#include <string>

namespace vit {

enum class Launcher { None, Mpi, Torchrun, Slurm };

struct LaunchEnv {
  Launcher launcher = Launcher::None;
  int rank = 0, size = 1, local_rank = 0;
  int local_size = 0;       // ranks on this host; 0 = the launcher does not say
  std::string master_addr;  // torchrun / Slurm only
  int master_port = 0;
  int exchange_port = 0;  // where rank 0 listens for the others (see above)
};

const char* launcher_name(Launcher l);

// Reads the launcher's variables from `env` (the process environment when nullptr); throws
// vit::Error with one line naming the variable when they are missing or inconsistent.
// OpenMPI's take precedence (mpirun may run under Slurm), then torchrun's, then Slurm's.
LaunchEnv read_launch_env(const std::map<std::string, std::string>* env = nullptr);

// This rank's GPU among the `devices` it sees: its local rank's (local_rank % devices). More
// local ranks than GPUs throws vit::Error with one line, unless several ranks per GPU were asked
// for (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >= 2.30) or Slurm binds a GPU per task
// (SLURM_GPUS_PER_TASK: each rank sees its own). `vars` as for read_launch_env.
int choose_gpu(const LaunchEnv& env, int devices,
               const std::map<std::string, std::string>* vars = nullptr);

// This process's rank when its launcher started several (-1 otherwise, or when the launcher's
// variables are unreadable). Never throws: for the last error report.
int rank_in_multi_rank_job() noexcept;

}  // namespace vit
