// The 16-byte LayerNorm kernels (ops/cuda/layernorm_vec_kernels.cuh, the bf16 default where C
// deals into chunks) run on
// the CPU (tests/cuda_host_sim.h) against fp64 sums: the forward with and without the residual
// add before it, the backward's dx and its weight and bias gradients' partial rows, at every
// group width (8, 16, 32 lanes a row) and chunk count (1-4 a lane), for bf16 and fp32 storage and
// the fp32 residual stream. CI has no GPU; here the groups' rows and columns, the partial rows and
// the grid's strides are first checked. The residual sum is the separate op's formula, so the
// stream is compared bit for bit; the normed values and gradients are fp32 sums in another order
// than fp64's, so within rounding. The GPU tests run the kernels on the device too
// (CudaOps/bf16.LayerNorm, CudaLayerNormVec.MatchesTheCpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_host_sim.h"
#include "emu_test_util.h"
#include "ops/cuda/layernorm_vec_kernels.cuh"

namespace {

using vit::bf16;
using vit::Index;
namespace cu = vit::cuda;
namespace lv = vit::cuda::layernorm_vec;
using vit::emu_test::Gen;

constexpr float kEps = 1e-6f;

// n values of type V, uniform in [mean - spread, mean + spread), rounded to V.
template <typename V>
std::vector<V> values(Gen& gen, Index n, double mean, double spread) {
  const vit::emu_test::Floats f = gen.floats(n, mean - spread, mean + spread);
  std::vector<V> v(f.size());
  for (size_t i = 0; i < f.size(); ++i) v[i] = V(f[i]);
  return v;
}
template <typename V>
std::vector<double> doubles(const std::vector<V>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = double(float(v[i]));
  return d;
}

// Every got[i] within rel |ref[i]| + abs of ref[i]; the worst one named.
template <typename V>
void expect_near_all(const char* what, const std::vector<V>& got, const std::vector<double>& ref,
                     double rel, double abs) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(double(float(got[i])) - ref[i]);
    const double ratio = std::isfinite(err) ? err / (rel * std::fabs(ref[i]) + abs) : INFINITY;
    bad += ratio > 1;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " off; worst [" << worst
                     << "] got " << float(got[worst]) << " ref " << ref[worst] << " ("
                     << worst_ratio << " x the limit)";
}
// What rounding to V and fp32 sums in another order allow, relative: bf16 one ulp (2^-7 of the
// value at most: the fp32 value can sit on the other side of a rounding midpoint), fp32 ~50.
template <typename V>
double rel_tol() {
  return std::is_same_v<V, float> ? 1e-5 : 1.0 / 128;
}

// LayerNorm of (R, C) rows in fp64: out = xhat w + b; mean, rstd.
struct NormRef {
  std::vector<double> out, mean, rstd;
};
NormRef layernorm_ref(const std::vector<double>& x, const std::vector<double>& w,
                      const std::vector<double>& b, Index R, Index C) {
  NormRef ref{std::vector<double>(x.size()), std::vector<double>(R), std::vector<double>(R)};
  for (Index r = 0; r < R; ++r) {
    const double* row = &x[r * C];
    double m = 0, v = 0;
    for (Index c = 0; c < C; ++c) m += row[c];
    m /= double(C);
    for (Index c = 0; c < C; ++c) v += (row[c] - m) * (row[c] - m);
    const double rs = 1.0 / std::sqrt(v / double(C) + double(kEps));
    for (Index c = 0; c < C; ++c) ref.out[r * C + c] = (row[c] - m) * rs * w[c] + b[c];
    ref.mean[r] = m;
    ref.rstd[r] = rs;
  }
  return ref;
}

