#include "dist/comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "core/common.h"
#include "dist/launch_env.h"

namespace vit {

namespace {

class SingleComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  void allreduce_sum(float*, size_t) override {}
  void allreduce_sum(double*, size_t) override {}
  void reduce_scatter_sum(float*, size_t) override {}
  void reduce_scatter_sum(double*, size_t) override {}
  void allgather(float*, size_t) override {}
  void allgather(double*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
};

// OpenMPI's launcher sets OMPI_COMM_WORLD_SIZE in every rank's environment.
int launcher_world_size() {
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!s) s = std::getenv("PMI_SIZE");  // MPICH / Slurm's PMI
  return s ? std::atoi(s) : 1;
}

}  // namespace

std::shared_ptr<Comm> make_mpi_comm();  // comm_mpi.cpp, or the stub below

std::shared_ptr<Comm> make_comm() {
  if (launcher_world_size() <= 1) {
    // torchrun / srun without MPI launch GPU jobs (NCCL, make_run_comm); the CPU's
    // collectives are MPI's.
    const LaunchEnv env = read_launch_env();
    VIT_CHECK(env.size <= 1,
              fmt::format("launched by {} with {} ranks on the CPU: data parallel on the CPU "
                          "runs under mpirun (mpirun -np {} vitrain train ...); torchrun and "
                          "srun launch GPU jobs",
                          launcher_name(env.launcher), env.size, env.size));
    return std::make_shared<SingleComm>();
  }
  VIT_CHECK(mpi_available(),
            "launched by mpirun with several ranks, but this vitrain was built without MPI "
            "(install libopenmpi-dev and rebuild: bash scripts/setup.sh)");
  return make_mpi_comm();
}

size_t shard_block(size_t n, int world) {
  const size_t w64 = size_t(std::max(world, 1)) * 64;
  return (n + w64 - 1) / w64 * 64;
}

std::string broadcast_string(Comm& comm, std::string s, int root) {
  uint64_t n = s.size();
  comm.broadcast(&n, sizeof(n), root);
  s.resize(n);
  if (n) comm.broadcast(s.data(), n, root);
  return s;
}

#ifndef VIT_HAS_MPI
bool mpi_available() {
  return false;
}
std::shared_ptr<Comm> make_mpi_comm() {
  return nullptr;
}
#endif

}  // namespace vit
