// CUDA kernel source run on the CPU (tests/cuda_host_sim.h): the depthwise 3x3 kernels of the
// locality FFN (ops/cuda/dwconv_kernels.cuh) against the fp64 CPU reference, and their fused
// locality-FFN passes against the three separate ops bit for bit in bf16, as the GPU test
// CudaOps/*.LocalFfnFusedIsTheThreeOpsBitwise requires on the device. CI has no GPU, so this is
// where a kernel's indexing (columns, class-token rows, chunked weight-gradient sums) is first
// checked; the GPU tests still check what the simulation cannot (the device's own arithmetic,
// memory, timing).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_host_sim.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/dwconv_kernels.cuh"

namespace {

using vit::Index;
namespace cu = vit::cuda;
namespace k = vit::cuda::dwconv_kernels;

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

template <typename T>
std::vector<T> random_values(Index n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = cu::from_f32<T>(u(rng));
  return v;
}
template <typename T>
std::vector<double> widen(const std::vector<T>& v) {
  std::vector<double> out;
  out.reserve(v.size());
  for (const T& x : v) out.push_back(cu::to_f32(x));
  return out;
}

// The launches of dwconv.cu with small grids (the grid-stride loops then take several turns) and
// `chunks` column chunks for the weight gradient.
struct Launch {
  Shape s;
  int columns() const { return s.B * s.gw * s.C; }
  int prefix_total() const { return s.B * s.prefix * s.C; }

  template <typename T, bool kLocal>
  void forward(T* out, const T* inp, const T* w, T* act1, T* act2) const {
    cu::launch({3}, {64}, [&] {
      k::dwconv3x3_forward_kernel<T, kLocal>(out, inp, w, act1, act2, columns(), prefix_total(),
                                             s.N(), s.prefix, s.gh, s.gw, s.C);
    });
  }
  template <typename T, bool kLocal>
  void backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* w, const T* dw,
                int chunks) const {
    cu::launch({2}, {64}, [&] {
      k::dwconv3x3_backward_prefix_kernel<T, kLocal>(dinp, inp, prefix_total(), s.N(), s.prefix,
                                                     s.C);
    });
    const int units = s.B * s.gw, col_blocks = (s.C + 31) / 32;
    const int per_chunk = (units + chunks - 1) / chunks;
    std::vector<float> partial(size_t(chunks) * 9 * s.C, -1.0f);
    cu::launch({unsigned(col_blocks), unsigned(chunks)}, {32, unsigned(k::kRows)}, [&] {
      k::dwconv3x3_backward_kernel<T, kLocal>(dinp, partial.data(), dout, inp, w, dw, s.B, s.N(),
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
template <typename T>
void expect_same_bits(const std::string& what, const std::vector<T>& got,
                      const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size()
                        << " elements differ, first [" << first << "]";
}

// fp32 kernels against the fp64 CPU reference, with one and several weight-gradient chunks
// (every chunking sums the same products; only the order differs).
TEST(DwconvKernelsOnHost, MatchTheCpuReference) {
  uint32_t seed = 10;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const Index n = s.n();
    const auto x = random_values<float>(n, ++seed, 2.0f),
               dout = random_values<float>(n, ++seed, 1.0f);
    const auto w = random_values<float>(9 * s.C, ++seed, 0.4f);
    const auto dw0 = random_values<float>(9 * s.C, ++seed, 0.1f);
    std::vector<double> xd = widen(x), doutd = widen(dout), wd = widen(w);
    std::vector<double> ref_out(n), ref_dx(n), ref_dw = widen(dw0);
    vit::cpu::dwconv3x3_forward(ref_out.data(), xd.data(), wd.data(), s.B, s.N(), s.prefix, s.gh,
                                s.gw, s.C);
    vit::cpu::dwconv3x3_backward(ref_dx.data(), ref_dw.data(), doutd.data(), xd.data(), wd.data(),
                                 s.B, s.N(), s.prefix, s.gh, s.gw, s.C);
    const Launch run{s};
    std::vector<float> out(n, 7.0f), dx(n, 7.0f);
    run.forward<float, false>(out.data(), x.data(), w.data(), nullptr, nullptr);
    expect_close("out", widen(out), ref_out, 1e-6);
    for (int chunks : {1, 3}) {
      SCOPED_TRACE("chunks " + std::to_string(chunks));
      std::vector<float> dweight = dw0;
      run.backward<float, false>(dx.data(), dweight.data(), dout.data(), x.data(), w.data(),
                                 nullptr, chunks);
      expect_close("dinp", widen(dx), ref_dx, 1e-6);
      expect_close("dweight", widen(dweight), ref_dw, 1e-5);
    }
  }
}

// bf16 h-swish as the elementwise maps store it (activations.cu).
std::vector<cu::bf16> hswish(const std::vector<cu::bf16>& x) {
  std::vector<cu::bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = cu::from_f32<cu::bf16>(cu::HswishForward{}(cu::to_f32(x[i])));
  return y;
}
std::vector<cu::bf16> hswish_grad(const std::vector<cu::bf16>& dout,
                                  const std::vector<cu::bf16>& x) {
  std::vector<cu::bf16> d(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    d[i] = cu::from_f32<cu::bf16>(cu::HswishBackward{}(cu::to_f32(dout[i]), cu::to_f32(x[i])));
  return d;
}

// The fused locality-FFN passes (kLocal) against h-swish, the plain conv, h-swish and their
// backward in that order, bf16: every output bit for bit, with fc1 on both sides of h-swish's
// kinks at +-3 and with and without the act1 output.
TEST(DwconvKernelsOnHost, LocalFfnFusedIsTheThreeOpsBitwise) {
  using T = cu::bf16;
  uint32_t seed = 50;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const Index n = s.n();
    const auto fc1 = random_values<T>(n, ++seed, 4.0f), dact2 = random_values<T>(n, ++seed, 1.0f);
    const auto w = random_values<T>(9 * s.C, ++seed, 0.4f);
    const auto dw0 = random_values<float>(9 * s.C, ++seed, 0.1f);
    const Launch run{s};
    // The three ops.
    const auto act1 = hswish(fc1);
    std::vector<T> dw(n), dact1(n);
    run.forward<T, false>(dw.data(), act1.data(), w.data(), nullptr, nullptr);
    const auto act2 = hswish(dw), ddw = hswish_grad(dact2, dw);
    std::vector<float> dweight = dw0;
    run.backward<T, false>(dact1.data(), dweight.data(), ddw.data(), act1.data(), w.data(), nullptr,
                           3);
    const auto dfc1 = hswish_grad(dact1, fc1);
    // The fused passes.
    std::vector<T> f_act1(n), f_dw(n), f_act2(n), g_dw(n), g_act2(n), f_dfc1(n);
    run.forward<T, true>(f_dw.data(), fc1.data(), w.data(), f_act1.data(), f_act2.data());
    run.forward<T, true>(g_dw.data(), fc1.data(), w.data(), nullptr, g_act2.data());
    std::vector<float> f_dweight = dw0;
    run.backward<T, true>(f_dfc1.data(), f_dweight.data(), dact2.data(), fc1.data(), w.data(),
                          f_dw.data(), 3);
    expect_same_bits("act1", f_act1, act1);
    expect_same_bits("dw", f_dw, dw);
    expect_same_bits("act2", f_act2, act2);
    expect_same_bits("dw (no act1)", g_dw, dw);
    expect_same_bits("act2 (no act1)", g_act2, act2);
    expect_same_bits("dfc1", f_dfc1, dfc1);
    expect_same_bits("dweight", f_dweight, dweight);
  }
}

}  // namespace