// The kernels' launches as layernorm.cu makes them (blocks of kThreads; the backward's grid
// given, so a test can make its loop stride).
template <typename T, typename X>
void run_forward(T* out, float* mean, float* rstd, const X* inp, const T* w, const T* b, Index R,
                 Index C, lv::ResidualAdd<T, X> add = {}) {
  const lv::Layout l = lv::layout_for(C);
  ASSERT_NE(l.group, 0) << "C=" << C;
  lv::with_layout(l, [&](auto g, auto k) {
    constexpr int kGroup = decltype(g)::value, kChunks = decltype(k)::value;
    const Index rows = lv::kThreads / kGroup;
    cu::launch({unsigned((R + rows - 1) / rows)}, {unsigned(lv::kThreads)}, [&] {
      lv::layernorm_forward_vec_kernel<T, X, kGroup, kChunks>(out, mean, rstd, inp, w, b, R, C,
                                                              kEps, add);
    });
  });
}
// The backward's partial rows, (blocks, 2, C).
template <typename T, typename X>
std::vector<float> run_backward(X* dinp, const T* dout, const X* inp, const T* w, const float* rstd,
                                Index R, Index C, unsigned blocks) {
  std::vector<float> partial(size_t(blocks) * 2 * size_t(C), NAN);
  const lv::Layout l = lv::layout_for(C);
  lv::with_layout(l, [&](auto g, auto k) {
    cu::launch({blocks}, {unsigned(lv::kThreads)}, lv::backward_smem_bytes(C, l.group), [&] {
      lv::layernorm_backward_vec_kernel<T, X, decltype(g)::value, decltype(k)::value>(
          dinp, partial.data(), dout, inp, w, rstd, R, C);
    });
  });
  return partial;
}

TEST(LayerNormVecOnHost, LayoutDealsWholeChunks) {
  struct Want {
    Index C;
    int group, chunks;
  };
  // ViT-Ti, -S, -B, -L widths; the smallest of each group; rows the default kernels keep
  // (not a multiple of 8; 5 chunks a lane at 8 lanes; over 1024).
  for (const Want& w : {Want{192, 8, 3}, Want{384, 16, 3}, Want{768, 32, 3}, Want{1024, 32, 4},
                        Want{64, 8, 1}, Want{128, 16, 1}, Want{256, 32, 1}, Want{512, 32, 2},
                        Want{100, 0, 0}, Want{320, 0, 0}, Want{1280, 0, 0}, Want{0, 0, 0}}) {
    const lv::Layout l = lv::layout_for(w.C);
    EXPECT_EQ(l.group, w.group) << "C=" << w.C;
    EXPECT_EQ(l.chunks, w.chunks) << "C=" << w.C;
  }
  // Every layout it gives has its compiled kernels (with_layout calls f with its arguments), and
  // no other layout does.
  for (Index C = 0; C <= 1040; ++C) {
    const lv::Layout l = lv::layout_for(C);
    int group = 0, chunks = 0;
    const bool called = lv::with_layout(l, [&](auto g, auto k) {
      group = decltype(g)::value;
      chunks = decltype(k)::value;
    });
    EXPECT_EQ(called, l.group != 0) << "C=" << C;
    EXPECT_EQ(group, l.group) << "C=" << C;
    EXPECT_EQ(chunks, l.chunks) << "C=" << C;
  }
  EXPECT_FALSE(lv::with_layout({16, 2}, [](auto, auto) {}));  // deals 256, never chosen for it
}

