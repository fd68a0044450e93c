// cuDNN's fused attention (the backend API's SDPA operations) as an opt-in alternative to our
// flash kernels for bf16 (VIT_CUDNN_ATTENTION=1, or fwd / bwd for one direction), so the two
// can be timed side by side (issue 13: "or cuDNN 9's fused attention where it is faster for our
// shapes; measure both"). timm's attention under PyTorch runs cuDNN's kernels: on an H100 they
// took 1.1 ms forward and 2.9 ms backward a ViT-S/16 b256 step, where ours take 2.1 and 5.8 on
// an H200 (docs/benchmarks.md).
//
// The library is loaded at run time (dlopen "libcudnn.so.9"), never linked: the toolkit's
// headers give the types and enum values, and a machine without cuDNN, or with a cuDNN older
// than the operation (SDPA forward 9.13.1, backward 9.17), runs our kernels after one line on
// stderr saying why. One graph of one operation a direction: Q, K, V, O (and dO, dQ, dK, dV)
// are strided views of qkv (B, N, 3C) and out (B, N, C) as (B, H, N, D), no copies; the softmax
// statistics are our lse (B, H, N): the natural-log log-sum-exp of the scaled scores in both,
// so either direction may run with the other's kernels. Plans are built once a (device, shape)
// and kept; the workspace is a scratch slot. Only engines cuDNN does not note as
// nondeterministic are planned (any_engine), and each plan's engine is said once on stderr. Not
// bitwise the emulation's rounding: an opt-in to measure.
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/ops.h"

#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define VIT_CUDNN_HEADERS 1
#else
#define VIT_CUDNN_HEADERS 0
#endif

namespace vit::cuda {

namespace {

// VIT_CUDNN_ATTENTION: "1" (or any value not starting with '0', "fwd" or "bwd") both directions,
// "fwd" / "bwd" one.
bool cudnn_wanted(bool forward) {
  const char* env = std::getenv("VIT_CUDNN_ATTENTION");
  if (!env || env[0] == '\0' || env[0] == '0') return false;
  if (std::strcmp(env, "fwd") == 0) return forward;
  if (std::strcmp(env, "bwd") == 0) return !forward;
  return true;
}

CudnnAttentionCounts g_counts;

}  // namespace

CudnnAttentionCounts cudnn_attention_counts() {
  return g_counts;
}

#if VIT_CUDNN_HEADERS

namespace {

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

template <typename F>
bool find_symbol(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

const Api& api() {
  static const Api loaded = [] {
    Api a;
    void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* err = dlerror();
      a.why_not = std::string("libcudnn.so.9 not loaded: ") + (err ? err : "?");
      return a;
    }
    const bool ok = find_symbol(lib, "cudnnGetVersion", a.get_version) &&
                    find_symbol(lib, "cudnnGetErrorString", a.error_string) &&
                    find_symbol(lib, "cudnnGetLastErrorString", a.last_error) &&
                    find_symbol(lib, "cudnnCreate", a.create) &&
                    find_symbol(lib, "cudnnSetStream", a.set_stream) &&
                    find_symbol(lib, "cudnnBackendCreateDescriptor", a.create_desc) &&
                    find_symbol(lib, "cudnnBackendDestroyDescriptor", a.destroy_desc) &&
                    find_symbol(lib, "cudnnBackendSetAttribute", a.set_attr) &&
                    find_symbol(lib, "cudnnBackendGetAttribute", a.get_attr) &&
                    find_symbol(lib, "cudnnBackendFinalize", a.finalize) &&
                    find_symbol(lib, "cudnnBackendExecute", a.execute);
    if (!ok) {
      a.why_not = "libcudnn.so.9 lacks a backend API entry point";
      return a;
    }
    a.version = a.get_version();
    return a;
  }();
  return loaded;
}

// A cuDNN call that failed: its status, the library's last message and what was being done.
struct CudnnFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char last[512] = {0};
  api().last_error(last, sizeof last);
  throw CudnnFailure(std::string(what) + ": " + api().error_string(status) +
                     (last[0] ? std::string(" (") + last + ")" : std::string()));
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    check(api().create_desc(type, &d_), "create descriptor");
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      if (d_) api().destroy_desc(d_);
      d_ = o.d_;
      o.d_ = nullptr;
    }
    return *this;
  }
  ~Desc() {
    if (d_) api().destroy_desc(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  template <typename V>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const V* values, const char* what) {
    check(api().set_attr(d_, name, type, count, values), what);
  }
  void set_desc(cudnnBackendAttributeName_t name, const Desc& value, const char* what) {
    const cudnnBackendDescriptor_t v = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
  }
  void finalize(const char* what) { check(api().finalize(d_), what); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// The tensors' unique ids in the graphs and variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kdO, kdQ, kdK, kdV };

// A finalized tensor descriptor: 4 dims and element strides, 16-byte aligned (as cudnn-frontend
// gives every tensor); `by_value`: a scalar the variant pack points at in host memory.
Desc tensor(Uid uid, cudnnDataType_t type, const int64_t (&dims)[4], const int64_t (&strides)[4],
            bool by_value = false) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t id = uid, align = 16;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims");
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, "tensor id");
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
  if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "by value");
  t.finalize("tensor");
  return t;
}

