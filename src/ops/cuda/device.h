// Device memory and transfers for the CUDA backend: counted allocations (the run's peak device
// memory), RAII buffers, the double-buffered pinned input path, the engine's on-device loss
// bookkeeping and the device's name. Plain C++ declarations: host code compiled by g++ (the
// model and engine instantiations) includes this header; the bodies are in device.cu.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "core/common.h"
#include "ops/kernel_plan.h"

struct CUgraphExec_st;  // cudaGraphExec_t's struct (no CUDA header here)
struct CUevent_st;      // cudaEvent_t's

namespace vit::cuda {

void* device_alloc(size_t bytes);  // cudaMalloc; throws vit::Error naming the size on failure
void device_free(void* p) noexcept;
size_t device_bytes_in_use();
size_t device_peak_bytes();  // high-water mark of device_alloc'd bytes in this process

// Asynchronous on the op stream: dst (bytes) = 0; dst (bytes) = src (device).
void zero_bytes(void* dst, size_t bytes);
void copy_bytes(void* dst, const void* src, size_t bytes);
// Host -> device on the op stream, staged through pinned memory: returns as soon as the host
// memory may be reused, without waiting for the device. Device -> host waits for the op stream
// (use it at log, eval and checkpoint points, not per step).
void upload_bytes(void* dst, const void* host, size_t bytes);
void download_bytes(void* host, const void* src, size_t bytes);

// The input path: host memory -> pinned buffer `slot` (0 or 1) -> device on a side stream, so
// the copy of the next batch overlaps the current step's compute. Before it writes the device
// buffers, the side stream waits until the op stream has passed input_released(slot); the op
// stream waits for the copy before anything reads them. Returns once the host memory may be
// reused. The engine alternates the slots and their device buffers.
struct InputCopy {
  void* dst;         // device
  const void* host;  // any host memory
  size_t bytes;
};
void upload_input(const InputCopy* copies, int n, int slot);
void input_released(int slot);

// The engine's step statistics (kNumStepStats fp64 on the device, see StepStat in
// ops/cpu/adamw.h): the micro-batch's mean loss (B) adds to the pending update's; an update's
// loss is the mean of its micro-batches'. No host sync.
void loss_accumulate(double* stats, const float* losses, Index B);
void close_update_loss(double* stats, int micro_batches);

std::string device_name();  // e.g. "NVIDIA H100 80GB HBM3"
// The current device as the kernel plan's rules and the autotune cache's key see it (name,
// compute capability, SMs, shared memory a block, driver and cuBLASLt versions).
DeviceProps device_props();

// Makes the op profile (core/profile.h) time ops with CUDA events on the op stream.
void install_profile_timer();

// CUDA graphs. begin_capture() points the op stream at a private capture stream: the ops
// enqueued until end_capture() are recorded, not run. end_capture() restores the op stream and
// returns the recorded work instantiated as a graph, or an empty graph (valid() false) with the
// reason in *why when the capture broke (an op that cannot be captured: a synchronisation, a
// host-to-device copy from pageable memory). launch() replays it on the op stream: the same
// kernels with the same arguments and pointers, so the buffers it names must stay where they
// were (the model's arena and parameters do; scratch slots: see scratch_epoch in ops.h).
class StreamGraph {
 public:
  StreamGraph() = default;
  ~StreamGraph();
  StreamGraph(StreamGraph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  StreamGraph& operator=(StreamGraph&& o) noexcept;
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  bool valid() const { return exec_ != nullptr; }
  void launch() const;

 private:
  friend StreamGraph end_capture(std::string* why);
  CUgraphExec_st* exec_ = nullptr;  // cudaGraphExec_t
};
void begin_capture();
StreamGraph end_capture(std::string* why);
void abort_capture();  // ends the capture, restores the op stream, drops what was recorded

// Marks in the op stream's order of work, to time what was enqueued without waiting for it:
// record() enqueues an event behind everything enqueued so far. After a synchronize(),
// seconds() gives each mark's device time after the first. Not while a graph is captured.
class StreamMarks {
 public:
  StreamMarks() = default;
  ~StreamMarks();
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;
  void record();
  std::vector<double> seconds() const;
  void clear() { used_ = 0; }  // the events are reused by the next marks

 private:
  std::vector<CUevent_st*> events_;  // cudaEvent_t, created as the marks first need them
  size_t used_ = 0;
};

// An owning device array of n elements of U (uninitialised).
template <class U>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n)
      : p_(n ? static_cast<U*>(device_alloc(n * sizeof(U))) : nullptr), n_(n) {}
  ~DeviceBuffer() { device_free(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  U* data() { return p_; }
  const U* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  U* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace vit::cuda
