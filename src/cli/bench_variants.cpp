#include "cli/bench_variants.h"

#include <set>

#include "core/common.h"

namespace vit {

BenchVariant parse_bench_variant(const std::string& spec) {
  const size_t colon = spec.find(':');
  VIT_CHECK(colon != std::string::npos && colon > 0,
            "bench: --variant '" + spec + "': expected NAME:k=v,... (or NAME: for the defaults)");
  BenchVariant v;
  v.name = spec.substr(0, colon);
  v.kernels = spec.substr(colon + 1);
  try {
    v.options = parse_kernel_options(v.kernels);
  } catch (const Error& e) {
    throw Error("bench: --variant '" + spec + "': " + e.what());
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

}  // namespace vit
