// The bf16 closeness check of kernels against the CPU emulation (src/ops/emu): shared by the CUDA
// op tests (cuda_test_util.h) and the kernels run on the host (test_flash_on_host.cpp).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace vit::test {

// The spacing of bf16 values at |x| (8 significant bits).
inline double bf16_ulp(double x) {
  int e;
  std::frexp(x == 0 ? 1e-30 : std::fabs(x), &e);
  return std::ldexp(1.0, e - 8);
}

// How many bf16 spacings (at `want`) a result lies from the value it should round from: at most
// 0.5 when it is the nearest bf16, up to 1 when fp32 summation in another order moved it across
// a rounding boundary.
inline double bf16_steps(double got, double want) {
  return std::fabs(got - want) / bf16_ulp(want);
}

// bf16 results of a GPU kernel against the CPU emulation's (src/ops/emu) on the same inputs,
// both widened to fp32: each element within `ulps` bf16 spacings of the larger of the two, plus
// one spacing of the largest reference value (fp32 summation order can move a value across a
// rounding boundary, and a small result of a large cancellation by more); at most
// `max_differ` of the elements may differ in their bits at all.
inline void expect_within_bf16_ulps(const std::string& what, const std::vector<float>& got,
                                    const std::vector<float>& ref, double ulps, double max_differ) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double maxref = 0;
  for (float r : ref) maxref = std::max(maxref, double(std::fabs(r)));
  size_t bad = 0, differ = 0, worst = 0;
  double worst_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    const double lim =
        ulps * bf16_ulp(std::max(std::fabs(got[i]), std::fabs(ref[i]))) + bf16_ulp(maxref) + 1e-30;
    differ += std::memcmp(&got[i], &ref[i], sizeof(float)) != 0;
    if (!(err <= lim)) ++bad;  // NaN counts as bad
    if (err > worst_err) worst_err = err, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " beyond " << ulps
                     << " ulps; worst [" << worst << "] gpu " << got[worst] << " emu "
                     << ref[worst];
  EXPECT_LE(double(differ), max_differ * double(got.size()))
      << what << ": " << differ << " of " << got.size() << " elements differ in their bits";
}

}  // namespace vit::test
