// cuDNN's fused attention as an alternative to the flash kernels for bf16 (VIT_CUDNN_ATTENTION=1,
// or fwd / bwd for one direction), so the two can be timed side by side.
//
// The library is loaded at run time (cudnn_backend.h); a machine without cuDNN, or with one too
// old for every graph, runs our kernels after one line on stderr saying why. The graphs
// (cudnn_attention_graphs.h): the SDPA forward operation; for the backward, the composite graph
// (cudnn-frontend's deterministic route on Hopper) and the SDPA backward operation, tried in the
// order backward_routes() says. Q, K, V, O (and dO, dQ, dK, dV) are strided views of qkv
// (B, N, 3C) and out (B, N, C) as (B, H, N, D), no copies; the softmax statistics are our lse
// (B, H, N): the natural-log log-sum-exp of the scaled scores in both, so either direction may
// run with the other's kernels. Plans are built once a (device, shape, switches) and kept; the
// workspace is a scratch slot. Only engines cuDNN does not note as nondeterministic are planned
// (any_engine), and each plan's route and engine are said once on stderr. Not bitwise the
// emulation's rounding: an opt-in to measure.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cudnn_attention.h"
#include "cudnn_attention_graphs.h"
#include "cudnn_backend.h"
#include "ops/cuda/common.cuh"

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

using namespace cudnn;

// VIT_CUDNN_NONDETERMINISTIC=1: any engine. By default only engines cuDNN does not note as
// nondeterministic (CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, e.g. a backward that adds dQ with
// atomics) are planned, so a run and its resume, or an eager pass and its CUDA graph, keep the
// same bits, as with our kernels; a shape with none left declines to them.
bool any_engine() {
  const char* env = std::getenv("VIT_CUDNN_NONDETERMINISTIC");
  return env && env[0] == '1';
}

// The backward's two graphs: cuDNN's SDPA backward operation, and the composite graph
// (cudnn_attention_graphs.h), cudnn-frontend's deterministic backward on Hopper.
enum class Route { kForward, kOperation, kComposite };
const char* route_name(Route r) {
  return r == Route::kForward     ? "forward"
         : r == Route::kOperation ? "backward (SDPA operation)"
                                  : "backward (composite graph)";
}

// The backward's routes in the order tried. VIT_CUDNN_BWD=op or graph: that one only. Else the
// composite graph first (the documented deterministic route) unless any engine may run, when
// the operation (cuDNN's own choice) goes first; either way the other after it. Another value
// says so once on stderr and counts as unset.
std::vector<Route> backward_routes() {
  const char* env = std::getenv("VIT_CUDNN_BWD");
  const std::string want = env ? env : "";
  if (want == "op") return {Route::kOperation};
  if (want == "graph") return {Route::kComposite};
  static bool said = false;
  if (!want.empty() && !said) {
    std::fprintf(stderr, "vitrain: VIT_CUDNN_BWD=%s is neither op nor graph; trying both\n",
                 want.c_str());
    said = true;
  }
  if (any_engine()) return {Route::kOperation, Route::kComposite};
  return {Route::kComposite, Route::kOperation};
}

// A route's plan for a shape (the graph it runs), or why cuDNN refused it (an empty plan).
struct Planned {
  Plan plan;
  Route route = Route::kForward;
  std::string why_not;
};

// The process's handles (one a device) and plans (one a device, route, shape and engine rule);
// a route cuDNN refused is remembered as refused, so it is asked once.
struct State {
  std::mutex mutex;
  std::map<int, cudnnHandle_t> handles;
  // (device, route, B, N, H, D, any_engine()): VIT_CUDNN_BWD only reorders the routes, so a
  // forced route reuses the plan the default order built
  std::map<std::tuple<int, Route, Index, Index, Index, Index, bool>, Planned> plans;
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

// The cuDNN a route needs: the SDPA forward operation 9.13.1, the backward operation 9.17; the
// composite graph is older than both.
size_t version_needed(Route r) {
  return r == Route::kForward ? 91301 : r == Route::kOperation ? 91700 : 90000;
}

// The plan of one route; the SDPA backward operation's with K and V as they are, else as K^T
// and V^T (backward_operation), saying so.
Plan plan_route(State& s, cudnnHandle_t handle, Route r, Index B, Index N, Index H, Index D) {
  if (api().version < version_needed(r))
    throw Failure("cuDNN " + std::to_string(api().version) + " is older than " +
                  std::to_string(version_needed(r)));
  const bool any = any_engine();
  if (r == Route::kForward) return build_plan(handle, forward_operation(B, N, H, D), any);
  if (r == Route::kComposite) return build_plan(handle, composite_backward(B, N, H, D), any);
  try {
    return build_plan(handle, backward_operation(B, N, H, D, false), any);
  } catch (const Failure& first) {
    try {
      Plan p = build_plan(handle, backward_operation(B, N, H, D, true), any);
      say_once(s, std::string("backward planned with K^T and V^T after: ") + first.what(), false);
      return p;
    } catch (const Failure& second) {
      throw Failure(std::string(first.what()) + "; with K^T and V^T: " + second.what());
    }
  }
}

std::string shape_name(Index B, Index N, Index H, Index D) {
  return "B=" + std::to_string(B) + " N=" + std::to_string(N) + " H=" + std::to_string(H) +
         " D=" + std::to_string(D);
}

// A route's plan for a shape, saying on what engine; refused (why_not), if cuDNN refuses it.
Planned plan_one(State& s, cudnnHandle_t handle, Route r, Index B, Index N, Index H, Index D) {
  Planned p;
  p.route = r;
  try {
    p.plan = plan_route(s, handle, r, B, N, H, D);
    say_once(s,
             std::string(route_name(r)) + " " + shape_name(B, N, H, D) + ": engine " +
                 std::to_string(p.plan.engine) + ", " +
                 (p.plan.nondeterministic ? "nondeterministic" : "deterministic") + ", " +
                 std::to_string(p.plan.workspace) + " bytes of workspace",
             false);
  } catch (const Failure& e) {
    p.why_not = std::string(route_name(r)) + ": " + e.what();
  }
  return p;
}

// The plan for this direction and shape on the current device: the first of its routes that
// cuDNN plans, each built on first use; nullptr (after one line on stderr saying why each
// route was refused) where none is.
const Planned* plan_for(bool forward, Index B, Index N, Index H, Index D, cudnnHandle_t* handle) {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  const Api& a = api();
  if (!a.why_not.empty()) {
    say_once(s, a.why_not);
    return nullptr;
  }
  if (B <= 0 || N <= 0 || H <= 0 || D <= 0) return nullptr;  // cuDNN 9.19 divides by a 0 dim
  const std::vector<Route> routes =
      forward ? std::vector<Route>{Route::kForward} : backward_routes();
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
    std::string why;
    for (const Route r : routes) {
      const auto key = std::make_tuple(dev, r, B, N, H, D, any_engine());
      auto it = s.plans.find(key);
      if (it == s.plans.end()) it = s.plans.emplace(key, plan_one(s, *handle, r, B, N, H, D)).first;
      if (it->second.plan.plan) return &it->second;
      why += (why.empty() ? "" : "; ") + it->second.why_not;
    }
    say_once(s, shape_name(B, N, H, D) + ": " + why);
    return nullptr;
  } catch (const Failure& e) {
    say_once(s, e.what());
    return nullptr;
  }
}

