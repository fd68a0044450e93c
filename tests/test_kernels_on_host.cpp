// CUDA kernel source run on the CPU (tests/cuda_host_sim.h): the depthwise 3x3 kernels of the
// locality FFN (ops/cuda/dwconv_kernels.cuh) against the fp64 CPU reference, one channel a
// thread against two bit for bit; and the activation formulas of ops/cuda/activation_math.cuh that
// have no CPU twin (the one-exponential GELU). CI has no GPU, so this is where a kernel's indexing
// (columns, class-token rows, chunked weight-gradient sums) is first checked; the GPU tests still
// check what the simulation cannot (the device's own arithmetic, memory, timing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_host_sim.h"
#include "emu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/activation_math.cuh"
#include "ops/cuda/dwconv_kernels.cuh"

namespace {

using vit::Index;
namespace cu = vit::cuda;
namespace k = vit::cuda::dwconv_kernels;
using vit::emu_test::Floats;
using vit::emu_test::Gen;

struct Shape {
  int B, prefix, gh, gw, C;
  int N() const { return prefix + gh * gw; }
  Index n() const { return Index(B) * N() * C; }
  std::string str() const {
    char buf[64];
    std::snprintf(buf, sizeof buf, "B%d prefix%d %dx%d C%d", B, prefix, gh, gw, C);
    return buf;
  }
};
// Class token or none, square and not, a 1x1 grid, C across several 32-channel blocks and not a
// multiple of 32.
const Shape kShapes[] = {{2, 1, 4, 4, 37}, {3, 0, 3, 5, 70}, {1, 1, 7, 7, 64}, {2, 1, 1, 1, 3}};

std::vector<double> to_doubles(const Floats& v) {
  return std::vector<double>(v.begin(), v.end());
}

// The launches of dwconv.cu with small grids (the grid-stride loops then take several turns) and
// `chunks` column chunks for the weight gradient; kVec channels a thread (the plan's dwconv choice).
struct Launch {
  Shape s;
  int columns() const { return s.B * s.gw * s.C; }
  int prefix_total() const { return s.B * s.prefix * s.C; }

  template <typename T, int kVec = 1>
  void forward(T* out, const T* inp, const T* w) const {
    cu::launch({3}, {64}, [&] {
      k::dwconv3x3_forward_kernel<T, kVec>(out, inp, w, columns() / kVec, prefix_total(), s.N(),
                                           s.prefix, s.gh, s.gw, s.C);
    });
  }
  template <typename T, int kVec = 1>
  void backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* w,
                int chunks) const {
    cu::launch({2}, {64}, [&] {
      k::dwconv3x3_backward_prefix_kernel<T>(dinp, prefix_total(), s.N(), s.prefix, s.C);
    });
    const int units = s.B * s.gw, lane_blocks = (s.C / kVec + 31) / 32;
    const int per_chunk = (units + chunks - 1) / chunks;
    std::vector<float> partial(size_t(chunks) * 9 * s.C, -1.0f);
    cu::launch({unsigned(lane_blocks), unsigned(chunks)}, {32, unsigned(k::kRows)}, [&] {
      k::dwconv3x3_backward_kernel<T, kVec>(dinp, partial.data(), dout, inp, w, s.B, s.N(),
                                            s.prefix, s.gh, s.gw, s.C, per_chunk);
    });
    cu::launch({unsigned((9 * s.C + 63) / 64)}, {64},
               [&] { k::dwconv3x3_weight_finish_kernel(dweight, partial.data(), chunks, s.C); });
  }
};

void expect_close(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  size_t bad = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol * (scale + 1e-30))) ++bad;
    if (std::fabs(got[i] - want[i]) > std::fabs(got[worst] - want[worst])) worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " beyond " << tol
                     << " of the largest; worst [" << worst << "] " << got[worst] << " vs "
                     << want[worst];
}
// emu_test::expect_same_bits, named (bf16 values compare through their exact fp32 widening).
void expect_same_bits(const char* what, const Floats& got, const Floats& ref) {
  SCOPED_TRACE(what);
  vit::emu_test::expect_same_bits(got, ref);
}

// fp32 kernels against the fp64 CPU reference, with one and several weight-gradient chunks
// (every chunking sums the same products; only the order differs).
TEST(DwconvKernelsOnHost, MatchTheCpuReference) {
  uint32_t seed = 10;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const Index n = s.n();
    Gen gen(++seed);
    const Floats x = gen.floats(n, -2, 2), dout = gen.floats(n, -1, 1);
    const Floats w = gen.floats(9 * s.C, -0.4, 0.4), dw0 = gen.floats(9 * s.C, -0.1, 0.1);
    std::vector<double> xd = to_doubles(x), doutd = to_doubles(dout), wd = to_doubles(w);
    std::vector<double> ref_out(n), ref_dx(n), ref_dw = to_doubles(dw0);
    vit::cpu::dwconv3x3_forward(ref_out.data(), xd.data(), wd.data(), s.B, s.N(), s.prefix, s.gh,
                                s.gw, s.C);
    vit::cpu::dwconv3x3_backward(ref_dx.data(), ref_dw.data(), doutd.data(), xd.data(), wd.data(),
                                 s.B, s.N(), s.prefix, s.gh, s.gw, s.C);
    const Launch run{s};
    Floats out(n, 7.0f), dx(n, 7.0f);
    run.forward<float>(out.data(), x.data(), w.data());
    expect_close("out", to_doubles(out), ref_out, 1e-6);
    for (int chunks : {1, 3}) {
      SCOPED_TRACE("chunks " + std::to_string(chunks));
      Floats dweight = dw0;
      run.backward<float>(dx.data(), dweight.data(), dout.data(), x.data(), w.data(), chunks);
      expect_close("dinp", to_doubles(dx), ref_dx, 1e-6);
      expect_close("dweight", to_doubles(dweight), ref_dw, 1e-5);
    }
  }
}

