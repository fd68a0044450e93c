// The kernel plan: which kernel every op runs at every shape of a run, and why. Each op family
// has one pure rule, choose(device, op key, options), a function of the device's properties, the
// op's shape and storage type and the user's KernelOptions; the autotuner (ops/autotune.h) may
// replace a rule's pick by the fastest of the candidates that give the same bits. The model
// plans its shapes once (plan_model), the ops look their choice up (an op at a shape the
// model did not plan asks the rule then), and the run folder records the resolved plan
// (kernels.json) so that a resumed run replays it whatever the cache or the rules say then.
//
// The ops of the mixed-precision backends (CUDA bf16 and its CPU emulation, which must choose
// as the GPU does) consult the active plan (ActivePlanScope); without one they follow the rules
// under default options.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "core/common.h"
#include "ops/kernel_options.h"

namespace vit {

class Autotuner;

// What the rules may ask of a device. `major` 0: a host backend (the CPU emulation).
struct DeviceProps {
  std::string name = "host";
  int major = 0, minor = 0;      // compute capability
  int sms = 0;                   // streaming multiprocessors
  int smem_per_block = 0;        // bytes of shared memory a block may opt into
  std::string driver, cublaslt;  // versions, for the autotune cache's key
  int sm() const { return 10 * major + minor; }
  // (name, capability, driver, cuBLASLt, vitrain build): tuned picks are valid only under it.
  std::string cache_key() const;
};
// Stand-ins for the tests: sm 80 (A100), 86 (RTX 3090), 89 (RTX 4090), 90 (H100).
DeviceProps fake_device(int sm);

enum class Storage { kFp32, kBf16 };

// The storage of element type T: fp32, or bf16 (the GPU's bf16, or the emulation's).
template <typename T>
constexpr Storage storage_of() {
  return std::is_same_v<T, float> ? Storage::kFp32 : Storage::kBf16;
}

// The op families the plan chooses for. Dims per family (unused ones 0):
//  attention, flash_forward, flash_backward: B, N, H, D
//  dwconv_forward, dwconv_backward:          B, N, C (N the tokens, prefix included)
//  layernorm:                                R (rows), C
//  embed:                                    B, patches (every op of the patch embedding)
//  pool:                                     B, N, C
//  gelu:                                     elements
//  gemm:                                     M, K, Nout
enum class OpFamily {
  kAttention,
  kFlashForward,
  kFlashBackward,
  kDwconvForward,
  kDwconvBackward,
  kLayernorm,
  kEmbed,
  kPool,
  kGelu,
  kGemm,
};
const char* to_string(OpFamily family);
// Whether the family's candidates all give the same bits (only those are ever tuned).
bool bit_identical_family(OpFamily family);

struct OpKey {
  OpFamily family = OpFamily::kGemm;
  std::array<Index, 4> dims{};
  Storage storage = Storage::kBf16;
  bool operator<(const OpKey& o) const;
  bool operator==(const OpKey& o) const { return !(*this < o) && !(o < *this); }
  // "B=256 N=197 H=6 D=64 bf16"
  std::string shape_text() const;
};

enum class ChoiceWhy { kRule, kTuned, kForced, kRecorded };
const char* to_string(ChoiceWhy why);

// A kernel variant and its one launch parameter (warps, channels a thread, a cuBLASLt
// algorithm's rank; 0 where the variant has none or decides it at launch).
struct KernelChoice {
  std::string variant;
  int param = 0;
  ChoiceWhy why = ChoiceWhy::kRule;
  bool same_kernel(const KernelChoice& o) const { return variant == o.variant && param == o.param; }
};

// The rule for one op key (throws vit::Error where the options ask for what the device or
// shape cannot run, e.g. attention=flash at a head dim with no flash kernel).
KernelChoice choose(const DeviceProps& device, const OpKey& key, const KernelOptions& options);
// The candidates with the rule's bits that the autotuner may time instead (empty: nothing to
// tune, because the family changes bits, an option forces the pick, or there is one kernel).
std::vector<KernelChoice> tune_candidates(const DeviceProps& device, const OpKey& key,
                                          const KernelOptions& options);

// The keys the ops ask with (and plan_model plans), one constructor a family.
OpKey attention_key(OpFamily family, Index B, Index N, Index H, Index D, Storage storage);
OpKey dwconv_key(bool forward, Index B, Index N, Index C, Storage storage);
OpKey layernorm_key(Index R, Index C, Storage storage);
OpKey embed_key(Index B, Index patches, Storage storage);
OpKey pool_key(Index B, Index N, Index C, Storage storage);
OpKey gelu_key(Index n, Storage storage);
OpKey gemm_key(Index M, Index K, Index Nout, Storage storage);

// Head dims the flash kernels are instantiated for (flash_attention.cu's with_head_dim).
bool flash_head_dim_supported(Index D);

class KernelPlan {
 public:
  KernelPlan(DeviceProps device, KernelOptions options);
  const DeviceProps& device() const { return device_; }
  const KernelOptions& options() const { return options_; }

  // The choice for `key`: the recorded one, else the rule's (recorded now). With autotune on,
  // a tunable key not yet decided is timed first through `time_ms` (milliseconds a call of a
  // candidate) where the caller can time it, via the tuner's cache.
  KernelChoice choice(const OpKey& key,
                      const std::function<double(const KernelChoice&)>& time_ms = {});
  // Whether choice(key) would time candidates (the op then passes time_ms).
  bool wants_timing(const OpKey& key) const;
  void set_tuner(std::shared_ptr<Autotuner> tuner) { tuner_ = std::move(tuner); }

  // Takes a recorded plan's entries as they are (why: recorded), so a resumed run runs the
  // kernels its first part ran. Throws vit::Error with one line when the recorded options
  // differ from this plan's in a key that changes bits.
  void replay(const nlohmann::json& recorded);

  // {"device":..., "options": "k=v,...", "plan": [{"op","shape","variant","param","why"}, ...]}
  nlohmann::ordered_json to_json() const;
  size_t size() const;

 private:
  DeviceProps device_;
  KernelOptions options_;
  std::shared_ptr<Autotuner> tuner_;
  mutable std::mutex mutex_;
  std::map<OpKey, KernelChoice> entries_;
};

// The plan the mixed-precision ops consult; null: the rules under default options.
KernelPlan* active_kernel_plan();
// The choice for `key` from the active plan, or the rule's under default options on a generic
// device when none is active.
KernelChoice planned_choice(const OpKey& key,
                            const std::function<double(const KernelChoice&)>& time_ms = {});
bool planned_wants_timing(const OpKey& key);

// Makes `plan` the active one for its lifetime (the previous one after); an engine holds one
// around each of its passes, so engines with different plans share a process (bench --variant).
class ActivePlanScope {
 public:
  explicit ActivePlanScope(KernelPlan* plan);
  ~ActivePlanScope();
  ActivePlanScope(const ActivePlanScope&) = delete;
  ActivePlanScope& operator=(const ActivePlanScope&) = delete;

 private:
  KernelPlan* previous_;
};

}  // namespace vit
