// Collectives between the ranks of a data-parallel run. The trainer and the engine talk to this
// interface only: one process is a world of one (every collective a no-op); under `mpirun` the
// MPI implementation (comm_mpi.cpp, OpenMPI on host buffers) joins the job. GPU jobs use the
// NCCL implementation (comm_nccl.cpp, device or host buffers), under mpirun, torchrun or srun.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace vit {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "single", "mpi"
  // In place: data (n) = the sum over the ranks of data (n), the same on every rank. The
  // reduction order is the implementation's (OpenMPI: fixed for a given world size and count).
  virtual void allreduce_sum(float* data, size_t n) = 0;
  virtual void allreduce_sum(double* data, size_t n) = 0;
  // In place: data (n) = the mean over the ranks (the sum, then divided by size() here; NCCL
  // averages on the device).
  virtual void allreduce_mean(double* data, size_t n) {
    allreduce_sum(data, n);
    for (size_t i = 0; i < n; ++i) data[i] /= double(size());
  }
  // Non-blocking allreduce_sum: started now, in place, finished by wait_all(); data must not
  // be read or written until then. Every rank starts the same sums in the same order (MPI's
  // rule for collectives). progress() lets started sums advance (MPI moves a non-blocking
  // collective only inside MPI calls). The default sums at once.
  virtual void allreduce_sum_start(float* data, size_t n) { allreduce_sum(data, n); }
  virtual void allreduce_sum_start(double* data, size_t n) { allreduce_sum(data, n); }
  virtual void progress() {}
  virtual void wait_all() {}
  // ZeRO-1's collectives, in place over equal blocks: data holds size() * block elements, rank
  // r's block at data + r * block (shard_block: a padded buffer). reduce_scatter_sum: afterwards
  // this rank's block holds the sum over the ranks of that block (the other blocks are
  // unspecified). allgather: every rank's block to every rank. NCCL: ncclReduceScatter /
  // ncclAllGather with recv = data + rank * block; MPI: MPI_Reduce_scatter_block /
  // MPI_Allgather with MPI_IN_PLACE.
  virtual void reduce_scatter_sum(float* data, size_t block) = 0;
  virtual void reduce_scatter_sum(double* data, size_t block) = 0;
  virtual void allgather(float* data, size_t block) = 0;
  virtual void allgather(double* data, size_t block) = 0;
  // bytes (n) of `root` to every rank.
  virtual void broadcast(void* data, size_t n, int root) = 0;
  // A collective that has not finished after `seconds` (a rank died or hangs) ends this rank
  // with one message naming it and the operation; 0 = wait forever.
  virtual void set_timeout(double seconds) { (void)seconds; }
};

// The world this process runs in: MPI when launched by mpirun with more than one rank (needs a
// build with MPI, else a clear error), else a world of one. Created once per process.
std::shared_ptr<Comm> make_comm();
// Whether this build can join an MPI job.
bool mpi_available();

// ZeRO-1's partition of n elements over `world` ranks: equal blocks of the returned size, a
// multiple of 64 elements, the fewest with world * block >= n. Rank r owns [r * block,
// (r + 1) * block); its elements at or past n are padding, which the buffers' owner allocates
// (world * block in all) and keeps zero, so the collectives' sums and copies leave it zero.
size_t shard_block(size_t n, int world);

// A string of `root` (e.g. the run folder rank 0 created) to every rank.
std::string broadcast_string(Comm& comm, std::string s, int root);

}  // namespace vit
