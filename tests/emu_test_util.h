// Shared by the bf16 emulation op tests (test_emu_ops.cpp, test_emu_flash.cpp): bf16 inputs,
// the exact-rounding checks (a), the bf16 closeness checks (b) and the accumulation check (c),
// and the fp64 model bookkeeping (Expect) for ops that round intermediates.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/bf16.h"
#include "core/common.h"
#include "core/rng.h"

namespace vit::emu_test {

using Floats = std::vector<float>;
using Bf16s = std::vector<bf16>;

// (b) for an output rounded once from the fp32 reference value: one bf16 rounding is off by at
// most 2^-9 relative (half a spacing at 8 significant bits); 2^-8 leaves a factor 2.
constexpr double kRtol = 0x1p-8;

inline size_t len(Index n) {
  return size_t(n);
}

struct Gen {
  Rng rng;
  explicit Gen(uint64_t seed) : rng(seed) {}
  // n values uniform in [lo, hi), rounded to bf16.
  Bf16s bf16s(Index n, double lo, double hi) {
    Bf16s v(len(n));
    for (auto& x : v) x = bf16(float(lo + (hi - lo) * rng.uniform()));
    return v;
  }
  // n fp32 values uniform in [lo, hi) (fp32 inputs: gradients to accumulate into, scales).
  Floats floats(Index n, double lo, double hi) {
    Floats v(len(n));
    for (auto& x : v) x = float(lo + (hi - lo) * rng.uniform());
    return v;
  }
};

inline Floats widen(const Bf16s& v) {
  Floats f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = float(v[i]);
  return f;
}

// n values in [-spread, spread) stored as V (bf16, rounded, or float): inputs of the kernels
// the host-simulation tests run.
template <typename V>
std::vector<V> values_of(Gen& gen, Index n, double spread = 2.0) {
  const Floats f = gen.floats(n, -spread, spread);
  std::vector<V> v(f.size());
  for (size_t i = 0; i < f.size(); ++i) v[i] = V(f[i]);
  return v;
}
// The values as fp32 (bf16 widened exactly), for expect_same_bits.
inline const Floats& as_floats(const Floats& v) {
  return v;
}
inline Floats as_floats(const Bf16s& v) {
  return widen(v);
}

inline Bf16s nans(Index n) {
  return Bf16s(len(n), bf16(std::numeric_limits<float>::quiet_NaN()));
}

// An all-zero (or non-finite) reference would let a broken op pass.
inline void expect_nontrivial(const Floats& ref) {
  size_t nonzero = 0, nonfinite = 0;
  for (float x : ref) {
    nonzero += x != 0.0f;
    nonfinite += !std::isfinite(x);
  }
  EXPECT_GT(nonzero, 0u) << "reference is all zeros";
  EXPECT_EQ(nonfinite, 0u) << "reference has non-finite values";
}

// (a) got[i] is bf16(ref[i]), bit for bit.
inline void expect_rounded(const Bf16s& got, const Floats& ref) {
  ASSERT_EQ(got.size(), ref.size());
  expect_nontrivial(ref);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].bits != bf16(ref[i]).bits && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << "of " << got.size() << "; first at " << first << ": got "
                     << float(got[first]) << ", fp32 reference " << ref[first];
}

// (a) fp32 outputs: the same bits as the CPU op.
inline void expect_same_bits(const Floats& got, const Floats& ref) {
  ASSERT_EQ(got.size(), ref.size());
  expect_nontrivial(ref);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << "of " << got.size() << "; first at " << first << ": got " << got[first]
                     << ", reference " << ref[first];
}

