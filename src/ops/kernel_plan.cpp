#include "ops/kernel_plan.h"

#include <algorithm>
#include <tuple>

#include "ops/autotune.h"
#include "ops/layernorm_layout.h"

#ifndef VIT_BUILD_ID
#define VIT_BUILD_ID "unknown"
#endif

namespace vit {

std::string DeviceProps::cache_key() const {
  return name + "|sm" + std::to_string(sm()) + "|driver " + driver + "|cublaslt " + cublaslt +
         "|vitrain " + VIT_BUILD_ID;
}

DeviceProps fake_device(int sm) {
  DeviceProps d;
  d.major = sm / 10;
  d.minor = sm % 10;
  switch (sm) {
    case 80:
      d.name = "NVIDIA A100-SXM4-80GB", d.sms = 108, d.smem_per_block = 232448;
      break;
    case 86:
      d.name = "NVIDIA GeForce RTX 3090", d.sms = 82, d.smem_per_block = 101376;
      break;
    case 89:
      d.name = "NVIDIA GeForce RTX 4090", d.sms = 128, d.smem_per_block = 101376;
      break;
    case 90:
      d.name = "NVIDIA H100 80GB HBM3", d.sms = 132, d.smem_per_block = 232448;
      break;
    default:
      VIT_CHECK(false, "fake_device: no stand-in for sm " + std::to_string(sm));
  }
  d.driver = "fake";
  d.cublaslt = "fake";
  return d;
}

const char* to_string(OpFamily family) {
  switch (family) {
    case OpFamily::kAttention:
      return "attention";
    case OpFamily::kFlashForward:
      return "flash_forward";
    case OpFamily::kFlashBackward:
      return "flash_backward";
    case OpFamily::kDwconvForward:
      return "dwconv_forward";
    case OpFamily::kDwconvBackward:
      return "dwconv_backward";
    case OpFamily::kLayernorm:
      return "layernorm";
    case OpFamily::kEmbed:
      return "embed";
    case OpFamily::kPool:
      return "pool";
    case OpFamily::kGelu:
      return "gelu";
    case OpFamily::kGemm:
      return "gemm";
  }
  return "?";
}

bool bit_identical_family(OpFamily family) {
  switch (family) {
    case OpFamily::kFlashForward:
    case OpFamily::kFlashBackward:
    case OpFamily::kDwconvForward:
    case OpFamily::kDwconvBackward:
    case OpFamily::kEmbed:
    case OpFamily::kPool:
      return true;
    default:
      return false;  // attention, gelu: other formulas; layernorm: other sums; gemm: cuBLASLt's
                     // algorithms may split K
  }
}

const char* to_string(ChoiceWhy why) {
  switch (why) {
    case ChoiceWhy::kRule:
      return "rule";
    case ChoiceWhy::kTuned:
      return "tuned";
    case ChoiceWhy::kForced:
      return "forced";
    case ChoiceWhy::kRecorded:
      return "recorded";
  }
  return "?";
}

namespace {

const char* storage_name(Storage s) {
  return s == Storage::kBf16 ? "bf16" : "fp32";
}

// The dims' letters a family's key prints.
std::vector<const char*> dim_letters(OpFamily family) {
  switch (family) {
    case OpFamily::kAttention:
    case OpFamily::kFlashForward:
    case OpFamily::kFlashBackward:
      return {"B", "N", "H", "D"};
    case OpFamily::kLayernorm:
      return {"R", "C"};
    case OpFamily::kGelu:
      return {"n"};
    case OpFamily::kGemm:
      return {"M", "K", "Nout"};
    case OpFamily::kEmbed:
      return {"B", "patches"};
    default:
      return {"B", "N", "C"};
  }
}

OpKey make_key(OpFamily family, std::array<Index, 4> dims, Storage storage) {
  OpKey k;
  k.family = family;
  k.dims = dims;
  k.storage = storage;
  return k;
}

// The mma.sync flash kernels need bf16 tensor-core instructions (sm 80 on); a host backend
// (major 0, the emulation) follows the GPU's choice.
bool device_has_bf16_mma(const DeviceProps& d) {
  return d.major == 0 || d.sm() >= 80;
}

KernelChoice forced_or_rule(const std::string& variant, int forced, int rule) {
  return forced > 0 ? KernelChoice{variant, forced, ChoiceWhy::kForced}
                    : KernelChoice{variant, rule, ChoiceWhy::kRule};
}

KernelChoice choose_attention(const DeviceProps& d, const OpKey& k, const KernelOptions& o) {
  const Index D = k.dims[3];
  const bool flash_here =
      flash_head_dim_supported(D) && (k.storage == Storage::kFp32 || device_has_bf16_mma(d));
  switch (o.attention) {
    case AttentionOption::kUnfused:
      return {"unfused", 0, ChoiceWhy::kForced};
    case AttentionOption::kFlash:
      VIT_CHECK(flash_here, "--kernels attention=flash: no flash kernel for head dim " +
                                std::to_string(D) + " on " + d.name +
                                " (head dims 32, 48, 64, 96; bf16 needs compute capability 8.0)");
      return {"flash", 0, ChoiceWhy::kForced};
    case AttentionOption::kAuto:
      break;
  }
  return {flash_here ? "flash" : "unfused", 0, ChoiceWhy::kRule};
}

// Flash kernels: bf16 on the mma.sync set with its block height (0: by occupancy at launch),
// fp32 on the FMA set (the debugging mode, one height).
KernelChoice choose_flash(const KernelOptions& o, const OpKey& k) {
  if (k.storage == Storage::kFp32) return {"fma", 0, ChoiceWhy::kRule};
  return forced_or_rule("mma", o.flash_warps, 0);
}

// Depthwise 3x3: two channels a thread (paired loads) where C is even. The forward pairs by
// rule, the backward does not (its registers grow past what pairing saves).
KernelChoice choose_dwconv(const KernelOptions& o, const OpKey& k) {
  const bool forward = k.family == OpFamily::kDwconvForward;
  const int forced = forward ? o.dwconv_forward : o.dwconv_backward;
  const bool even = k.dims[2] % 2 == 0;
  if (forced == 2)
    VIT_CHECK(even, std::string("--kernels ") + (forward ? "dwconv_forward" : "dwconv_backward") +
                        "=2: needs an even channel count, not " + std::to_string(k.dims[2]));
  return forced_or_rule("columns", forced, forward && even ? 2 : 1);
}

KernelChoice choose_width(WidthOption forced) {
  if (forced != WidthOption::kAuto)
    return {forced == WidthOption::kWide ? "wide" : "narrow", 0, ChoiceWhy::kForced};
  return {"wide", 0, ChoiceWhy::kRule};
}

}  // namespace

bool OpKey::operator<(const OpKey& o) const {
  return std::tie(family, dims, storage) < std::tie(o.family, o.dims, o.storage);
}

std::string OpKey::shape_text() const {
  std::string out;
  const auto letters = dim_letters(family);
  for (size_t i = 0; i < letters.size(); ++i)
    out += std::string(letters[i]) + "=" + std::to_string(dims[i]) + " ";
  return out + storage_name(storage);
}

OpKey attention_key(OpFamily family, Index B, Index N, Index H, Index D, Storage storage) {
  return make_key(family, {B, N, H, D}, storage);
}
OpKey dwconv_key(bool forward, Index B, Index N, Index C, Storage storage) {
  return make_key(forward ? OpFamily::kDwconvForward : OpFamily::kDwconvBackward, {B, N, C, 0},
                  storage);
}
OpKey layernorm_key(Index R, Index C, Storage storage) {
  return make_key(OpFamily::kLayernorm, {R, C, 0, 0}, storage);
}
OpKey embed_key(Index B, Index patches, Storage storage) {
  return make_key(OpFamily::kEmbed, {B, patches, 0, 0}, storage);
}
OpKey pool_key(Index B, Index N, Index C, Storage storage) {
  return make_key(OpFamily::kPool, {B, N, C, 0}, storage);
}
OpKey gelu_key(Index n, Storage storage) {
  return make_key(OpFamily::kGelu, {n, 0, 0, 0}, storage);
}
OpKey gemm_key(Index M, Index K, Index Nout, Storage storage) {
  return make_key(OpFamily::kGemm, {M, K, Nout, 0}, storage);
}

bool flash_head_dim_supported(Index D) {
  return D == 32 || D == 48 || D == 64 || D == 96;
}

KernelChoice choose(const DeviceProps& device, const OpKey& key, const KernelOptions& options) {
  switch (key.family) {
    case OpFamily::kAttention:
      return choose_attention(device, key, options);
    case OpFamily::kFlashForward:
    case OpFamily::kFlashBackward:
      return choose_flash(options, key);
    case OpFamily::kDwconvForward:
    case OpFamily::kDwconvBackward:
      return choose_dwconv(options, key);
    case OpFamily::kLayernorm: {
      // The 16-byte kernels sum a row in another order than the row-in-registers ones: which one
      // runs follows from C alone (and 16-byte aligned tensors, as the arena's are).
      const bool vec = key.storage == Storage::kBf16 && layernorm_layout_for(key.dims[1]).group > 0;
      return {vec ? "vec16" : "rows", 0, ChoiceWhy::kRule};
    }
    case OpFamily::kEmbed:
      return choose_width(options.embed);
    case OpFamily::kPool:
      return choose_width(options.pool);
    case OpFamily::kGelu:
      return options.gelu == GeluOption::kFast ? KernelChoice{"fast", 0, ChoiceWhy::kForced}
                                               : KernelChoice{"erf", 0, ChoiceWhy::kRule};
    case OpFamily::kGemm:
      return {"cublaslt", 0, ChoiceWhy::kRule};
  }
  return {};
}

std::vector<KernelChoice> tune_candidates(const DeviceProps& device, const OpKey& key,
                                          const KernelOptions& options) {
  if (!bit_identical_family(key.family)) return {};
  const KernelChoice rule = choose(device, key, options);
  if (rule.why == ChoiceWhy::kForced) return {};
  std::vector<KernelChoice> out;
  switch (key.family) {
    case OpFamily::kFlashForward:
    case OpFamily::kFlashBackward:
      if (rule.variant != "mma") return {};
      for (int warps = 1; warps <= 4; ++warps) out.push_back({"mma", warps, ChoiceWhy::kTuned});
      break;
    case OpFamily::kDwconvForward:
      if (key.dims[2] % 2 != 0) return {};
      out = {{"columns", 1, ChoiceWhy::kTuned}, {"columns", 2, ChoiceWhy::kTuned}};
      break;
    case OpFamily::kEmbed:
      out = {{"narrow", 0, ChoiceWhy::kTuned}, {"wide", 0, ChoiceWhy::kTuned}};
      break;
      // dwconv_backward and pool: they accumulate (the weight gradient, dx), so they cannot be
      // timed by repeating them on their own arguments; the rule's pick (or a forced one) stands.

    default:
      return {};
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

KernelPlan::KernelPlan(DeviceProps device, KernelOptions options)
    : device_(std::move(device)), options_(std::move(options)) {}

bool KernelPlan::wants_timing(const OpKey& key) const {
  if (!options_.autotune || !tuner_) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.count(key)) return false;
  }
  return !tune_candidates(device_, key, options_).empty();
}

KernelChoice KernelPlan::choice(const OpKey& key,
                                const std::function<double(const KernelChoice&)>& time_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const auto it = entries_.find(key); it != entries_.end()) return it->second;
  }
  KernelChoice pick = choose(device_, key, options_);
  if (time_ms && wants_timing(key))
    pick = tuner_->pick(device_.cache_key(), key, tune_candidates(device_, key, options_), time_ms);
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.emplace(key, pick).first->second;
}

