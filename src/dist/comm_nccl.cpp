// The NCCL world: collectives for GPU data parallelism, on device buffers, on a stream of its
// own that is ordered after the op stream's work with events (no host sync for device data).
// Host buffers (the run folder's name, evaluation sums, the budget's verdict) are copied into
// pinned memory and staged through device memory; the caller polls their end. Rank 0 makes
// NCCL's unique id; it reaches the other ranks through MPI under mpirun (joined here, after the
// device is chosen), or through the TCP exchange under torchrun / srun (dist/bootstrap.h).
// The communicator is non-blocking (ncclConfig_t::blocking = 0): init, and an enqueue that sets
// up connections lazily, return at once and are polled, so --dist-timeout bounds them too. A
// watchdog (dist/watchdog.h) watches each collective from before it is enqueued: it polls the
// collective's event and NCCL's async error on a thread that has selected this rank's device,
// and past the timeout prints one line naming the operation, aborts the communicator under a
// hard deadline and ends the process.
// Built into the CUDA library where CMake found NCCL (VIT_HAS_NCCL).
#ifdef VIT_HAS_NCCL
#include "dist/comm_nccl.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "core/common.h"
#include "dist/bootstrap.h"
#include "dist/comm.h"
#include "dist/watchdog.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops.h"

namespace vit {

namespace {

void nccl_ok(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  throw Error(fmt::format("NCCL {}: {}", what, ncclGetErrorString(rc)));
}
void cuda_ok(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  throw Error(fmt::format("CUDA {} (NCCL communicator): {}", what, cudaGetErrorString(rc)));
}

bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // a plain host pointer on older runtimes
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

template <typename T>
ncclDataType_t nccl_type() {
  return sizeof(T) == sizeof(double) ? ncclFloat64 : ncclFloat32;
}

// The state of a non-blocking communicator: Pending while NCCL works in the background.
PollState comm_state(ncclComm_t comm, std::string* why) {
  ncclResult_t a = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm, &a);
  if (rc != ncclSuccess) a = rc;
  if (a == ncclInProgress) return PollState::Pending;
  if (a == ncclSuccess) return PollState::Done;
  if (why) *why = fmt::format("NCCL reports {}", ncclGetErrorString(a));
  return PollState::Failed;
}

class NcclComm : public Comm {
 public:
  NcclComm(const LaunchEnv& env, int device, const ncclUniqueId& id, double timeout_s,
           std::shared_ptr<Comm> mpi)
      : rank_(env.rank), size_(env.size), device_(device), mpi_(std::move(mpi)) {
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "event");
    cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "event");
    init(id, timeout_s);
    Watchdog::Hooks hooks;
    hooks.on_thread_start = [d = device_] { cudaSetDevice(d); };  // no context on GPU 0
    hooks.poll = [this](std::string* why) { return pending_state(why); };
    hooks.abort = aborter();
    watchdog_ = std::make_unique<Watchdog>(rank_, "NCCL", std::move(hooks), real_clock(), 0.1,
                                           kAbortGraceS);
    watchdog_->set_timeout(timeout_s);
  }
  // Unwinding from an error, the other ranks may wait in a collective for this one, which a
  // stream synchronisation and a finalize would wait for too: abort instead, under a deadline.
  // The watchdog watches the teardown too (a peer that hangs now would hold the finalize).
  ~NcclComm() override {
    const bool unwinding = std::uncaught_exceptions() > 0;
    bool clean = false;
    if (!unwinding) {
      enqueued_ = false;
      watchdog_->begin("teardown");
      const ncclResult_t rc = cudaStreamSynchronize(stream_) == cudaSuccess
                                  ? ncclCommFinalize(comm_)  // non-blocking: polled
                                  : ncclUnhandledCudaError;
      clean = (rc == ncclSuccess || rc == ncclInProgress) &&
              poll_until([&] { return comm_state(comm_, nullptr); }, 0, real_clock()) ==
                  PollState::Done;
    }
    watchdog_.reset();
    if (clean)
      ncclCommDestroy(comm_);
    else
      run_with_deadline(aborter(), kAbortGraceS, real_clock());
    if (pinned_) cudaFreeHost(pinned_);
    if (staging_) cudaFree(staging_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  void set_timeout(double seconds) override { watchdog_->set_timeout(seconds); }

  void allreduce_sum(float* data, size_t n) override { allreduce(data, n, ncclSum); }
  void allreduce_sum(double* data, size_t n) override { allreduce(data, n, ncclSum); }
  void allreduce_mean(double* data, size_t n) override { allreduce(data, n, ncclAvg); }
  // Device data: on the collective stream after the op stream's work so far, and the op
  // stream goes on without waiting for it (the overlap) until wait_all(). Host data: at once.
  void allreduce_sum_start(float* data, size_t n) override { allreduce_start(data, n); }
  void allreduce_sum_start(double* data, size_t n) override { allreduce_start(data, n); }
  void wait_all() override {
    if (!started_) return;
    cuda_ok(cudaStreamWaitEvent(cuda::stream(), done_, 0), "wait");
    started_ = false;
  }
  void reduce_scatter_sum(float* data, size_t block) override { reduce_scatter(data, block); }
  void reduce_scatter_sum(double* data, size_t block) override { reduce_scatter(data, block); }
  void allgather(float* data, size_t block) override { gather(data, block); }
  void allgather(double* data, size_t block) override { gather(data, block); }
  void broadcast(void* data, size_t n, int root) override {
    run("broadcast", data, n, [&](void* d) {
      enqueued(ncclBroadcast(d, d, n, ncclUint8, root, comm_, stream_), "broadcast");
    });
  }

 private:
  static constexpr double kAbortGraceS = 10.0;  // ncclCommAbort's time before a hard exit
  static constexpr size_t kKeepStagingBytes = size_t(1) << 20;  // evaluation sums, flags, names

  // ncclCommAbort, for a thread of its own (run_with_deadline's): the rank's device first, as
  // for every thread that calls CUDA, or the abort would open a context on GPU 0.
  std::function<void()> aborter() const {
    return [c = comm_, d = device_] {
      cudaSetDevice(d);
      ncclCommAbort(c);
    };
  }
  // Non-blocking init, bounded by the timeout: a rank that never joins would hold it forever.
  void init(const ncclUniqueId& id, double timeout_s) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (rc != ncclInProgress) nccl_ok(rc, "init");
    std::string why;
    const PollState s =
        poll_until([&] { return comm_state(comm_, &why); }, timeout_s, real_clock());
    if (s == PollState::Done) return;
    run_with_deadline(aborter(), kAbortGraceS, real_clock());
    throw Error(s == PollState::Failed
                    ? fmt::format("NCCL init failed: {}", why)
                    : fmt::format("NCCL init did not finish within {:g} s (--dist-timeout): a "
                                  "rank did not join, or two ranks share a GPU with an NCCL "
                                  "older than 2.30",
                                  timeout_s));
  }
  // A non-blocking communicator's call may return ncclInProgress: its work goes on in the
  // background (e.g. the first collective's connection set-up), watched by the watchdog, and
  // the next call waits until it is done.
  void enqueued(ncclResult_t rc, const char* what) {
    if (rc == ncclInProgress) {
      std::string why;
      const PollState s = poll_until([&] { return comm_state(comm_, &why); }, 0, real_clock());
      if (s == PollState::Failed) throw Error(fmt::format("NCCL {}: {}", what, why));
      return;
    }
    nccl_ok(rc, what);
  }
  // The pending collective, for the watchdog: NCCL's async error first, then its event once
  // it is enqueued.
  PollState pending_state(std::string* why) {
    const PollState c = comm_state(comm_, why);
    if (c == PollState::Failed) return c;
    if (!enqueued_) return PollState::Pending;
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaSuccess) return PollState::Done;
    if (e == cudaErrorNotReady) return PollState::Pending;
    *why = fmt::format("CUDA reports {}", cudaGetErrorString(e));
    return PollState::Failed;
  }

  template <typename T>
  void allreduce(T* data, size_t n, ncclRedOp_t op) {
    run("all-reduce", data, n * sizeof(T), [&](void* d) {
      enqueued(ncclAllReduce(d, d, n, nccl_type<T>(), op, comm_, stream_), "all-reduce");
    });
  }
  template <typename T>
  void allreduce_start(T* data, size_t n) {
    if (n == 0) return;
    if (!on_device(data)) return allreduce(data, n, ncclSum);
    run(
        "all-reduce (overlapped)", data, n * sizeof(T),
        [&](void* d) {
          enqueued(ncclAllReduce(d, d, n, nccl_type<T>(), ncclSum, comm_, stream_),
                   "all-reduce (overlapped)");
        },
        /*op_stream_waits=*/false);
    started_ = true;
  }
  // ZeRO-1's equal blocks (Comm::reduce_scatter_sum), in place: this rank's block is the
  // receive buffer, at data + rank * block.
  template <typename T>
  void reduce_scatter(T* data, size_t block) {
    run("reduce-scatter", data, size_t(size_) * block * sizeof(T), [&](void* d) {
      T* all = static_cast<T*>(d);
      enqueued(ncclReduceScatter(all, all + size_t(rank_) * block, block, nccl_type<T>(), ncclSum,
                                 comm_, stream_),
               "reduce-scatter");
    });
  }
  template <typename T>
  void gather(T* data, size_t block) {
    run("all-gather", data, size_t(size_) * block * sizeof(T), [&](void* d) {
      T* all = static_cast<T*>(d);
      enqueued(
          ncclAllGather(all + size_t(rank_) * block, all, block, nccl_type<T>(), comm_, stream_),
          "all-gather");
    });
  }

  // f enqueues the collective on stream_ over device memory. The watchdog watches `op` from
  // here on. Device data: after the op stream's work so far, and the op stream waits for it
  // (unless op_stream_waits is false: wait_all() does, later). Host data: copied into pinned
  // memory, staged through device scratch, and polled until done.
  template <typename F>
  void run(const char* op, void* data, size_t bytes, F&& f, bool op_stream_waits = true) {
    if (bytes == 0) return;
    const bool device = on_device(data);
    enqueued_ = false;
    watchdog_->begin(op);
    void* d = data;
    if (!device) {
      grow_staging(bytes);
      std::memcpy(pinned_, data, bytes);
      cuda_ok(cudaMemcpyAsync(staging_, pinned_, bytes, cudaMemcpyHostToDevice, stream_),
              "copy in");
      d = staging_;
    }
    cuda_ok(cudaEventRecord(ready_, cuda::stream()), "record");
    cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), "wait");
    f(d);
    if (!device)
      cuda_ok(cudaMemcpyAsync(pinned_, staging_, bytes, cudaMemcpyDeviceToHost, stream_),
              "copy out");
    cuda_ok(cudaEventRecord(done_, stream_), "record");
    enqueued_ = true;
    if (op_stream_waits) cuda_ok(cudaStreamWaitEvent(cuda::stream(), done_, 0), "wait");
    if (device) return;
    cudaError_t e;
    while ((e = cudaEventQuery(done_)) == cudaErrorNotReady)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    cuda_ok(e, op);
    std::memcpy(data, pinned_, bytes);
    watchdog_->end();
    // A large host collective does not keep its scratch: it would hold device memory that
    // ZeRO-1 saved (the engine gathers the moments for a checkpoint in pieces that fit).
    if (staging_bytes_ > kKeepStagingBytes) release_staging();
  }
  // Pinned host and device scratch of at least `bytes` (grown by doubling; kept up to
  // kKeepStagingBytes).
  void grow_staging(size_t bytes) {
    if (bytes <= staging_bytes_) return;
    const size_t n = std::max(bytes, 2 * staging_bytes_);
    release_staging();
    cuda_ok(cudaMalloc(&staging_, n), "staging buffer");
    cuda_ok(cudaMallocHost(&pinned_, n), "pinned staging buffer");
    staging_bytes_ = n;
  }
  void release_staging() {
    cuda_ok(cudaStreamSynchronize(stream_), "synchronize");
    if (staging_) cudaFree(staging_);
    if (pinned_) cudaFreeHost(pinned_);
    staging_ = pinned_ = nullptr;
    staging_bytes_ = 0;
  }

  const int rank_, size_, device_;
  std::shared_ptr<Comm> mpi_;  // under mpirun: MPI outlives the NCCL world (finalized after)
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  void* staging_ = nullptr;  // device scratch of host-buffer collectives (bytes)
  void* pinned_ = nullptr;   // its pinned host twin (bytes)
  size_t staging_bytes_ = 0;
  std::atomic<bool> enqueued_{false};  // the watched collective's done_ is recorded
  bool started_ = false;               // sums started that the op stream has not waited for
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

