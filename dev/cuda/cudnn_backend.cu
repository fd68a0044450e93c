// cuDNN's backend API, loaded at run time: see cudnn_backend.h.
#include "cudnn_backend.h"

#if VIT_CUDNN_HEADERS

#include <dlfcn.h>

#include <utility>

namespace vit::cuda::cudnn {

namespace {

template <typename F>
bool find_symbol(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

Api load() {
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

// The execution plan of `config`, if it finalizes; its workspace size goes to `p`.
Desc finalize_plan(cudnnHandle_t handle, const Desc& config, Plan& p) {
  Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
  plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config, "plan config");
  plan.finalize("execution plan");
  int64_t n = 0;
  check(api().get_attr(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                       &n, &p.workspace),
        "plan workspace");
  return plan;
}

}  // namespace

const Api& api() {
  static const Api loaded = load();
  return loaded;
}

void check(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char last[512] = {0};
  api().last_error(last, sizeof last);
  throw Failure(std::string(what) + ": " + api().error_string(status) +
                (last[0] ? std::string(" (") + last + ")" : std::string()));
}

Desc::Desc(cudnnBackendDescriptorType_t type) {
  check(api().create_desc(type, &d_), "create descriptor");
}

Desc& Desc::operator=(Desc&& o) noexcept {
  if (this != &o) {
    if (d_) api().destroy_desc(d_);
    d_ = o.d_;
    o.d_ = nullptr;
  }
  return *this;
}

Desc::~Desc() {
  if (d_) api().destroy_desc(d_);
}

void Desc::set_desc(cudnnBackendAttributeName_t name, const Desc& value, const char* what) {
  const cudnnBackendDescriptor_t v = value.get();
  set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

Desc tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides, Role role) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t align = 16;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims");
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
  const bool yes = true;
  if (role == Role::kByValue)
    t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "by value");
  if (role == Role::kVirtual)
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "virtual");
  t.finalize("tensor");
  return t;
}

Plan build_plan(cudnnHandle_t handle, Operations o, bool any_engine) {
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Desc& op : o.ops) ops.push_back(op.get());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()),
            ops.data(), "graph ops");
  graph.finalize("operation graph");
  std::string last = "no engine configuration for the graph";
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    std::vector<Desc> configs;
    try {
      configs = engine_configs(graph, mode, heur);
    } catch (const Failure& e) {
      last = e.what();
      continue;
    }
    for (Desc& config : configs) {
      try {
        const EngineFacts engine = engine_facts(config);
        if (engine.nondeterministic && !any_engine) {
          last = "engine " + std::to_string(engine.index) +
                 " is nondeterministic (VIT_CUDNN_NONDETERMINISTIC=1 allows it)";
          continue;
        }
        Plan p;
        p.engine = engine.index;
        p.nondeterministic = engine.nondeterministic;
        Desc plan = finalize_plan(handle, config, p);
        p.plan = plan.get();
        p.keep.push_back(std::move(plan));
        p.keep.push_back(std::move(config));
        p.keep.push_back(std::move(heur));
        p.keep.push_back(std::move(graph));
        for (Desc& d : o.ops) p.keep.push_back(std::move(d));
        for (Desc& d : o.tensors) p.keep.push_back(std::move(d));
        return p;
      } catch (const Failure& e) {
        last = e.what();
      }
    }
  }
  throw Failure("no engine configuration finalized: " + last);
}

}  // namespace vit::cuda::cudnn

#endif  // VIT_CUDNN_HEADERS
