// The MPI world (OpenMPI): host-buffer collectives for CPU data parallelism. Compiled only
// where CMake found MPI (VIT_HAS_MPI).
#ifdef VIT_HAS_MPI
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "core/common.h"
#include "dist/comm.h"

namespace vit {

namespace {

void mpi_ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("MPI ") + what + ": " + std::string(msg, size_t(len)));
}

// Counts above INT_MAX go in chunks (MPI counts are int).
template <typename T, typename F>
void chunked(T* data, size_t n, F&& f) {
  constexpr size_t kChunk = size_t(1) << 30;
  for (size_t off = 0; off < n; off += kChunk) f(data + off, int(std::min(kChunk, n - off)));
}

class MpiComm : public Comm {
 public:
  MpiComm() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      // Only the main thread calls MPI (the OpenMP and loader threads never do).
      mpi_ok(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
    }
    // Errors come back as return codes, which become one clear vit::Error.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  void allreduce_sum(float* data, size_t n) override {
    chunked(data, n, [](float* p, int c) {
      mpi_ok(MPI_Allreduce(MPI_IN_PLACE, p, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "allreduce");
    });
  }
  void allreduce_sum(double* data, size_t n) override {
    chunked(data, n, [](double* p, int c) {
      mpi_ok(MPI_Allreduce(MPI_IN_PLACE, p, c, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "allreduce");
    });
  }
  void broadcast(void* data, size_t n, int root) override {
    chunked(static_cast<char*>(data), n, [root](char* p, int c) {
      mpi_ok(MPI_Bcast(p, c, MPI_BYTE, root, MPI_COMM_WORLD), "broadcast");
    });
  }
  void barrier() override { mpi_ok(MPI_Barrier(MPI_COMM_WORLD), "barrier"); }
  [[noreturn]] void abort(int code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool mpi_available() {
  return true;
}
std::shared_ptr<Comm> make_mpi_comm() {
  return std::make_shared<MpiComm>();
}

}  // namespace vit
#endif