std::shared_ptr<Comm> make_nccl_comm(const LaunchEnv& env, Comm* bootstrap, double timeout_s) {
  // The device first: MPI_Init and NCCL then open their context on it, not on GPU 0.
  int devices = 0;
  cuda_ok(cudaGetDeviceCount(&devices), "device count");
  const int device = choose_gpu(env, devices);
  cuda_ok(cudaSetDevice(device), "set device");
  // NCCL prints its warnings only when asked; they go to this rank's stdout (rank 0's console,
  // the other ranks' rank<R>.log in the run folder).
  ::setenv("NCCL_DEBUG", "WARN", /*overwrite=*/0);
  std::shared_ptr<Comm> mpi;
  if (!bootstrap && env.launcher == Launcher::Mpi && env.size > 1) {
    mpi = make_comm();
    bootstrap = mpi.get();
  }
  ncclUniqueId id{};
  if (env.rank == 0) nccl_ok(ncclGetUniqueId(&id), "unique id");
  const std::string blob = share_from_rank0(
      env, bootstrap, std::string(reinterpret_cast<const char*>(&id), sizeof id), timeout_s);
  VIT_CHECK(blob.size() == sizeof id, "NCCL: rank 0 sent an id of the wrong size");
  std::memcpy(&id, blob.data(), sizeof id);
  return std::make_shared<NcclComm>(env, device, id, timeout_s, std::move(mpi));
}

}  // namespace vit
#endif  // VIT_HAS_NCCL
