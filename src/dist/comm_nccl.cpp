// The NCCL world: collectives for GPU data parallelism, on device buffers, on a stream of its
// own that is ordered after the op stream's work with events (no host sync for device data).
// Host buffers (the run folder's name, evaluation sums) are staged through device memory and
// waited for. Rank 0 makes NCCL's unique id; it reaches the other ranks through MPI under
// mpirun, or through the TCP meeting point under torchrun / srun (tcp_exchange.h). The local
// rank picks the device. A collective still unfinished after --dist-timeout ends the rank with
// one message naming it (a watchdog thread polls the last collective's event).
// Built into the CUDA library where CMake found NCCL (VIT_HAS_NCCL).
#ifdef VIT_HAS_NCCL
#include "dist/comm_nccl.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/common.h"
#include "dist/comm.h"
#include "dist/tcp_exchange.h"
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

class NcclComm : public Comm {
 public:
  NcclComm(int rank, int size, const ncclUniqueId& id) : rank_(rank), size_(size) {
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "event");
    cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "event");
    nccl_ok(ncclCommInitRank(&comm_, size, id, rank), "init");
    watchdog_ = std::thread([this] { watch(); });
  }
  // Unwinding from an error, the other ranks may wait in a collective for this one, which a
  // stream synchronisation and ncclCommDestroy would wait for too: abort instead.
  ~NcclComm() override {
    stop_ = true;
    watchdog_.join();
    if (std::uncaught_exceptions() > 0) {
      ncclCommAbort(comm_);
    } else {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  void set_timeout(double seconds) override { timeout_ms_ = int64_t(seconds * 1000); }

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
  void reduce_scatter_sum(float* data, const std::vector<size_t>& counts) override {
    reduce_scatter(data, counts);
  }
  void reduce_scatter_sum(double* data, const std::vector<size_t>& counts) override {
    reduce_scatter(data, counts);
  }
  void allgather(float* data, const std::vector<size_t>& counts) override { gather(data, counts); }
  void allgather(double* data, const std::vector<size_t>& counts) override { gather(data, counts); }
  void broadcast(void* data, size_t n, int root) override {
    run("broadcast", data, n, [&](void* d) {
      nccl_ok(ncclBroadcast(d, d, n, ncclUint8, root, comm_, stream_), "broadcast");
    });
  }

 private:
  template <typename T>
  void allreduce(T* data, size_t n, ncclRedOp_t op) {
    run("all-reduce", data, n * sizeof(T), [&](void* d) {
      nccl_ok(ncclAllReduce(d, d, n, nccl_type<T>(), op, comm_, stream_), "all-reduce");
    });
  }
  template <typename T>
  void allreduce_start(T* data, size_t n) {
    if (n == 0) return;
    if (!on_device(data)) return allreduce(data, n, ncclSum);
    run(
        "all-reduce (overlapped)", data, n * sizeof(T),
        [&](void* d) {
          nccl_ok(ncclAllReduce(d, d, n, nccl_type<T>(), ncclSum, comm_, stream_),
                  "all-reduce (overlapped)");
        },
        /*op_stream_waits=*/false);
    started_ = true;
  }
  // ZeRO-1's blocks are uneven (shard_counts: the last shorter, trailing ones empty), and
  // NCCL's reduce-scatter / all-gather take equal ones: so one grouped call of a reduce to
  // rank r (reduce-scatter) or a broadcast from rank r (all-gather) per block r, which moves
  // about the same bytes and never touches memory past the blocks.
  template <typename T>
  void reduce_scatter(T* data, const std::vector<size_t>& counts) {
    run("reduce-scatter", data, total(counts) * sizeof(T), [&](void* d) {
      per_block(static_cast<T*>(d), counts, [&](T* block, size_t n, int r) {
        nccl_ok(ncclReduce(block, block, n, nccl_type<T>(), ncclSum, r, comm_, stream_),
                "reduce-scatter");
      });
    });
  }
  template <typename T>
  void gather(T* data, const std::vector<size_t>& counts) {
    run("all-gather", data, total(counts) * sizeof(T), [&](void* d) {
      per_block(static_cast<T*>(d), counts, [&](T* block, size_t n, int r) {
        nccl_ok(ncclBroadcast(block, block, n, nccl_type<T>(), r, comm_, stream_), "all-gather");
      });
    });
  }
  size_t total(const std::vector<size_t>& counts) const {
    VIT_CHECK(int(counts.size()) == size_, "NCCL: one block per rank");
    size_t n = 0;
    for (size_t c : counts) n += c;
    return n;
  }
  // f(block start, its length, its rank) for every non-empty block, in one NCCL group.
  template <typename T, typename F>
  void per_block(T* all, const std::vector<size_t>& counts, F&& f) {
    nccl_ok(ncclGroupStart(), "group start");
    size_t off = 0;
    for (int r = 0; r < size_; ++r) {
      if (counts[size_t(r)] > 0) f(all + off, counts[size_t(r)], r);
      off += counts[size_t(r)];
    }
    nccl_ok(ncclGroupEnd(), "group end");
  }

  // f enqueues the collective on stream_ over device memory. Device data: after the op
  // stream's work so far, and the op stream waits for it (unless op_stream_waits is false:
  // wait_all() does, later). Host data: staged through device scratch, and waited for.
  template <typename F>
  void run(const char* op, void* data, size_t bytes, F&& f, bool op_stream_waits = true) {
    if (bytes == 0) return;
    const bool device = on_device(data);
    void* d = data;
    if (!device) {
      grow_staging(bytes);
      d = staging_;
      cuda_ok(cudaMemcpyAsync(d, data, bytes, cudaMemcpyHostToDevice, stream_), "copy in");
    }
    cuda_ok(cudaEventRecord(ready_, cuda::stream()), "record");
    cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), "wait");
    f(d);
    if (!device)
      cuda_ok(cudaMemcpyAsync(data, d, bytes, cudaMemcpyDeviceToHost, stream_), "copy out");
    {
      std::lock_guard<std::mutex> lock(mu_);
      cuda_ok(cudaEventRecord(done_, stream_), "record");
      op_ = op;
      start_ms_ = now_ms();
    }
    if (op_stream_waits) cuda_ok(cudaStreamWaitEvent(cuda::stream(), done_, 0), "wait");
    if (!device) cuda_ok(cudaStreamSynchronize(stream_), "synchronize");
  }
  void grow_staging(size_t bytes) {
    if (bytes <= staging_bytes_) return;
    cuda_ok(cudaStreamSynchronize(stream_), "synchronize");
    if (staging_) cudaFree(staging_);
    cuda_ok(cudaMalloc(&staging_, bytes), "staging buffer");
    staging_bytes_ = bytes;
  }

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // Ends the rank when the last collective has been pending longer than the timeout: NCCL would
  // otherwise wait forever for a dead or hung rank.
  void watch() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::lock_guard<std::mutex> lock(mu_);
      const int64_t t0 = start_ms_, limit = timeout_ms_;
      if (t0 == 0 || limit <= 0) continue;
      if (cudaEventQuery(done_) == cudaSuccess) {
        start_ms_ = 0;
        continue;
      }
      if (now_ms() - t0 <= limit) continue;
      std::fprintf(stderr,
                   "vitrain: rank %d: NCCL %s did not finish within %.0f s (--dist-timeout): "
                   "another rank died or hangs; ending this rank\n",
                   rank_, op_, double(limit) / 1000.0);
      std::fflush(stderr);
      ncclCommAbort(comm_);
      std::_Exit(3);
    }
  }

  const int rank_, size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  std::mutex mu_;  // done_, op_, start_ms_ between the caller and the watchdog
  const char* op_ = "";
  int64_t start_ms_ = 0;
  std::atomic<int64_t> timeout_ms_{0};
  std::atomic<bool> stop_{false};
  bool started_ = false;  // sums started that the op stream has not waited for
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<Comm> make_nccl_comm(const LaunchEnv& env, Comm* bootstrap, double timeout_s) {
  int devices = 0;
  cuda_ok(cudaGetDeviceCount(&devices), "device count");
  VIT_CHECK(devices > 0, "NCCL: no CUDA device");
  cuda_ok(cudaSetDevice(env.local_rank % devices), "set device");
  ncclUniqueId id{};
  if (env.rank == 0) nccl_ok(ncclGetUniqueId(&id), "unique id");
  if (bootstrap && bootstrap->size() > 1) {
    bootstrap->broadcast(&id, sizeof id, 0);  // mpirun: MPI carries the id
  } else {
    const std::string blob = tcp_share_from_rank0(
        env, std::string(reinterpret_cast<const char*>(&id), sizeof id), timeout_s);
    VIT_CHECK(blob.size() == sizeof id, "NCCL: rank 0 sent an id of the wrong size");
    std::memcpy(&id, blob.data(), sizeof id);
  }
  auto comm = std::make_shared<NcclComm>(env.rank, env.size, id);
  comm->set_timeout(timeout_s);
  return comm;
}

}  // namespace vit
#endif  // VIT_HAS_NCCL