// Runs the plan on the op stream with these tensors (ids and pointers; the scale, and the
// composite graph's 1 and softmax_sum buffer, added here).
void execute(cudnnHandle_t handle, const Planned& p, std::vector<int64_t> ids,
             std::vector<void*> pointers, float scale, Index B, Index N, Index H) {
  float one = 1.0f;
  ids.push_back(kScale);
  pointers.push_back(&scale);
  if (p.route == Route::kComposite) {
    ids.push_back(kOne);
    pointers.push_back(&one);
    ids.push_back(kSoftmaxSum);  // (B, H, N) fp32: the slot of the flash backward's Drow
    pointers.push_back(scratch(size_t(B * H * N) * sizeof(float), kScratchFlash));
  }
  const int64_t bytes = p.plan.workspace;
  // the unfused attention's slot: never live while the fused attention runs
  void* workspace = bytes > 0 ? scratch(size_t(bytes), kScratchAttScores) : nullptr;
  check(api().set_stream(handle, stream()), "cudnnSetStream");
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "workspace");
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()),
           pointers.data(), "data pointers");
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(ids.size()), ids.data(),
           "unique ids");
  pack.finalize("variant pack");
  check(api().execute(handle, p.plan.plan, pack.get()), "execute");
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
  const Planned* p = plan_for(true, B, N, H, D, &handle);
  if (!p) return false;
  try {
    execute(handle, *p, {kQ, kK, kV, kO, kStats},
            {const_cast<bf16*>(qkv), const_cast<bf16*>(qkv + C), const_cast<bf16*>(qkv + 2 * C),
             out, lse},
            1.0f / std::sqrt(float(D)), B, N, H);
  } catch (const Failure& e) {
    throw Error(std::string("cuDNN attention forward: ") + e.what());
  }
  ++g_counts.forward;
  g_counts.nondeterministic += p->plan.nondeterministic;
  return true;
}

bool cudnn_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, Index B, Index N, Index H, Index D) {
  if (!cudnn_wanted(false)) return false;
  const Index C = H * D;
  if (!views_aligned({dqkv, dqkv + C, dqkv + 2 * C, dout, qkv, qkv + C, qkv + 2 * C, out, lse}))
    return false;
  cudnnHandle_t handle = nullptr;
  const Planned* p = plan_for(false, B, N, H, D, &handle);
  if (!p) return false;
  auto mut = [](const void* x) { return const_cast<void*>(x); };
  try {
    execute(handle, *p, {kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV},
            {mut(qkv), mut(qkv + C), mut(qkv + 2 * C), mut(out), mut(dout), mut(lse), dqkv,
             dqkv + C, dqkv + 2 * C},
            1.0f / std::sqrt(float(D)), B, N, H);
  } catch (const Failure& e) {
    throw Error(std::string("cuDNN attention backward: ") + e.what());
  }
  ++g_counts.backward;
  g_counts.composite += p->route == Route::kComposite;
  g_counts.nondeterministic += p->plan.nondeterministic;
  return true;
}

std::string cudnn_attention_library() {
  const Api& a = api();
  if (!a.why_not.empty()) return a.why_not;
  return "cuDNN " + std::to_string(a.version);
}

std::string cudnn_attention_check_graph(CudnnAttentionGraph g, Index B, Index N, Index H, Index D) {
  if (!api().why_not.empty()) return api().why_not;
  try {
    const Operations o = g == CudnnAttentionGraph::kForward ? forward_operation(B, N, H, D)
                         : g == CudnnAttentionGraph::kBackwardOperation
                             ? backward_operation(B, N, H, D, false)
                             : composite_backward(B, N, H, D);
  } catch (const Failure& e) {
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
std::string cudnn_attention_check_graph(CudnnAttentionGraph, Index, Index, Index, Index) {
  return "built without cuDNN headers";
}

#endif

}  // namespace vit::cuda