// Two channels a thread (--kernels dwconv_*=2, where C is even) against one: every output bit for
// bit, in fp32 and bf16, with two column chunks. C = 70 leaves the last 32-lane block part empty; C
// = 130 spans three blocks of pairs.
template <typename T>
void expect_pairs_match_singles() {
  const Shape shapes[] = {{3, 0, 3, 5, 70}, {1, 1, 7, 7, 64}, {2, 1, 4, 3, 130}, {2, 1, 1, 1, 2}};
  uint32_t seed = 90;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(s.str());
    const Index n = s.n();
    Gen gen(++seed);
    auto values = [&](double lo, double hi) {  // rounded to T
      const Floats f = gen.floats(n, lo, hi);
      std::vector<T> v(f.size());
      for (size_t i = 0; i < f.size(); ++i) v[i] = cu::from_f32<T>(f[i]);
      return v;
    };
    auto filled = [&] { return std::vector<T>(n, cu::from_f32<T>(std::nanf(""))); };
    auto to_floats = [](const std::vector<T>& v) {
      Floats f(v.size());
      for (size_t i = 0; i < v.size(); ++i) f[i] = cu::to_f32(v[i]);
      return f;
    };
    const std::vector<T> x = values(-4, 4), dout = values(-1, 1);
    std::vector<T> w(9 * s.C);
    const Floats wf = gen.floats(9 * s.C, -0.4, 0.4), dw0 = gen.floats(9 * s.C, -0.1, 0.1);
    for (size_t i = 0; i < w.size(); ++i) w[i] = cu::from_f32<T>(wf[i]);
    const Launch run{s};
    struct Result {
      Floats out, dinp, dweight;
    };
    auto pass = [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      std::vector<T> out = filled(), dinp = filled();
      Floats dweight = dw0;
      run.forward<T, kVec>(out.data(), x.data(), w.data());
      run.backward<T, kVec>(dinp.data(), dweight.data(), dout.data(), x.data(), w.data(), 2);
      return Result{to_floats(out), to_floats(dinp), dweight};
    };
    const Result one = pass(std::integral_constant<int, 1>());
    const Result two = pass(std::integral_constant<int, 2>());
    expect_same_bits("out", two.out, one.out);
    expect_same_bits("dinp", two.dinp, one.dinp);
    expect_same_bits("dweight", two.dweight, one.dweight);
  }
}

TEST(DwconvKernelsOnHost, PairedChannelsGiveTheSameBits) {
  {
    SCOPED_TRACE("fp32 conv");
    expect_pairs_match_singles<float>();
  }
  {
    SCOPED_TRACE("bf16 conv");
    expect_pairs_match_singles<cu::bf16>();
  }
}

// The one-exponential exact GELU (--kernels gelu=fast) within the error its comment states, against
// the CPU's fp64 GELU and its derivative (cpu::gelu_forward / gelu_backward<double>), on a dense
// grid: forward relative error under 1e-6 for |x| < 3 and 2e-6 for |x| < 5, the derivative's
// absolute error under 5e-7 (the host's exp2f and division are correctly rounded; the device's
// approximate ones add about 2 ulps each, inside the margins). Outside |x| < 5 the values are
// under 3e-7 or within 5e-7 of x: judged absolutely.
TEST(ActivationMathOnHost, FastExactGeluIsWithinItsStatedError) {
  const cu::GeluForwardFast fwd;
  const cu::GeluBackwardFast bwd;
  const Index n = 2400001;
  std::vector<double> x(n), gelu(n), dgelu(n), ones(n, 1.0);
  for (Index i = 0; i < n; ++i) x[i] = double(float(i - n / 2) * 1e-5f);  // fp32 grid points
  vit::cpu::gelu_forward(gelu.data(), x.data(), n);
  vit::cpu::gelu_backward(dgelu.data(), ones.data(), x.data(), n);
  double worst3 = 0, worst5 = 0, worst_abs = 0, worst_d = 0;
  for (Index i = 0; i < n; ++i) {
    const float xf = float(x[i]);
    const double err = std::fabs(double(fwd(xf)) - gelu[i]);
    const double rel = gelu[i] == 0 ? err : err / std::fabs(gelu[i]);
    if (std::fabs(xf) < 3) worst3 = std::max(worst3, rel);
    if (std::fabs(xf) < 5)
      worst5 = std::max(worst5, rel);
    else
      worst_abs = std::max(worst_abs, err);
    worst_d = std::max(worst_d, std::fabs(double(bwd(1.0f, xf)) - dgelu[i]));
  }
  std::printf("worst: rel %.3g (|x| < 3), %.3g (|x| < 5); abs %.3g beyond; derivative abs %.3g\n",
              worst3, worst5, worst_abs, worst_d);
  EXPECT_LT(worst3, 1e-6);
  EXPECT_LT(worst5, 2e-6);
  EXPECT_LT(worst_abs, 5e-7);
  EXPECT_LT(worst_d, 5e-7);
  // Not the erff formula in disguise: the two differ (in the last bits) somewhere on the grid.
  int differ = 0;
  for (int i = -3000; i <= 3000; ++i)
    differ += cu::GeluForward{}(float(i) * 1e-3f) != fwd(float(i) * 1e-3f);
  EXPECT_GT(differ, 0);
  // Special values: NaN stays NaN, the tails are 0 and x.
  EXPECT_TRUE(std::isnan(fwd(std::nanf(""))));
  EXPECT_EQ(fwd(-30.0f), -0.0f);
  EXPECT_EQ(fwd(30.0f), 30.0f);
}

}  // namespace
