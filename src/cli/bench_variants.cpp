#include "cli/bench_variants.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "core/common.h"

namespace vit {

BenchVariant parse_bench_variant(const std::string& spec) {
  const size_t colon = spec.find(':');
  VIT_CHECK(colon != std::string::npos && colon > 0,
            "bench: --variant '" + spec + "': expected NAME:VAR=VALUE ... (or NAME: for none)");
  BenchVariant v;
  v.name = spec.substr(0, colon);
  std::istringstream words(spec.substr(colon + 1));
  std::set<std::string> seen;
  for (std::string word; words >> word;) {
    const size_t eq = word.find('=');
    VIT_CHECK(eq != std::string::npos && eq > 0,
              "bench: --variant '" + spec + "': '" + word + "' is not VAR=VALUE");
    std::string name = word.substr(0, eq);
    VIT_CHECK(seen.insert(name).second,
              "bench: --variant '" + spec + "': " + name + " is set twice");
    v.env.emplace_back(std::move(name), word.substr(eq + 1));
  }
  return v;
}

void check_bench_variants(const std::vector<BenchVariant>& variants) {
  std::set<std::string> names;
  for (const BenchVariant& v : variants)
    VIT_CHECK(names.insert(v.name).second, "bench: two variants are named '" + v.name + "'");
}

std::vector<int> bench_round_order(int n, int round) {
  std::vector<int> order;
  for (int i = 0; i < n; ++i) order.push_back((i + round) % n);
  return order;
}

ScopedVariantEnv::ScopedVariantEnv(const BenchVariant& variant) {
  for (const auto& [name, value] : variant.env) {
    const char* old = std::getenv(name.c_str());
    saved_.push_back({name, old ? old : "", old != nullptr});
    setenv(name.c_str(), value.c_str(), 1);
  }
}

ScopedVariantEnv::~ScopedVariantEnv() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->was_set)
      setenv(it->name.c_str(), it->value.c_str(), 1);
    else
      unsetenv(it->name.c_str());
  }
}

namespace {

// The index of `route` in `calls`, or calls.size() if it is not there.
size_t route_index(const KernelCalls& calls, const std::string& route) {
  return size_t(std::find_if(calls.begin(), calls.end(),
                             [&](const auto& entry) { return entry.first == route; }) -
                calls.begin());
}

}  // namespace

KernelCalls route_calls_since(const KernelCalls& before, const KernelCalls& after) {
  KernelCalls since;
  for (const auto& [route, calls] : after) {
    const size_t i = route_index(before, route);
    since.emplace_back(route, calls - (i < before.size() ? before[i].second : 0));
  }
  return since;
}

void add_route_calls(KernelCalls& total, const KernelCalls& more) {
  for (const auto& [route, calls] : more) {
    const size_t i = route_index(total, route);
    if (i < total.size())
      total[i].second += calls;
    else
      total.emplace_back(route, calls);
  }
}

nlohmann::ordered_json route_calls_json(const KernelCalls& calls) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [route, n] : calls) j[route] = n;
  return j;
}

std::string route_calls_text(const KernelCalls& calls) {
  std::string text;
  for (const auto& [route, n] : calls)
    if (n != 0) text += fmt::format("{}{} {}", text.empty() ? "" : ", ", route, n);
  return text;
}

}  // namespace vit