// A (B, H, N, D) bf16 view: element strides with row stride `ld` (3C for q, k, v and their
// gradients, C for out and dO); `transposed`: the same memory as (B, H, D, N).
Desc view_tensor(Uid uid, int64_t B, int64_t H, int64_t N, int64_t D, int64_t ld,
                 bool transposed = false) {
  int64_t dims[4] = {B, H, N, D}, strides[4] = {N * ld, D, ld, 1};
  if (transposed) {
    std::swap(dims[2], dims[3]);
    std::swap(strides[2], strides[3]);
  }
  return tensor(uid, CUDNN_DATA_BFLOAT16, dims, strides);
}

// The softmax statistics (B, H, N, 1) fp32: our lse.
Desc stats_tensor(int64_t B, int64_t H, int64_t N) {
  return tensor(kStats, CUDNN_DATA_FLOAT, {B, H, N, 1}, {H * N, N, 1, 1});
}

// The score scale 1 / sqrt(D): an fp32 scalar passed by value.
Desc scale_tensor() {
  return tensor(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true);
}

// A built plan: its descriptors (kept alive with it), workspace bytes, and its engine (the
// global index, and whether cuDNN notes it as nondeterministic).
struct Plan {
  std::vector<Desc> keep;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
  int64_t engine = -1;
  bool nondeterministic = false;
};

// VIT_CUDNN_NONDETERMINISTIC=1: any engine. By default only engines cuDNN does not note as
// nondeterministic (CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, e.g. a backward that adds dQ with
// atomics) are planned, so a run and its resume, or an eager pass and its CUDA graph, keep the
// same bits, as with our kernels; a shape with none left declines to them.
bool any_engine() {
  return env_opt_in("VIT_CUDNN_NONDETERMINISTIC");
}

// The engine of an engine configuration: its global index, and whether its numerical notes
// include NONDETERMINISTIC.
struct EngineFacts {
  int64_t index = -1;
  bool nondeterministic = false;
};
EngineFacts engine_facts(const Desc& config) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  check(api().get_attr(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                       &n, &raw),
        "engine of a configuration");
  EngineFacts f;
  check(api().get_attr(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &f.index),
        "engine index");
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  check(api().get_attr(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes),
        "engine numerical notes");
  for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; ++i)
    f.nondeterministic |= notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  return f;
}

// The engine configurations heuristics `mode` ranks for `graph` (none if it ranks none), and the
// heuristics descriptor they came from.
std::vector<Desc> engine_configs(const Desc& graph, cudnnBackendHeurMode_t mode, Desc& heur) {
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  heur.finalize("heuristics");
  int64_t count = 0;
  check(api().get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                       &count, nullptr),
        "heuristics count");
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  for (const Desc& c : configs) raw.push_back(c.get());
  int64_t got = 0;
  if (count > 0)
    check(api().get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                         count, &got, raw.data()),
          "heuristics results");
  configs.erase(configs.begin() + got, configs.end());  // the ranked ones
  return configs;
}

