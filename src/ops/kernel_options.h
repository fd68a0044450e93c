// The kernel choices a user makes (`--kernels k=v,...`, the `kernels:` key of a -c YAML file).
// Everything else about which kernel runs is the kernel plan's (ops/kernel_plan.h): a rule from
// the device and the shape, or the autotuner's timing among candidates with the same bits.
//
// Two kinds of option:
//  * bit-changing: attention and gelu pick a different computation (another rounding or
//    summation order), so a run's losses depend on them; the plan never tunes them, and a
//    resumed run refuses to change them;
//  * bit-identical: autotune and the forced candidates (flash_warps, dwconv_*, embed, pool)
//    only pick among kernels that give the same bits, so they change speed, never results.
#pragma once
#include <string>
#include <vector>

namespace vit {

enum class AttentionOption { kAuto, kFlash, kUnfused };
enum class GeluOption { kErf, kFast };
enum class WidthOption { kAuto, kNarrow, kWide };

struct KernelOptions {
  // auto: the fused (flash) kernels where the head dim has them, else the unfused path.
  AttentionOption attention = AttentionOption::kAuto;
  // erf: the exact GELU through erff; fast: the same function through one exponential
  // (activation_math.cuh's gelu_cdf_fast), different last bits.
  GeluOption gelu = GeluOption::kErf;
  // Time the bit-identical candidates of each op shape once and keep the fastest (cached on
  // disk per device and library versions: ops/autotune.h).
  bool autotune = false;
  // Forced candidates (0 / kAuto: the plan decides). Warps of the flash kernels' blocks (1-4);
  // channels a thread of the depthwise 3x3 forward and backward (1-2); the patch-embedding and
  // pooling kernels over wide words or one element a thread.
  int flash_warps = 0;
  int dwconv_forward = 0;
  int dwconv_backward = 0;
  WidthOption embed = WidthOption::kAuto;
  WidthOption pool = WidthOption::kAuto;

  bool operator==(const KernelOptions& o) const;
  bool operator!=(const KernelOptions& o) const { return !(*this == o); }
};

// "attention=unfused,gelu=fast" (keys in any order, each once; "" or "default": the defaults).
// Throws vit::Error with one line naming the bad key or value and the accepted ones.
KernelOptions parse_kernel_options(const std::string& text);
// Every key in a fixed order: "attention=auto,gelu=erf,autotune=off,flash_warps=auto,...".
std::string to_string(const KernelOptions& options);
// The keys, their values and what they do, for --help.
std::string kernel_options_help();

// The bit-changing keys whose values differ ("attention: flash -> unfused"); empty when a run
// with `b` repeats `a`'s bits.
std::vector<std::string> bit_changing_differences(const KernelOptions& a, const KernelOptions& b);

}  // namespace vit
