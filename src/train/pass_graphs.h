// The training pass of one micro-batch (forward, loss, backward) replayed as a CUDA graph: one
// launch instead of a few hundred kernel launches, which is what small models on a GPU wait
// for. Host code over a graph policy, so the CPU tests check the rules with a stand-in:
//
//   Ops::Graph                       valid(), launch(); movable
//   Ops::begin_capture()             the ops enqueued from now on are recorded, not run
//   Ops::end_capture(std::string*)   the recording as a Graph (invalid, with the reason, when
//                                    the capture broke)
//   Ops::abort_capture()             ends a capture and drops the recording
//   Ops::epoch()                     moves when memory a graph may name was freed
//
// A pass is identified by what its kernels' arguments depend on (PassKey). The first pass of a
// key runs eagerly: it sizes the scratch buffers and plans the GEMMs, which must not happen
// while capturing. The second is captured, then launched; later ones replay. A capture that
// breaks turns graphs off (the pass then runs eagerly, and every later one, until turn_on): a
// model whose ops cannot be captured still trains, at the eager speed, and says why once.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/common.h"

namespace vit {

// What a pass's recorded kernels depend on besides the weights, activations and gradients at
// their fixed addresses: the input buffers, the batch, the image size (token count and the
// parameter table's layout), the loss scale and whether stochastic depth scales the branches.
struct PassKey {
  const void* images = nullptr;
  const void* targets = nullptr;
  Index batch = 0;
  int img_size = 0;
  float loss_scale = 0;
  bool drop_path = false;
  bool operator==(const PassKey& o) const {
    return images == o.images && targets == o.targets && batch == o.batch &&
           img_size == o.img_size && drop_path == o.drop_path &&
           std::memcmp(&loss_scale, &o.loss_scale, sizeof(float)) == 0;  // the bits the kernels see
  }
};

template <class Ops>
class PassGraphs {
 public:
  using Graph = typename Ops::Graph;
  // capacity: graphs kept (the least recently used goes first); two input slots times a few
  // image sizes of a curriculum fit in the default.
  explicit PassGraphs(size_t capacity = 8) : capacity_(capacity < 1 ? 1 : capacity) {}

  bool enabled() const { return enabled_; }
  const std::string& off_reason() const { return off_reason_; }  // why enabled() turned false
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }  // launches of a graph captured earlier
  // Drops every graph: the next passes run eagerly and are captured anew, so a kernel switch
  // flipped since (an environment variable its op reads at each call) takes effect, or memory a
  // graph may name was freed (epoch). Call with nothing in flight (a graph being destroyed must
  // not be running).
  void forget_all() {
    entries_.clear();
    epoch_ = Ops::epoch();
  }
  // forget_all(), and graphs on again if a capture broke and turned them off: the switch whose
  // kernels broke it may be gone (bench --variant: one variant's kernels must not leave the next
  // ones without graphs). A capture that breaks again turns them off again.
  void turn_on() {
    forget_all();
    enabled_ = true;
    off_reason_.clear();
  }

  // Runs pass() for `key`: eagerly, or captured and launched, or replayed (see the header).
  template <class F>
  void run(const PassKey& key, F&& pass) {
    if (!enabled_) return pass();
    if (epoch_ != Ops::epoch()) forget_all();
    Entry* e = find(key);
    if (e && e->graph.valid()) {
      e->used = ++clock_;
      e->graph.launch();
      ++replays_;
      return;
    }
    if (!e) {  // first sight: eager, and remember the key
      make_room();
      entries_.push_back(Entry{key, Graph{}, ++clock_});
      return pass();
    }
    capture(*e, pass);
  }

 private:
  struct Entry {
    PassKey key;
    Graph graph;  // invalid until captured
    uint64_t used = 0;
  };

  // Captures the pass and launches the graph (nothing ran while capturing). Whatever breaks
  // on the way turns graphs off and runs the pass eagerly instead: a real error then throws
  // again, one of the capture alone does not.
  template <class F>
  void capture(Entry& e, F& pass) {
    try {
      Ops::begin_capture();
    } catch (const std::exception& err) {
      turn_off(std::string("the capture did not start: ") + err.what());
      return pass();
    }
    try {
      pass();
    } catch (const std::exception& err) {
      Ops::abort_capture();  // restores the op stream
      turn_off(std::string("the pass threw while capturing: ") + err.what());
      return pass();
    } catch (...) {
      Ops::abort_capture();
      throw;
    }
    std::string why;
    Graph g = Ops::end_capture(&why);
    if (!g.valid()) {
      turn_off(why.empty() ? std::string("the capture failed") : why);
      return pass();
    }
    try {
      g.launch();
    } catch (const std::exception& err) {
      turn_off(std::string("the graph did not launch: ") + err.what());
      return pass();
    }
    e.graph = std::move(g);
    e.used = ++clock_;
    ++captures_;
  }
  Entry* find(const PassKey& key) {
    for (Entry& e : entries_)
      if (e.key == key) return &e;
    return nullptr;
  }
  void make_room() {
    if (entries_.size() < capacity_) return;
    size_t oldest = 0;
    for (size_t i = 1; i < entries_.size(); ++i)
      if (entries_[i].used < entries_[oldest].used) oldest = i;
    entries_.erase(entries_.begin() + std::ptrdiff_t(oldest));
  }
  void turn_off(std::string why) {
    enabled_ = false;
    off_reason_ = std::move(why);
    entries_.clear();
  }

  size_t capacity_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  uint64_t epoch_ = Ops::epoch();
  bool enabled_ = true;
  std::string off_reason_;
  int64_t captures_ = 0, replays_ = 0;
};

// A policy for backends without graphs (the host ones): the engine never makes PassGraphs of
// it, but the code that would compiles.
struct NoGraphOps {
  struct Graph {
    bool valid() const { return false; }
    void launch() const {}
  };
  static void begin_capture() {}
  static Graph end_capture(std::string* why) {
    if (why) *why = "this backend has no graphs";
    return {};
  }
  static void abort_capture() {}
  static uint64_t epoch() { return 0; }
};

// The backend's graph policy: Backend::GraphOps, else NoGraphOps.
template <class Backend, class = void>
struct GraphOpsOf {
  using type = NoGraphOps;
};
template <class Backend>
struct GraphOpsOf<Backend, std::void_t<typename Backend::GraphOps>> {
  using type = typename Backend::GraphOps;
};

}  // namespace vit
