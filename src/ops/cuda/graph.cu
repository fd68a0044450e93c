// CUDA graphs of op-stream work (device.h): the ops are captured on a private stream while the
// model runs its usual code, instantiated once, and replayed with one launch on the op stream.
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device.h"

namespace vit::cuda {

namespace {
// The capture stream is non-blocking: a blocking one would order itself after the legacy op
// stream, an implicit synchronisation that invalidates a capture.
struct Capture {
  cudaStream_t stream = nullptr;
  cudaStream_t saved = nullptr;  // the op stream to restore
  bool active = false;
};
Capture& capture() {
  static Capture c;  // lives until exit (the driver frees the stream)
  return c;
}
std::string error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}
}  // namespace

StreamGraph::~StreamGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);  // no throw from a destructor
}
StreamGraph& StreamGraph::operator=(StreamGraph&& o) noexcept {
  std::swap(exec_, o.exec_);
  return *this;
}

void StreamGraph::launch() const {
  VIT_CHECK(exec_ != nullptr, "cuda::StreamGraph::launch: no graph");
  VIT_CUDA_CHECK(cudaGraphLaunch(exec_, stream()));
}

void begin_capture() {
  Capture& c = capture();
  VIT_CHECK(!c.active, "cuda::begin_capture: a capture is already under way");
  if (!c.stream) VIT_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  // Thread-local mode: only this thread's unsafe calls (a synchronisation, a cudaMalloc) break
  // the capture; the loader threads are not affected.
  VIT_CUDA_CHECK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
  c.saved = stream();
  set_stream(c.stream);
  c.active = true;
}

namespace {
// Ends the capture under way and restores the op stream; the recording (null when the capture
// was invalidated) in *graph.
cudaError_t finish_capture(cudaGraph_t* graph) {
  Capture& c = capture();
  VIT_CHECK(c.active, "cuda: no graph capture under way");
  set_stream(c.saved);
  c.active = false;
  return cudaStreamEndCapture(c.stream, graph);
}
}  // namespace

void abort_capture() {
  cudaGraph_t graph = nullptr;
  finish_capture(&graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // what broke the capture must not reach the next check
}

StreamGraph end_capture(std::string* why) {
  cudaGraph_t graph = nullptr;
  StreamGraph out;
  cudaError_t err = finish_capture(&graph);
  if (err == cudaSuccess) {
    cudaGraphExec_t exec = nullptr;
    err = cudaGraphInstantiate(&exec, graph, 0);
    if (err == cudaSuccess) out.exec_ = exec;
  }
  if (graph) cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    cudaGetLastError();  // a failed capture leaves an error that must not reach the next check
    if (why) *why = error_text(err);
  }
  return out;
}

}  // namespace vit::cuda