// The forward over rows ~ (shift + row_step (r % 3) +- spread), two samples of S rows;
// `variant`: 0 the norm alone, 1 the residual add first, 2 with layer scale and per-sample scales
// (one sample's 0: a dropped path), 3 as 2 written over x (in place).
template <typename T, typename X>
void check_forward(Index C, int variant, double shift, uint64_t seed, double spread = 1.0,
                   double row_step = 0.0) {
  SCOPED_TRACE("C=" + std::to_string(C) + " variant=" + std::to_string(variant) +
               " shift=" + std::to_string(shift) + " spread=" + std::to_string(spread) +
               " row_step=" + std::to_string(row_step));
  const Index B = 2, S = 19, R = B * S;  // 38 rows: not a multiple of any block's rows
  Gen gen(seed);
  std::vector<X> x = values<X>(gen, R * C, shift, spread);
  for (Index r = 0; r < R; ++r)
    for (Index c = 0; c < C; ++c) x[r * C + c] = X(float(x[r * C + c]) + row_step * (r % 3));
  const std::vector<T> br = values<T>(gen, R * C, 0.0, 1.0), gamma = values<T>(gen, C, 0.0, 0.5);
  const std::vector<T> w = values<T>(gen, C, 1.0, 0.3), b = values<T>(gen, C, 0.0, 0.1);
  const std::vector<float> scale = {1.0f / 0.9f, 0.0f};
  // The stream the norm reads: x, or x + k gamma branch by the residual op's own formula.
  std::vector<X> stream = x;
  if (variant > 0)
    for (Index r = 0; r < R; ++r)
      for (Index c = 0; c < C; ++c) {
        const float k = variant >= 2 ? scale[r / S] : 1.0f;
        const float kg = k * (variant >= 2 ? float(gamma[c]) : 1.0f);
        stream[r * C + c] = X(cu::residual_sum(float(x[r * C + c]), kg, float(br[r * C + c])));
      }
  const NormRef ref = layernorm_ref(doubles(stream), doubles(w), doubles(b), R, C);

  std::vector<T> out(R * C);
  std::vector<float> mean(R, NAN), rstd(R, NAN);
  std::vector<X> written(R * C, X(NAN));
  if (variant == 0) {
    run_forward<T, X>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C);
  } else {
    X* dst = variant == 3 ? x.data() : written.data();
    const lv::ResidualAdd<T, X> add{dst, br.data(), variant >= 2 ? gamma.data() : nullptr,
                                    variant >= 2 ? scale.data() : nullptr, S};
    run_forward<T, X>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C,
                      add);
    const std::vector<X>& got = variant == 3 ? x : written;
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += float(got[i]) != float(stream[i]);
    EXPECT_EQ(differ, 0u) << "stream: values not the residual op's bits";
  }
  expect_near_all("out", out, ref.out, rel_tol<T>(), 1e-5);
  // The mean against the row's spread (~0.58): fp32 sums of values shifted by x[0].
  expect_near_all("mean", mean, ref.mean, 1e-6, 1e-5);
  expect_near_all("rstd", rstd, ref.rstd, 1e-5, 0.0);
}

TEST(LayerNormVecOnHost, ForwardMatchesFp64) {
  uint64_t seed = 1;
  for (Index C : {Index(64), Index(128), Index(192), Index(256), Index(384), Index(512), Index(768),
                  Index(1024)})
    for (int variant = 0; variant < 4; ++variant)
      check_forward<bf16, bf16>(C, variant, 0.0, ++seed);
  // A large mean (the shift by x[0] keeps its spread), and the other storage types.
  check_forward<bf16, bf16>(384, 1, 30.0, ++seed);
  for (Index C : {Index(192), Index(384), Index(1024)})
    for (int variant : {0, 2, 3}) {
      check_forward<bf16, float>(C, variant, 0.0, ++seed);
      check_forward<float, float>(C, variant, 0.0, ++seed);
    }
  check_forward<float, float>(384, 0, 1e3, ++seed);
  // fp32 rows of std ~1e-2 whose means differ by 1e4 between neighbours (in one warp at 8 and
  // 16 lanes a row): each row must be shifted by its own first value, not another row's.
  check_forward<float, float>(192, 0, 0.0, ++seed, 1e-2, 1e4);
  check_forward<float, float>(384, 1, 0.0, ++seed, 1e-2, 1e4);
}