void KernelPlan::replay(const nlohmann::json& recorded) {
  VIT_CHECK(recorded.is_object() && recorded.contains("options") && recorded.contains("plan"),
            "kernels.json: not a kernel plan (no options or plan)");
  const KernelOptions then = parse_kernel_options(recorded.at("options").get<std::string>());
  const auto changed = bit_changing_differences(then, options_);
  VIT_CHECK(changed.empty(), "--resume: the run was trained with other kernels (" + changed[0] +
                                 "); resume with --kernels " + to_string(then) +
                                 " or start a new run");
  std::map<OpKey, KernelChoice> entries;
  for (const auto& e : recorded.at("plan")) {
    OpKey key;
    key.family = OpFamily(e.at("family").get<int>());
    const auto dims = e.at("dims").get<std::vector<Index>>();
    VIT_CHECK(dims.size() == 4, "kernels.json: an entry's dims are not four numbers");
    std::copy(dims.begin(), dims.end(), key.dims.begin());
    key.storage = e.at("storage").get<std::string>() == "bf16" ? Storage::kBf16 : Storage::kFp32;
    KernelChoice c{e.at("variant").get<std::string>(), e.at("param").get<int>(),
                   ChoiceWhy::kRecorded};
    // A recorded pick that changes bits must be what this plan's rule would pick: a rule that
    // changed between builds would otherwise change results silently.
    if (!bit_identical_family(key.family)) {
      const KernelChoice now = choose(device_, key, options_);
      VIT_CHECK(now.same_kernel(c), std::string("--resume: ") + to_string(key.family) + " " +
                                        key.shape_text() + " ran " + c.variant + ", this build " +
                                        "picks " + now.variant + " (other results); use the " +
                                        "build that started the run");
    }
    entries[key] = c;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, c] : entries) entries_[key] = c;
}