// The operation graph of `op`, and the first engine configuration (of heuristics mode A's, else
// the fallback list's) that finalizes as an execution plan, skipping nondeterministic engines
// unless any_engine().
void build_plan(Plan& p, cudnnHandle_t handle, Desc op) {
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  const cudnnBackendDescriptor_t ops[1] = {op.get()};
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops, "graph ops");
  graph.finalize("operation graph");
  std::string last = "no engine configuration for the graph";
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    std::vector<Desc> configs;
    try {
      configs = engine_configs(graph, mode, heur);
    } catch (const CudnnFailure& e) {
      last = e.what();
      continue;
    }
    for (Desc& config : configs) {
      try {
        const EngineFacts engine = engine_facts(config);
        if (engine.nondeterministic && !any_engine()) {
          last = "engine " + std::to_string(engine.index) +
                 " is nondeterministic (VIT_CUDNN_NONDETERMINISTIC=1 allows it)";
          continue;
        }
        p.engine = engine.index;
        p.nondeterministic = engine.nondeterministic;
        Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
        plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config, "plan config");
        plan.finalize("execution plan");
        int64_t n = 0;
        check(api().get_attr(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                             1, &n, &p.workspace),
              "plan workspace");
        p.plan = plan.get();
        p.keep.push_back(std::move(plan));
        p.keep.push_back(std::move(config));
        p.keep.push_back(std::move(heur));
        p.keep.push_back(std::move(graph));
        p.keep.push_back(std::move(op));
        return;
      } catch (const CudnnFailure& e) {
        last = e.what();
      }
    }
  }
  throw CudnnFailure("no engine configuration finalized: " + last);
}

// The operation of a direction and shape with the tensors it references (finalized; no handle,
// so no device, needed).
struct Operation {
  Desc op;
  std::vector<Desc> tensors;
};

Operation forward_operation(int64_t B, int64_t N, int64_t H, int64_t D) {
  const int64_t C = H * D;
  Desc q = view_tensor(kQ, B, H, N, D, 3 * C), k = view_tensor(kK, B, H, N, D, 3 * C),
       v = view_tensor(kV, B, H, N, D, 3 * C), o = view_tensor(kO, B, H, N, D, C),
       stats = stats_tensor(B, H, N), scale = scale_tensor();
  Desc op(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, "sdpa q");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k, "sdpa k");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v, "sdpa v");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, "sdpa o");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, stats, "sdpa stats");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale, "sdpa scale");
  op.finalize("sdpa forward operation");
  Operation r{std::move(op), {}};
  for (Desc* t : {&q, &k, &v, &o, &stats, &scale}) r.tensors.push_back(std::move(*t));
  return r;
}

// kv_transposed: K and V described as K^T and V^T (B, H, D, N), the form the backend's
// composite attention backward takes (cudnn-frontend transposes them for it); whether the SDPA
// backward operation wants that or K and V as they are (as its forward does) is the device's to
// say, so plan_for tries both.
Operation backward_operation(int64_t B, int64_t N, int64_t H, int64_t D,
                             bool kv_transposed = false) {
  const int64_t C = H * D;
  Desc q = view_tensor(kQ, B, H, N, D, 3 * C),
       k = view_tensor(kK, B, H, N, D, 3 * C, kv_transposed),
       v = view_tensor(kV, B, H, N, D, 3 * C, kv_transposed), o = view_tensor(kO, B, H, N, D, C),
       d_o = view_tensor(kdO, B, H, N, D, C), dq = view_tensor(kdQ, B, H, N, D, 3 * C),
       dk = view_tensor(kdK, B, H, N, D, 3 * C), dv = view_tensor(kdV, B, H, N, D, 3 * C),
       stats = stats_tensor(B, H, N), scale = scale_tensor();
  Desc op(CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC, q, "sdpa bwd q");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC, k, "sdpa bwd k");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC, v, "sdpa bwd v");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC, o, "sdpa bwd o");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, d_o, "sdpa bwd dO");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, stats, "sdpa bwd stats");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC, scale, "sdpa bwd scale");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC, dq, "sdpa bwd dQ");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, dk, "sdpa bwd dK");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC, dv, "sdpa bwd dV");
  op.finalize("sdpa backward operation");
  Operation r{std::move(op), {}};
  for (Desc* t : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv, &stats, &scale})
    r.tensors.push_back(std::move(*t));
  return r;
}

