// cuDNN's backend (graph) API as the attention files use it: the library loaded at run time
// (dlopen "libcudnn.so.9", never linked; the toolkit's headers give the types), descriptors
// that destroy themselves, tensor descriptors, and a plan built from an operation graph on the
// first engine configuration that finalizes. Host code only; everything is inside
// VIT_CUDNN_HEADERS, so a toolkit without cuDNN builds the attention files' fallbacks.
#pragma once

#include <cuda_runtime.h>

#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define VIT_CUDNN_HEADERS 1
#else
#define VIT_CUDNN_HEADERS 0
#endif

#if VIT_CUDNN_HEADERS

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace vit::cuda::cudnn {

// The entry points, from libcudnn.so.9 (which forwards to libcudnn_graph.so.9).
struct Api {
  size_t (*get_version)() = nullptr;
  const char* (*error_string)(cudnnStatus_t) = nullptr;
  void (*last_error)(char*, size_t) = nullptr;
  cudnnStatus_t (*create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t) = nullptr;
  cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*) = nullptr;
  cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*set_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                            cudnnBackendAttributeType_t, int64_t, const void*) = nullptr;
  cudnnStatus_t (*get_attr)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                            cudnnBackendAttributeType_t, int64_t, int64_t*, void*) = nullptr;
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t,
                           cudnnBackendDescriptor_t) = nullptr;
  size_t version = 0;
  std::string why_not;  // empty when loaded
};
// Loaded on first use, once a process.
const Api& api();

// A cuDNN call that failed: its status, the library's last message and what was being done.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void check(cudnnStatus_t status, const char* what);

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type);
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept;
  ~Desc();
  cudnnBackendDescriptor_t get() const { return d_; }
  template <typename V>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const V* values, const char* what) {
    check(api().set_attr(d_, name, type, count, values), what);
  }
  void set_desc(cudnnBackendAttributeName_t name, const Desc& value, const char* what);
  void finalize(const char* what) { check(api().finalize(d_), what); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::array<int64_t, 4>;

// How a tensor takes part in a graph: memory the variant pack points at (device), a scalar it
// points at in host memory (by value), or an intermediate the engine keeps to itself (virtual).
enum class Role { kMemory, kByValue, kVirtual };

// A finalized 4-d tensor descriptor: element dims and strides, 16-byte aligned (as
// cudnn-frontend gives every tensor).
Desc tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
            Role role = Role::kMemory);

// An operation graph's operations and the tensors they reference (kept alive with them).
struct Operations {
  std::vector<Desc> ops;
  std::vector<Desc> tensors;
};

// A built plan: its descriptors (kept alive with it), workspace bytes, and its engine (the
// global index, and whether cuDNN notes it as nondeterministic).
struct Plan {
  std::vector<Desc> keep;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
  int64_t engine = -1;
  bool nondeterministic = false;
};

// The plan of the graph of `o`'s operations on the first engine configuration (heuristics mode
// A's, else the fallback list's) that finalizes as an execution plan, skipping engines noted
// nondeterministic unless `any_engine`. Throws Failure, with the last reason, if none does.
Plan build_plan(cudnnHandle_t handle, Operations o, bool any_engine);

}  // namespace vit::cuda::cudnn

#endif  // VIT_CUDNN_HEADERS