// (b) |got - ref| <= rtol * |ref| + atol elementwise.
inline void expect_close(const Bf16s& got, const Floats& ref, double rtol, double atol) {
  ASSERT_EQ(got.size(), ref.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(float(got[i])) - ref[i]);
    if (!(err <= rtol * std::abs(ref[i]) + atol) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "of " << got.size() << "; first at " << first << ": got "
                     << float(got[first]) << ", fp32 reference " << ref[first];
}

// (c) a second call adds the first call's share again: twice - init == 2 (once - init) up to
// the roundings of the two additions, at most rtol * (|init| + |once| + |twice|) (fp32: a few
// 2^-24, so 1e-6; bf16: 2^-9 for each of the two rounded sums, so 2^-8). The first call must
// have changed something, or the check says nothing.
inline void expect_added_twice(const Floats& init, const Floats& once, const Floats& twice,
                               double rtol) {
  ASSERT_EQ(init.size(), once.size());
  ASSERT_EQ(init.size(), twice.size());
  size_t changed = 0, bad = 0, first = 0;
  for (size_t i = 0; i < init.size(); ++i) {
    changed += once[i] != init[i];
    const double err = std::abs((double(twice[i]) - init[i]) - 2.0 * (double(once[i]) - init[i]));
    const double tol = rtol * (std::abs(init[i]) + std::abs(once[i]) + std::abs(twice[i]));
    if (!(err <= tol) && bad++ == 0) first = i;
  }
  EXPECT_GT(changed, 0u) << "the first call added nothing";
  EXPECT_EQ(bad, 0u) << "first at " << first << ": init " << init[first] << ", once " << once[first]
                     << ", twice " << twice[first];
}

constexpr double kRtolF32Sum = 1e-6;  // expect_added_twice on fp32 gradients

// fp32 noise of the emulation relative to the exact value at one stage: a sum of n products
// carries at most n * 2^-24 of the sum of |terms| (n <= 50 here: 3e-6), and exp, 1 / sum and
// the scale add a few 2^-24 more. 1e-5 covers that and is still 200 times below a bf16 half
// spacing (2^-9 ~ 2e-3), so only values within 1e-5 of a rounding tie may round either way.
constexpr double kNoise = 1e-5;

// Per element: the exact value given the rounded intermediates, the sum of |terms| it came
// from (the scale of its error budget), and how far the emulation's fp32 value may be from it
// (fp32 noise, plus what a near-tie intermediate rounded the other way would move it by).
struct Expect {
  std::vector<double> value, abs, noise;
  explicit Expect(Index n) : value(len(n)), abs(len(n)), noise(len(n)) {}
};

inline double rounded(double x) {
  return double(round_bf16(float(x)));
}
// 0 when every value within `noise` of x rounds alike, else the gap between the two roundings.
inline double ambiguity(double x, double noise) {
  return std::abs(rounded(x + noise) - rounded(x - noise));
}

// got is a bf16 rounding of a value within `noise` of exact: round(exact), or its other
// neighbour when exact lies within noise of the tie between them.
inline bool rounds_from(float got, double exact, double noise) {
  int e = 0;
  std::frexp(exact, &e);  // exact in [2^(e-1), 2^e): bf16 spacing 2^(e-8) there
  const double half = exact == 0.0 ? 0.0 : std::ldexp(1.0, e - 9);
  return std::abs(double(got) - exact) <= half + noise;
}

inline size_t count_not_rounding_from(const Bf16s& got, const Expect& e) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    bad += !rounds_from(float(got[i]), e.value[i], e.noise[i]);
  return bad;
}

inline void expect_rounds_from(const Bf16s& got, const Expect& e) {
  ASSERT_EQ(got.size(), e.value.size());
  size_t nonzero = 0;
  for (double v : e.value) nonzero += v != 0.0;
  EXPECT_GT(nonzero, 0u) << "model is all zeros";
  EXPECT_EQ(count_not_rounding_from(got, e), 0u) << "of " << got.size();
}

// (b) |got - ref| <= 2^-8 (|ref| + abs): each rounded intermediate moves each term by at most
// 2^-9 of it (<= 2^-9 * abs in all) and the final rounding adds at most 2^-9 |ref|; 2^-8 leaves
// a factor 2 for fp32 noise.
inline void expect_close_to_terms(const Bf16s& got, const Floats& ref, const Expect& e) {
  ASSERT_EQ(got.size(), ref.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(float(got[i])) - ref[i]);
    if (!(err <= kRtol * (std::abs(ref[i]) + e.abs[i])) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "first at " << first << ": got " << float(got[first]) << ", fp32 "
                     << ref[first] << ", sum of |terms| " << e.abs[first];
}

}  // namespace vit::emu_test
