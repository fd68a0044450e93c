#include "data/lowfreq.h"

#include <fftw3.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/common.h"
#include "core/lowfreq_operator.h"

namespace vit {

namespace {

// Complex n x n out-of-place plans, forward and backward, created with FFTW_ESTIMATE on
// fftwf_malloc'd (SIMD-aligned) scratch and reused through the new-array execute interface
// (fftwf_execute_dft is thread-safe; only planning needs the lock).
class PlanCache {
 public:
  ~PlanCache() {
    for (auto& kv : plans_) fftwf_destroy_plan(kv.second);
  }
  fftwf_plan get(int n, int sign) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find({n, sign});
    if (it != plans_.end()) return it->second;
    fftwf_complex* a = fftwf_alloc_complex(size_t(n) * n);
    fftwf_complex* b = fftwf_alloc_complex(size_t(n) * n);
    VIT_CHECK(a && b, "fft_lowfreq_crop: out of memory for FFT plan scratch");
    fftwf_plan p = fftwf_plan_dft_2d(n, n, a, b, sign, FFTW_ESTIMATE);
    fftwf_free(a);
    fftwf_free(b);
    VIT_CHECK(p, "fft_lowfreq_crop: FFTW could not plan a " + std::to_string(n) + "x" +
                     std::to_string(n) + " transform");
    plans_.emplace(std::make_pair(n, sign), p);
    return p;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int, int>, fftwf_plan> plans_;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

struct FftwFree {
  void operator()(fftwf_complex* p) const { fftwf_free(p); }
};
using ComplexBuf = std::unique_ptr<fftwf_complex[], FftwFree>;

ComplexBuf alloc_complex(size_t n) {
  ComplexBuf p(fftwf_alloc_complex(n));
  VIT_CHECK(p, "fft_lowfreq_crop: out of memory");
  return p;
}

}  // namespace

void fft_lowfreq_crop(const float* in, int C, int S, float* out, int Bsz) {
  VIT_CHECK(in && out, "fft_lowfreq_crop: null buffer");
  VIT_CHECK(C >= 1 && S >= 1, "fft_lowfreq_crop: bad image shape (" + std::to_string(C) + ", " +
                                  std::to_string(S) + ", " + std::to_string(S) + ")");
  VIT_CHECK(Bsz >= 2 && Bsz % 2 == 0 && Bsz <= S,
            "fft_lowfreq_crop: bandwidth must be even and in [2, " + std::to_string(S) + "], got " +
                std::to_string(Bsz));
  const size_t SS = size_t(S) * S, BB = size_t(Bsz) * Bsz;
  if (Bsz == S) {  // the crop keeps the whole spectrum: identity
    std::memcpy(out, in, sizeof(float) * SS * C);
    return;
  }
  fftwf_plan fwd = plan_cache().get(S, FFTW_FORWARD);
  fftwf_plan bwd = plan_cache().get(Bsz, FFTW_BACKWARD);
  ComplexBuf x = alloc_complex(SS), F = alloc_complex(SS), G = alloc_complex(BB),
             y = alloc_complex(BB);
  const int b = Bsz / 2;
  // (Bsz/S)^2 from the crop times 1/Bsz^2 for the unnormalised inverse transform.
  const float scale = 1.0f / float(SS);
  for (int c = 0; c < C; ++c) {
    const float* src = in + size_t(c) * SS;
    for (size_t i = 0; i < SS; ++i) {
      x[i][0] = src[i];
      x[i][1] = 0.0f;
    }
    fftwf_execute_dft(fwd, x.get(), F.get());
    for (int r = 0; r < Bsz; ++r) {
      const int fr = r < b ? r : S - Bsz + r;  // rows 0..b-1 and S-b..S-1
      for (int q = 0; q < Bsz; ++q) {
        const int fq = q < b ? q : S - Bsz + q;
        G[size_t(r) * Bsz + q][0] = F[size_t(fr) * S + fq][0];
        G[size_t(r) * Bsz + q][1] = F[size_t(fr) * S + fq][1];
      }
    }
    fftwf_execute_dft(bwd, G.get(), y.get());
    float* dst = out + size_t(c) * BB;
    for (size_t i = 0; i < BB; ++i) dst[i] = y[i][0] * scale;
  }
}

void antialias_downsample(const float* in, int C, int S, float* out, int Bsz) {
  VIT_CHECK(in && out, "antialias_downsample: null buffer");
  VIT_CHECK(C >= 1 && S >= 1, "antialias_downsample: bad image shape (" + std::to_string(C) + ", " +
                                  std::to_string(S) + ", " + std::to_string(S) + ")");
  VIT_CHECK(Bsz >= 1 && Bsz <= S, "antialias_downsample: output size must be in [1, " +
                                      std::to_string(S) + "], got " + std::to_string(Bsz));
  const AntialiasAxis a = antialias_axis(S, Bsz);
  std::vector<double> tmp(size_t(S) * Bsz);  // horizontal pass: (S rows, Bsz cols)
  std::vector<double> line(Bsz);             // one output row of the vertical pass
  for (int c = 0; c < C; ++c) {
    const float* src = in + size_t(c) * S * S;
    for (int r = 0; r < S; ++r) {
      const float* row = src + size_t(r) * S;
      for (int j = 0; j < Bsz; ++j) {
        const double* w = &a.w[size_t(j) * a.max_size];
        const float* p = row + a.xmin[j];
        double acc = 0;
        for (int k = 0; k < a.xsize[j]; ++k) acc += w[k] * p[k];
        tmp[size_t(r) * Bsz + j] = acc;
      }
    }
    float* dst = out + size_t(c) * Bsz * Bsz;
    for (int i = 0; i < Bsz; ++i) {
      const double* w = &a.w[size_t(i) * a.max_size];
      std::fill(line.begin(), line.end(), 0.0);
      double* acc = line.data();
      for (int k = 0; k < a.xsize[i]; ++k) {
        const double* t = &tmp[size_t(a.xmin[i] + k) * Bsz];
        for (int j = 0; j < Bsz; ++j) acc[j] += w[k] * t[j];
      }
      for (int j = 0; j < Bsz; ++j) dst[size_t(i) * Bsz + j] = float(acc[j]);
    }
  }
}

}  // namespace vit
