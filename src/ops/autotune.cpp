#include "ops/autotune.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/warning.h"
#include "io/atomic_file.h"

namespace vit {

namespace {

constexpr int kCacheFormat = 1;

std::string entry_key(const std::string& device_key, const OpKey& key) {
  return device_key + "|" + to_string(key.family) + "|" + key.shape_text();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string default_autotune_cache_path() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/vitrain/autotune.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/vitrain/autotune.json";
  return "";
}

Autotuner::Autotuner(std::string path) : path_(std::move(path)) {
  load();
}

void Autotuner::load() {
  if (path_.empty() || !std::filesystem::exists(path_)) return;
  try {
    const auto j = nlohmann::json::parse(io::read_file(path_));
    if (j.value("format", 0) != kCacheFormat) return;  // another layout: time again
    for (const auto& [k, v] : j.at("picks").items())
      picks_[k] = KernelChoice{v.at("variant").get<std::string>(), v.at("param").get<int>(),
                               ChoiceWhy::kTuned};
  } catch (const std::exception& e) {
    warn(std::string("ignoring the autotune cache ") + path_ + " (" + e.what() + ")");
    picks_.clear();
  }
}

void Autotuner::save() const {
  if (path_.empty()) return;
  nlohmann::ordered_json j;
  j["format"] = kCacheFormat;
  auto& picks = j["picks"] = nlohmann::ordered_json::object();
  for (const auto& [k, c] : picks_) picks[k] = {{"variant", c.variant}, {"param", c.param}};
  try {
    std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
    io::write_file_atomic(path_, j.dump(1) + "\n");
  } catch (const std::exception& e) {
    warn(std::string("cannot write the autotune cache ") + path_ + " (" + e.what() + ")");
  }
}

KernelChoice Autotuner::pick(const std::string& device_key, const OpKey& key,
                             const std::vector<KernelChoice>& candidates,
                             const std::function<double(const KernelChoice&)>& time_ms,
                             int repeats) {
  VIT_CHECK(bit_identical_family(key.family),
            std::string("autotune: ") + to_string(key.family) +
                " candidates change results; it is an explicit --kernels option, never tuned");
  VIT_CHECK(!candidates.empty(), "autotune: no candidates for " + key.shape_text());
  const std::string k = entry_key(device_key, key);
  std::lock_guard<std::mutex> lock(mutex_);
  if (const auto it = picks_.find(k); it != picks_.end()) {
    const bool still_offered =
        std::any_of(candidates.begin(), candidates.end(),
                    [&](const KernelChoice& c) { return c.same_kernel(it->second); });
    if (still_offered) return it->second;
  }
  KernelChoice best;
  double best_ms = 0;
  for (const auto& c : candidates) {
    std::vector<double> ms;
    for (int r = 0; r < std::max(1, repeats); ++r) ms.push_back(time_ms(c));
    const double m = median(ms);
    if (best.variant.empty() || m < best_ms) best = c, best_ms = m;
  }
  best.why = ChoiceWhy::kTuned;
  picks_[k] = best;
  ++timed_;
  save();
  return best;
}

}  // namespace vit