Plan make_plan(cudnnHandle_t handle, bool forward, int64_t B, int64_t N, int64_t H, int64_t D,
               bool kv_transposed = false) {
  Operation o =
      forward ? forward_operation(B, N, H, D) : backward_operation(B, N, H, D, kv_transposed);
  Plan p;
  build_plan(p, handle, std::move(o.op));
  for (Desc& t : o.tensors) p.keep.push_back(std::move(t));
  return p;
}

// The process's handles (one a device) and plans (one a device, direction and shape); a shape
// cuDNN refused is remembered as refused (empty plan), so it is asked once.
struct State {
  std::mutex mutex;
  std::map<int, cudnnHandle_t> handles;
  // (device, forward, B, N, H, D, any_engine()): a switch flipped within a process plans anew
  std::map<std::tuple<int, bool, Index, Index, Index, Index, bool>, Plan> plans;
  std::set<std::string> said;  // the decline lines already printed
};
State& state() {
  static State* s = new State;  // never destroyed: cuDNN may be unloaded before static dtors
  return *s;
}

// One line on stderr the first time: a decline (`fallback`: the flash kernels run instead) or a
// note.
void say_once(State& s, const std::string& line, bool fallback = true) {
  if (s.said.insert(line).second)
    std::fprintf(stderr, "vitrain: VIT_CUDNN_ATTENTION: %s%s\n", line.c_str(),
                 fallback ? "; using the flash kernels" : "");
}

// The plan of a direction and shape; the backward's with K and V as they are, else as K^T and
// V^T (backward_operation), saying so.
Plan plan_either_way(State& s, cudnnHandle_t handle, bool forward, Index B, Index N, Index H,
                     Index D) {
  if (forward) return make_plan(handle, true, B, N, H, D);
  try {
    return make_plan(handle, false, B, N, H, D);
  } catch (const CudnnFailure& first) {
    try {
      Plan p = make_plan(handle, false, B, N, H, D, true);
      say_once(s, std::string("backward planned with K^T and V^T after: ") + first.what(), false);
      return p;
    } catch (const CudnnFailure& second) {
      throw CudnnFailure(std::string(first.what()) + "; with K^T and V^T: " + second.what());
    }
  }
}

// The plan for this direction and shape on the current device, built on first use; nullptr
// (after one line on stderr) where cuDNN cannot run it.
const Plan* plan_for(bool forward, Index B, Index N, Index H, Index D, cudnnHandle_t* handle) {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  const Api& a = api();
  const size_t need = forward ? 91301 : 91700;
  if (!a.why_not.empty()) {
    say_once(s, a.why_not);
    return nullptr;
  }
  if (a.version < need) {
    say_once(s, "cuDNN " + std::to_string(a.version) + " has no SDPA " +
                    (forward ? "forward" : "backward") + " operation (needs " +
                    std::to_string(need) + ")");
    return nullptr;
  }
  int dev = 0;
  VIT_CUDA_CHECK(cudaGetDevice(&dev));
  try {
    auto h = s.handles.find(dev);
    if (h == s.handles.end()) {
      cudnnHandle_t created = nullptr;
      check(a.create(&created), "cudnnCreate");
      h = s.handles.emplace(dev, created).first;
    }
    *handle = h->second;
    const auto key = std::make_tuple(dev, forward, B, N, H, D, any_engine());
    auto it = s.plans.find(key);
    if (it == s.plans.end()) {
      const std::string shape = std::string(forward ? "forward" : "backward") +
                                " B=" + std::to_string(B) + " N=" + std::to_string(N) +
                                " H=" + std::to_string(H) + " D=" + std::to_string(D);
      Plan p;
      try {
        p = plan_either_way(s, *handle, forward, B, N, H, D);
        say_once(s,
                 shape + ": engine " + std::to_string(p.engine) + ", " +
                     (p.nondeterministic ? "nondeterministic" : "deterministic") + ", " +
                     std::to_string(p.workspace) + " bytes of workspace",
                 false);
      } catch (const CudnnFailure& e) {
        say_once(s, shape + ": " + e.what());
      }
      it = s.plans.emplace(key, std::move(p)).first;
    }
    return it->second.plan ? &it->second : nullptr;
  } catch (const CudnnFailure& e) {
    say_once(s, e.what());
    return nullptr;
  }
}

