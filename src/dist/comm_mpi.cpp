// The MPI world (OpenMPI): host-buffer collectives for CPU data parallelism. Compiled only
// where CMake found MPI (VIT_HAS_MPI).
#ifdef VIT_HAS_MPI
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

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

template <typename T>
MPI_Datatype mpi_type() {
  return sizeof(T) == sizeof(double) ? MPI_DOUBLE : MPI_FLOAT;
}

// MPI counts are int: ZeRO-1 blocks stay far below 2^31 elements.
int block_count(size_t block, const char* what) {
  VIT_CHECK(block <= size_t(INT_MAX), std::string(what) + ": block too large for MPI");
  return int(block);
}

template <typename T>
void reduce_scatter_in_place(T* data, size_t block, int rank) {
  const int c = block_count(block, "reduce_scatter");
  // In place, MPI leaves this rank's summed block at the start of the buffer.
  mpi_ok(MPI_Reduce_scatter_block(MPI_IN_PLACE, data, c, mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD),
         "reduce_scatter");
  if (rank > 0) std::memmove(data + size_t(rank) * block, data, block * sizeof(T));
}

template <typename T>
void allgather_in_place(T* data, size_t block) {
  const int c = block_count(block, "allgather");
  mpi_ok(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, c, mpi_type<T>(), MPI_COMM_WORLD),
         "allgather");
}

// Ends the process when one collective outlasts the timeout: MPI's blocking collectives would
// otherwise wait forever for a rank that hangs. A thread of its own, which never calls MPI;
// exiting without MPI_Finalize makes mpirun end the other ranks.
class Watchdog {
 public:
  explicit Watchdog(int rank) : rank_(rank), thread_([this] { loop(); }) {}
  ~Watchdog() {
    stop_ = true;
    thread_.join();
  }
  void set_timeout(double s) { timeout_ms_ = int64_t(s * 1000); }
  void begin(const char* op) {
    op_ = op;
    start_ms_ = now_ms();
  }
  void end() { start_ms_ = 0; }

 private:
  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void loop() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t t0 = start_ms_, limit = timeout_ms_;
      if (t0 == 0 || limit <= 0 || now_ms() - t0 <= limit) continue;
      std::fprintf(stderr,
                   "vitrain: rank %d: MPI %s did not finish within %.0f s (--dist-timeout): "
                   "another rank died or hangs; ending this rank\n",
                   rank_, op_.load(), double(limit) / 1000.0);
      std::fflush(stderr);
      std::_Exit(3);
    }
  }
  const int rank_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> start_ms_{0}, timeout_ms_{0};
  std::atomic<const char*> op_{""};
  std::thread thread_;
};

// Marks one collective for the watchdog.
class Timed {
 public:
  Timed(Watchdog* w, const char* op) : w_(w) { w_->begin(op); }
  ~Timed() { w_->end(); }

 private:
  Watchdog* w_;
};

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
    watchdog_ = std::make_unique<Watchdog>(rank_);
  }
  // Unwinding from an error, MPI_Finalize would wait for the other ranks, which wait in a
  // collective for this one: the job would hang until --dist-timeout. Without it, this rank's
  // exit makes mpirun end the others.
  ~MpiComm() override {
    watchdog_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && std::uncaught_exceptions() == 0) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  void set_timeout(double seconds) override { watchdog_->set_timeout(seconds); }
  void allreduce_sum(float* data, size_t n) override {
    Timed t(watchdog_.get(), "all-reduce");
    chunked(data, n, [](float* p, int c) {
      mpi_ok(MPI_Allreduce(MPI_IN_PLACE, p, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "allreduce");
    });
  }
  void allreduce_sum(double* data, size_t n) override {
    Timed t(watchdog_.get(), "all-reduce");
    chunked(data, n, [](double* p, int c) {
      mpi_ok(MPI_Allreduce(MPI_IN_PLACE, p, c, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "allreduce");
    });
  }
  void allreduce_sum_start(float* data, size_t n) override { start_sum(data, n); }
  void allreduce_sum_start(double* data, size_t n) override { start_sum(data, n); }
  void progress() override {
    if (pending_.empty()) return;
    int done = 0;
    mpi_ok(MPI_Testall(int(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE),
           "all-reduce (overlapped)");
    if (done) pending_.clear();
  }
  void wait_all() override {
    if (pending_.empty()) return;
    Timed t(watchdog_.get(), "all-reduce (overlapped)");
    mpi_ok(MPI_Waitall(int(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE),
           "all-reduce (overlapped)");
    pending_.clear();
  }
  void reduce_scatter_sum(float* data, size_t block) override {
    Timed t(watchdog_.get(), "reduce-scatter");
    reduce_scatter_in_place(data, block, rank_);
  }
  void reduce_scatter_sum(double* data, size_t block) override {
    Timed t(watchdog_.get(), "reduce-scatter");
    reduce_scatter_in_place(data, block, rank_);
  }
  void allgather(float* data, size_t block) override {
    Timed t(watchdog_.get(), "all-gather");
    allgather_in_place(data, block);
  }
  void allgather(double* data, size_t block) override {
    Timed t(watchdog_.get(), "all-gather");
    allgather_in_place(data, block);
  }
  void broadcast(void* data, size_t n, int root) override {
    Timed t(watchdog_.get(), "broadcast");
    chunked(static_cast<char*>(data), n, [root](char* p, int c) {
      mpi_ok(MPI_Bcast(p, c, MPI_BYTE, root, MPI_COMM_WORLD), "broadcast");
    });
  }

 private:
  template <typename T>
  void start_sum(T* data, size_t n) {
    chunked(data, n, [this](T* p, int c) {
      MPI_Request r;
      mpi_ok(MPI_Iallreduce(MPI_IN_PLACE, p, c, mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD, &r),
             "all-reduce (overlapped)");
      pending_.push_back(r);
    });
  }

  int rank_ = 0, size_ = 1;
  std::unique_ptr<Watchdog> watchdog_;
  std::vector<MPI_Request> pending_;  // started sums, until wait_all()
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
