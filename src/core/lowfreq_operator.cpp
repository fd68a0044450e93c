#include "core/lowfreq_operator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

namespace vit {

namespace {

// kFft: y = Re(ifft2(G) (S/F)^2) with G the frequencies -S/2 .. S/2-1 of fft2(x) on both axes
// (data/lowfreq.h). Written out, M[r][x] = (1/F) sum_k exp(2 pi i k (r/S - x/F)) over those k.
// The phase k (r F - x S) / (S F) is reduced in integers, so every term is a table entry.
void fill_fft(Index F, Index S, float* re, float* im) {
  const int64_t period = int64_t(S) * F;
  std::vector<double> cos_t(static_cast<size_t>(period)), sin_t(static_cast<size_t>(period));
  const double two_pi = 2.0 * std::acos(-1.0);
  for (int64_t p = 0; p < period; ++p) {
    cos_t[size_t(p)] = std::cos(two_pi * double(p) / double(period));
    sin_t[size_t(p)] = std::sin(two_pi * double(p) / double(period));
  }
  const int64_t half = S / 2;
  for (Index r = 0; r < S; ++r)
    for (Index x = 0; x < F; ++x) {
      const int64_t q = int64_t(r) * F - int64_t(x) * S;
      double sr = 0, si = 0;
      for (int64_t k = -half; k < half; ++k) {
        int64_t p = (k * q) % period;
        if (p < 0) p += period;
        sr += cos_t[size_t(p)];
        si += sin_t[size_t(p)];
      }
      re[r * F + x] = float(sr / double(F));
      im[r * F + x] = float(si / double(F));
    }
}

// kDownsample: row i of M holds output i's antialiased weights.
void fill_downsample(Index F, Index S, float* re) {
  const AntialiasAxis a = antialias_axis(int(F), int(S));
  for (Index i = 0; i < S; ++i)
    for (int k = 0; k < a.xsize[size_t(i)]; ++k)
      re[i * F + a.xmin[size_t(i)] + k] = float(a.w[size_t(i) * a.max_size + k]);
}

}  // namespace

AntialiasAxis antialias_axis(int in_size, int out_size) {
  AntialiasAxis a;
  const double scale = double(in_size) / double(out_size);
  const double support = scale >= 1.0 ? scale : 1.0;  // (interp_size / 2) * scale, interp_size 2
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  a.max_size = int(std::ceil(support)) * 2 + 1;
  a.xmin.resize(size_t(out_size));
  a.xsize.resize(size_t(out_size));
  a.w.assign(size_t(out_size) * size_t(a.max_size), 0.0);
  for (int i = 0; i < out_size; ++i) {
    const double center = scale * (i + 0.5);
    const int lo = std::max(int(center - support + 0.5), 0);  // int() truncates, as in aten
    const int hi = std::min(int(center + support + 0.5), in_size);
    const int n = std::min(hi - lo, a.max_size);
    double* w = &a.w[size_t(i) * size_t(a.max_size)];
    double total = 0;
    for (int j = 0; j < n; ++j) {
      const double x = std::fabs((j + lo - center + 0.5) * invscale);
      w[j] = x < 1.0 ? 1.0 - x : 0.0;
      total += w[j];
    }
    if (total != 0)
      for (int j = 0; j < n; ++j) w[j] /= total;
    a.xmin[size_t(i)] = lo;
    a.xsize[size_t(i)] = n;
  }
  return a;
}

const std::vector<float>& lowfreq_operator(LowFreqKind kind, Index F, Index S) {
  const bool fft = kind == LowFreqKind::kFft;
  VIT_CHECK(fft || kind == LowFreqKind::kDownsample, "lowfreq_operator: unknown kind");
  VIT_CHECK(F >= 1 && S >= 1 && S <= F && (!fft || (S >= 2 && S % 2 == 0)),
            "lowfreq_operator: cannot map side " + std::to_string(F) + " to " + std::to_string(S) +
                (fft ? " (the spectral crop needs an even side of at least 2)" : ""));
  static std::mutex mu;
  static std::map<std::tuple<int, Index, Index>, std::vector<float>> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(int(kind), F, S);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::vector<float> op(size_t(2 * S * F), 0.0f);  // (2, S, F)
    if (fft)
      fill_fft(F, S, op.data(), op.data() + S * F);
    else
      fill_downsample(F, S, op.data());
    it = cache.emplace(key, std::move(op)).first;
  }
  return it->second;
}

}  // namespace vit