nlohmann::ordered_json KernelPlan::to_json() const {
  nlohmann::ordered_json out;
  out["device"] = device_.name;
  out["compute_capability"] = std::to_string(device_.major) + "." + std::to_string(device_.minor);
  out["options"] = to_string(options_);
  auto plan = nlohmann::ordered_json::array();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, c] : entries_) {
    nlohmann::ordered_json e;
    e["op"] = to_string(key.family);
    e["shape"] = key.shape_text();
    e["variant"] = c.variant;
    e["param"] = c.param;
    e["why"] = to_string(c.why);
    e["family"] = int(key.family);
    e["dims"] = std::vector<Index>(key.dims.begin(), key.dims.end());
    e["storage"] = storage_name(key.storage);
    plan.push_back(std::move(e));
  }
  out["plan"] = std::move(plan);
  return out;
}

size_t KernelPlan::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

// ---------------------------------------------------------------------------------------------

namespace {
KernelPlan*& active_slot() {
  static KernelPlan* active = nullptr;
  return active;
}
}  // namespace

KernelPlan* active_kernel_plan() {
  return active_slot();
}

KernelChoice planned_choice(const OpKey& key,
                            const std::function<double(const KernelChoice&)>& time_ms) {
  if (KernelPlan* plan = active_slot()) return plan->choice(key, time_ms);
  static const DeviceProps generic;
  static const KernelOptions defaults;
  return choose(generic, key, defaults);
}

bool planned_wants_timing(const OpKey& key) {
  const KernelPlan* plan = active_slot();
  return plan && plan->wants_timing(key);
}

ActivePlanScope::ActivePlanScope(KernelPlan* plan) : previous_(active_slot()) {
  active_slot() = plan;
}
ActivePlanScope::~ActivePlanScope() {
  active_slot() = previous_;
}

}  // namespace vit
