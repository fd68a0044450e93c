#include "model/resample.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace vit {

namespace {

// Taps of one output index along one axis: source indices [first, first + w.size()).
struct Taps {
  Index first = 0;
  std::vector<double> w;
};

double cubic_filter(double x, double a) {  // Keys' cubic convolution kernel
  x = std::fabs(x);
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0;
}

// Plain interpolation: PyTorch's upsample_{bilinear,bicubic}2d with align_corners=False.
// Bicubic clamps the four taps at the borders; bilinear clamps the source coordinate at 0.
std::vector<Taps> plain_taps(Index in, Index out, Interp mode) {
  const double scale = double(in) / double(out);
  std::vector<Taps> taps(out);
  for (Index i = 0; i < out; ++i) {
    double src = (i + 0.5) * scale - 0.5;
    Taps& t = taps[i];
    if (mode == Interp::Bilinear) {
      src = std::max(src, 0.0);
      const Index x0 = std::min<Index>(Index(src), in - 1);
      const double l = src - double(x0);
      const Index x1 = std::min<Index>(x0 + 1, in - 1);
      // Taps over [x0, x1]: one tap when the second is clamped onto the first (a second tap
      // of weight 0 would still read one element past the grid, and 0 * NaN is NaN).
      t.first = x0;
      if (x1 == x0)
        t.w = {1.0};
      else
        t.w = {1 - l, l};
    } else {
      const Index x0 = Index(std::floor(src));
      const double f = src - double(x0);
      const double A = -0.75;
      const double w[4] = {cubic_filter(f + 1, A), cubic_filter(f, A), cubic_filter(1 - f, A),
                           cubic_filter(2 - f, A)};
      // Clamped taps may repeat an index: accumulate onto a dense window of the input.
      const Index lo = std::clamp<Index>(x0 - 1, 0, in - 1);
      const Index hi = std::clamp<Index>(x0 + 2, 0, in - 1);
      t.first = lo;
      t.w.assign(hi - lo + 1, 0.0);
      for (int k = 0; k < 4; ++k) t.w[std::clamp<Index>(x0 - 1 + k, 0, in - 1) - lo] += w[k];
    }
  }
  return taps;
}

// Antialiased interpolation: PyTorch's _upsample_{bilinear,bicubic}2d_aa (PIL-compatible,
// bicubic a = -0.5): a filter whose support grows with the downscale factor, normalised weights.
std::vector<Taps> antialias_taps(Index in, Index out, Interp mode) {
  const double scale = double(in) / double(out);
  const double half = mode == Interp::Bilinear ? 1.0 : 2.0;  // interp_size / 2
  const double support = scale >= 1.0 ? half * scale : half;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  std::vector<Taps> taps(out);
  for (Index i = 0; i < out; ++i) {
    const double center = scale * (i + 0.5);
    const Index xmin = std::max<Index>(Index(center - support + 0.5), 0);
    const Index xmax = std::min<Index>(Index(center + support + 0.5), in);
    Taps& t = taps[i];
    t.first = xmin;
    double total = 0;
    for (Index j = xmin; j < xmax; ++j) {
      const double x = (double(j) - center + 0.5) * invscale;
      const double w =
          mode == Interp::Bilinear ? std::max(0.0, 1.0 - std::fabs(x)) : cubic_filter(x, -0.5);
      t.w.push_back(w);
      total += w;
    }
    if (total != 0)
      for (double& w : t.w) w /= total;
  }
  return taps;
}

}  // namespace

void resample_grid(const float* src, Index hi, Index wi, float* dst, Index ho, Index wo, Index C,
                   Interp mode, bool antialias) {
  VIT_CHECK(hi > 0 && wi > 0 && ho > 0 && wo > 0, "cannot resample an empty grid");
  const auto ty = antialias ? antialias_taps(hi, ho, mode) : plain_taps(hi, ho, mode);
  const auto tx = antialias ? antialias_taps(wi, wo, mode) : plain_taps(wi, wo, mode);
  // Separable: rows first into (hi, wo, C), then columns; double accumulation.
  std::vector<double> tmp(hi * wo * C, 0.0);  // (hi, wo, C)
  for (Index y = 0; y < hi; ++y)
    for (Index x = 0; x < wo; ++x) {
      double* o = tmp.data() + (y * wo + x) * C;
      for (size_t k = 0; k < tx[x].w.size(); ++k) {
        const float* s = src + (y * wi + tx[x].first + Index(k)) * C;
        for (Index c = 0; c < C; ++c) o[c] += tx[x].w[k] * s[c];
      }
    }
  for (Index y = 0; y < ho; ++y)
    for (Index x = 0; x < wo; ++x) {
      float* o = dst + (y * wo + x) * C;
      for (Index c = 0; c < C; ++c) {
        double acc = 0;
        for (size_t k = 0; k < ty[y].w.size(); ++k)
          acc += ty[y].w[k] * tmp[((ty[y].first + Index(k)) * wo + x) * C + c];
        o[c] = float(acc);
      }
    }
}

void resample_pos_embed(const float* src, Index g_old, float* dst, Index g_new, Index prefix,
                        Index C, Interp mode, bool antialias) {
  std::copy(src, src + prefix * C, dst);
  resample_grid(src + prefix * C, g_old, g_old, dst + prefix * C, g_new, g_new, C, mode, antialias);
}

}  // namespace vit
