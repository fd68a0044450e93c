// Collectives between the ranks of a data-parallel run. The trainer and the engine talk to this
// interface only: one process is a world of one (every collective a no-op); under `mpirun` the
// MPI implementation (comm_mpi.cpp, OpenMPI on host buffers) joins the job. The NCCL twin for
// device buffers is still to come, so a GPU engine refuses worlds larger than one.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

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
  // bytes (n) of `root` to every rank.
  virtual void broadcast(void* data, size_t n, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job with `code` (after an error on one rank).
  [[noreturn]] virtual void abort(int code) = 0;
};

// The world this process runs in: MPI when launched by mpirun with more than one rank (needs a
// build with MPI, else a clear error), else a world of one. Created once per process.
std::shared_ptr<Comm> make_comm();
// Whether this build can join an MPI job.
bool mpi_available();

// A string of `root` (e.g. the run folder rank 0 created) to every rank.
std::string broadcast_string(Comm& comm, std::string s, int root);

}  // namespace vit
