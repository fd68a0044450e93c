#include "ops/kernel_options.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "core/common.h"

namespace vit {

namespace {

// One key: its accepted values (the first is the default), how it reads and writes its field,
// whether it changes bits, and a line for --help.
struct KeySpec {
  const char* name;
  std::vector<std::string> values;
  std::function<std::string(const KernelOptions&)> get;
  std::function<void(KernelOptions&, const std::string&)> set;
  bool changes_bits;
  const char* help;
};

std::string width_name(WidthOption w) {
  return w == WidthOption::kNarrow ? "narrow" : w == WidthOption::kWide ? "wide" : "auto";
}
WidthOption width_from(const std::string& v) {
  return v == "narrow" ? WidthOption::kNarrow
         : v == "wide" ? WidthOption::kWide
                       : WidthOption::kAuto;
}
// "auto" for 0, else the number.
std::string count_name(int n) {
  return n == 0 ? "auto" : std::to_string(n);
}
int count_from(const std::string& v) {
  return v == "auto" ? 0 : std::stoi(v);
}

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      {"attention",
       {"auto", "flash", "unfused"},
       [](const KernelOptions& o) {
         return std::string(o.attention == AttentionOption::kFlash     ? "flash"
                            : o.attention == AttentionOption::kUnfused ? "unfused"
                                                                       : "auto");
       },
       [](KernelOptions& o, const std::string& v) {
         o.attention = v == "flash"     ? AttentionOption::kFlash
                       : v == "unfused" ? AttentionOption::kUnfused
                                        : AttentionOption::kAuto;
       },
       true,
       "fused flash kernels where the head dim has them (auto), always, or never"},
      {"gelu",
       {"erf", "fast"},
       [](const KernelOptions& o) {
         return std::string(o.gelu == GeluOption::kFast ? "fast" : "erf");
       },
       [](KernelOptions& o, const std::string& v) {
         o.gelu = v == "fast" ? GeluOption::kFast : GeluOption::kErf;
       },
       true,
       "the exact GELU through erff, or through one exponential (other last bits)"},
      {"autotune",
       {"off", "on"},
       [](const KernelOptions& o) { return std::string(o.autotune ? "on" : "off"); },
       [](KernelOptions& o, const std::string& v) { o.autotune = v == "on"; },
       false,
       "time the same-bits candidates of each op shape once, keep the fastest (cached)"},
      {"flash_warps",
       {"auto", "1", "2", "3", "4"},
       [](const KernelOptions& o) { return count_name(o.flash_warps); },
       [](KernelOptions& o, const std::string& v) { o.flash_warps = count_from(v); },
       false,
       "warps of the flash kernels' blocks (auto: by occupancy at the run's N)"},
      {"dwconv_forward",
       {"auto", "1", "2"},
       [](const KernelOptions& o) { return count_name(o.dwconv_forward); },
       [](KernelOptions& o, const std::string& v) { o.dwconv_forward = count_from(v); },
       false,
       "channels a thread of the depthwise 3x3 forward"},
      {"dwconv_backward",
       {"auto", "1", "2"},
       [](const KernelOptions& o) { return count_name(o.dwconv_backward); },
       [](KernelOptions& o, const std::string& v) { o.dwconv_backward = count_from(v); },
       false,
       "channels a thread of the depthwise 3x3 backward"},
      {"embed",
       {"auto", "narrow", "wide"},
       [](const KernelOptions& o) { return width_name(o.embed); },
       [](KernelOptions& o, const std::string& v) { o.embed = width_from(v); },
       false,
       "patch-embedding kernels over 16-byte words (wide) or one element a thread"},
      {"pool",
       {"auto", "narrow", "wide"},
       [](const KernelOptions& o) { return width_name(o.pool); },
       [](KernelOptions& o, const std::string& v) { o.pool = width_from(v); },
       false,
       "pooling backward over 8-column chunks (wide) or one element a thread"},
  };
  return specs;
}

std::string joined(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

bool KernelOptions::operator==(const KernelOptions& o) const {
  return to_string(*this) == to_string(o);
}

KernelOptions parse_kernel_options(const std::string& text) {
  KernelOptions options;
  const std::string all = trimmed(text);
  if (all.empty() || all == "default") return options;
  std::vector<std::string> seen;
  std::stringstream items(all);
  for (std::string item; std::getline(items, item, ',');) {
    item = trimmed(item);
    const auto eq = item.find('=');
    VIT_CHECK(eq != std::string::npos && eq > 0,
              "--kernels: '" + item + "' is not key=value (e.g. attention=unfused)");
    const std::string key = trimmed(item.substr(0, eq)), value = trimmed(item.substr(eq + 1));
    const auto& specs = key_specs();
    const auto spec =
        std::find_if(specs.begin(), specs.end(), [&](const KeySpec& s) { return key == s.name; });
    if (spec == specs.end()) {
      std::vector<std::string> names;
      for (const auto& s : specs) names.push_back(s.name);
      VIT_CHECK(false, "--kernels: unknown key '" + key + "' (keys: " + joined(names, ", ") + ")");
    }
    VIT_CHECK(std::find(seen.begin(), seen.end(), key) == seen.end(),
              "--kernels: key '" + key + "' given twice");
    seen.push_back(key);
    VIT_CHECK(
        std::find(spec->values.begin(), spec->values.end(), value) != spec->values.end(),
        "--kernels: " + key + "=" + value + ": expected one of " + joined(spec->values, ", "));
    spec->set(options, value);
  }
  return options;
}

std::string to_string(const KernelOptions& options) {
  std::vector<std::string> items;
  for (const auto& s : key_specs()) items.push_back(std::string(s.name) + "=" + s.get(options));
  return joined(items, ",");
}

std::string kernel_options_help() {
  std::string out;
  for (const auto& s : key_specs())
    out += std::string("  ") + s.name + "=" + joined(s.values, "|") +
           (s.changes_bits ? " (changes results)" : "") + ": " + s.help + "\n";
  return out;
}

std::vector<std::string> bit_changing_differences(const KernelOptions& a, const KernelOptions& b) {
  std::vector<std::string> out;
  for (const auto& s : key_specs())
    if (s.changes_bits && s.get(a) != s.get(b))
      out.push_back(std::string(s.name) + ": " + s.get(a) + " -> " + s.get(b));
  return out;
}

}  // namespace vit
