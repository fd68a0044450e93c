// The autotuner: times an op's bit-identical candidates (ops/kernel_plan.h tune_candidates) once
// per (device and library versions, op, shape, storage) and keeps the fastest, in memory and in
// a JSON file under the user's cache directory, so the next run on that machine starts with the
// pick. A pick is valid only under the key it was timed under: another GPU, driver, cuBLASLt or
// vitrain build misses and times again. Families whose candidates change bits are refused.
#pragma once
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ops/kernel_plan.h"

namespace vit {

// $XDG_CACHE_HOME/vitrain/autotune.json, else $HOME/.cache/vitrain/autotune.json; "" (no disk
// cache) when neither is set.
std::string default_autotune_cache_path();

class Autotuner {
 public:
  // `path` "": memory only. A missing file is an empty cache; an unreadable or malformed one
  // is reported once on stderr and ignored (timing again costs seconds, never a run).
  explicit Autotuner(std::string path);

  // The fastest of `candidates` for `key` under `device_key`: the cached pick if one is
  // there, else each candidate timed `repeats` times through time_ms (median) and the pick
  // stored (and written to disk). Throws vit::Error for a family that changes bits or an empty
  // candidate list.
  KernelChoice pick(const std::string& device_key, const OpKey& key,
                    const std::vector<KernelChoice>& candidates,
                    const std::function<double(const KernelChoice&)>& time_ms, int repeats = 5);

  size_t timed_count() const { return timed_; }  // picks made by timing (not from the cache)

 private:
  void load();
  void save() const;
  std::string path_;
  mutable std::mutex mutex_;
  std::map<std::string, KernelChoice> picks_;  // device_key | op | shape -> pick
  size_t timed_ = 0;
};

}  // namespace vit