// The backward with the forward's rstd, against fp64: dx = dinp + rstd (g - mean(g) -
// xhat mean(g xhat)) with g = dy w, and the partial rows' sums (over the blocks) of dy xhat and
// dy. `blocks` small, so each group strides over several rows; with dinp null only the sums.
template <typename T, typename X>
void check_backward(Index C, Index R, unsigned blocks, bool with_dx, uint64_t seed) {
  SCOPED_TRACE("C=" + std::to_string(C) + " R=" + std::to_string(R) +
               " blocks=" + std::to_string(blocks) + (with_dx ? "" : " (no dx)"));
  Gen gen(seed);
  const std::vector<X> x = values<X>(gen, R * C, 0.5, 1.0), dx0 = values<X>(gen, R * C, 0.0, 1.0);
  const std::vector<T> dy = values<T>(gen, R * C, 0.0, 1.0);
  const std::vector<T> w = values<T>(gen, C, 1.0, 0.3), b = values<T>(gen, C, 0.0, 0.1);
  std::vector<T> out(R * C);
  std::vector<float> mean(R), rstd(R);
  run_forward<T, X>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C);
  std::vector<X> dx = dx0;
  const std::vector<float> partial = run_backward<T, X>(
      with_dx ? dx.data() : nullptr, dy.data(), x.data(), w.data(), rstd.data(), R, C, blocks);

  const std::vector<double> xd = doubles(x), dyd = doubles(dy), wd = doubles(w);
  const NormRef ref = layernorm_ref(xd, wd, doubles(b), R, C);
  std::vector<double> dx_ref = doubles(dx0), dw_ref(C, 0.0), db_ref(C, 0.0), dw_abs(C, 0.0),
                      db_abs(C, 0.0), dx_scale(R * C, 0.0);
  for (Index r = 0; r < R; ++r) {
    double m_g = 0, m_gx = 0;
    for (Index c = 0; c < C; ++c) {
      const double xh = (xd[r * C + c] - ref.mean[r]) * ref.rstd[r];
      const double g = dyd[r * C + c] * wd[c];
      m_g += g;
      m_gx += g * xh;
      dw_ref[c] += dyd[r * C + c] * xh;
      db_ref[c] += dyd[r * C + c];
      dw_abs[c] += std::fabs(dyd[r * C + c] * xh);
      db_abs[c] += std::fabs(dyd[r * C + c]);
    }
    m_g /= double(C);
    m_gx /= double(C);
    for (Index c = 0; c < C; ++c) {
      const double xh = (xd[r * C + c] - ref.mean[r]) * ref.rstd[r];
      const double delta = ref.rstd[r] * (dyd[r * C + c] * wd[c] - m_g - xh * m_gx);
      dx_ref[r * C + c] += delta;
      dx_scale[r * C + c] = std::fabs(delta);
    }
  }
  if (with_dx) {
    // dx is dinp + delta rounded once: rounding relative to the sum, fp32 error to the delta.
    size_t bad = 0, worst = 0;
    double worst_ratio = 0;
    for (size_t i = 0; i < dx.size(); ++i) {
      const double lim = rel_tol<X>() * std::fabs(dx_ref[i]) + 1e-5 * dx_scale[i] + 1e-6;
      const double ratio = std::fabs(double(float(dx[i])) - dx_ref[i]) / lim;
      bad += !(ratio <= 1);
      if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
    EXPECT_EQ(bad, 0u) << "dx: " << bad << " off; worst [" << worst << "] got " << float(dx[worst])
                       << " ref " << dx_ref[worst];
  } else {
    size_t written = 0;  // dinp null: nothing may be written
    for (size_t i = 0; i < dx.size(); ++i) written += float(dx[i]) != float(dx0[i]);
    EXPECT_EQ(written, 0u);
  }
  std::vector<double> dw(C, 0.0), db(C, 0.0);
  for (unsigned k = 0; k < blocks; ++k)
    for (Index c = 0; c < C; ++c) {
      dw[c] += partial[(size_t(k) * 2) * C + c];
      db[c] += partial[(size_t(k) * 2 + 1) * C + c];
    }
  // fp32 sums of R terms: ~R eps of the terms' absolute sum at worst.
  for (Index c = 0; c < C; ++c) {
    EXPECT_NEAR(dw[c], dw_ref[c], 1e-5 * dw_abs[c] + 1e-6) << "dweight column " << c;
    EXPECT_NEAR(db[c], db_ref[c], 1e-5 * db_abs[c] + 1e-6) << "dbias column " << c;
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(LayerNormVecOnHost, BackwardMatchesFp64) {
  uint64_t seed = 100;
  // Every group width and chunk count; 2 blocks over R rows: 32, 16 or 8 rows a block a turn.
  for (Index C : {Index(64), Index(128), Index(192), Index(256), Index(384), Index(512), Index(768),
                  Index(1024)})
    check_backward<bf16, bf16>(C, 75, 2, true, ++seed);
  check_backward<bf16, bf16>(384, 75, 3, false, ++seed);
  check_backward<bf16, bf16>(192, 5, 2, true, ++seed);  // fewer rows than one block's groups
  for (Index C : {Index(192), Index(768)}) {
    check_backward<bf16, float>(C, 75, 2, true, ++seed);
    check_backward<float, float>(C, 75, 2, true, ++seed);
  }
}

}  // namespace