// Runs the plan on the op stream with these tensors (ids and pointers, the scale added here).
void execute(cudnnHandle_t handle, const Plan& p, std::vector<int64_t> ids,
             std::vector<void*> pointers, float scale) {
  ids.push_back(kScale);
  pointers.push_back(&scale);
  void* workspace = p.workspace > 0 ? scratch(size_t(p.workspace), kScratchCudnn) : nullptr;
  check(api().set_stream(handle, stream()), "cudnnSetStream");
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "workspace");
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()),
           pointers.data(), "data pointers");
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(ids.size()), ids.data(),
           "unique ids");
  pack.finalize("variant pack");
  check(api().execute(handle, p.plan, pack.get()), "execute");
}

// Whether the tensors may be described with 16-byte alignment (every view's base pointer); if
// not, says so once.
bool views_aligned(std::initializer_list<const void*> bases) {
  if (all_aligned16(bases)) return true;
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  say_once(s, "a buffer is not 16-byte aligned");
  return false;
}

}  // namespace

bool cudnn_attention_forward(bf16* out, float* lse, const bf16* qkv, Index B, Index N, Index H,
                             Index D) {
  if (!cudnn_wanted(true)) return false;
  const Index C = H * D;
  if (!views_aligned({out, lse, qkv, qkv + C, qkv + 2 * C})) return false;
  cudnnHandle_t handle = nullptr;
  const Plan* p = plan_for(true, B, N, H, D, &handle);
  if (!p) return false;
  try {
    execute(handle, *p, {kQ, kK, kV, kO, kStats},
            {const_cast<bf16*>(qkv), const_cast<bf16*>(qkv + C), const_cast<bf16*>(qkv + 2 * C),
             out, lse},
            1.0f / std::sqrt(float(D)));
  } catch (const CudnnFailure& e) {
    throw Error(std::string("cuDNN attention forward: ") + e.what());
  }
  ++g_counts.forward;
  g_counts.nondeterministic += p->nondeterministic;
  return true;
}

bool cudnn_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, Index B, Index N, Index H, Index D) {
  if (!cudnn_wanted(false)) return false;
  const Index C = H * D;
  if (!views_aligned({dqkv, dqkv + C, dqkv + 2 * C, dout, qkv, qkv + C, qkv + 2 * C, out, lse}))
    return false;
  cudnnHandle_t handle = nullptr;
  const Plan* p = plan_for(false, B, N, H, D, &handle);
  if (!p) return false;
  auto mut = [](const void* x) { return const_cast<void*>(x); };
  try {
    execute(handle, *p, {kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV},
            {mut(qkv), mut(qkv + C), mut(qkv + 2 * C), mut(out), mut(dout), mut(lse), dqkv,
             dqkv + C, dqkv + 2 * C},
            1.0f / std::sqrt(float(D)));
  } catch (const CudnnFailure& e) {
    throw Error(std::string("cuDNN attention backward: ") + e.what());
  }
  ++g_counts.backward;
  g_counts.nondeterministic += p->nondeterministic;
  return true;
}

std::string cudnn_attention_library() {
  const Api& a = api();
  if (!a.why_not.empty()) return a.why_not;
  return "cuDNN " + std::to_string(a.version);
}

std::string cudnn_attention_check_operation(bool forward, Index B, Index N, Index H, Index D) {
  if (!api().why_not.empty()) return api().why_not;
  try {
    const Operation o = forward ? forward_operation(B, N, H, D) : backward_operation(B, N, H, D);
  } catch (const CudnnFailure& e) {
    return e.what();
  }
  return "";
}

#else  // no cuDNN headers at build time

bool cudnn_attention_forward(bf16*, float*, const bf16*, Index, Index, Index, Index) {
  if (cudnn_wanted(true)) {
    static bool said = false;
    if (!said) std::fprintf(stderr, "vitrain: VIT_CUDNN_ATTENTION: built without cuDNN headers\n");
    said = true;
  }
  return false;
}
bool cudnn_attention_backward(bf16*, const bf16*, const bf16*, const bf16*, const float*, Index,
                              Index, Index, Index) {
  return false;
}
std::string cudnn_attention_library() {
  return "built without cuDNN headers";
}
std::string cudnn_attention_check_operation(bool, Index, Index, Index, Index) {
  return "built without cuDNN headers";
}

#endif

}  // namespace vit::cuda
