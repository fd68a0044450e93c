// Low-frequency cropping against PyTorch (reference written by tests/reference/lowfreq_ref.py):
// EfficientTrain's FFT crop (torch.fft) and antialiased bilinear down-sampling
// (F.interpolate(bilinear, antialias=True, align_corners=False)); plus the DC (channel mean)
// preservation of the FFT crop and thread safety of the cached FFTW plans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/common.h"
#include "data/lowfreq.h"
#include "io/safetensors.h"

namespace {

using Fn = void (*)(const float*, int, int, float*, int);

const vit::io::SafeTensors& reference() {
  static const vit::io::SafeTensors st =
      vit::io::read_safetensors(std::string(VIT_REFERENCE_DIR) + "/lowfreq.safetensors");
  return st;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// Runs every case of one kind ("fft" or "aa") and returns the number checked.
int check_cases(const char* kind, Fn fn) {
  const auto& st = reference();
  int n = 0;
  for (const std::string& name : split(st.metadata.at(std::string(kind) + "_cases"))) {
    const std::string key = name.substr(name.find('_') + 1, name.rfind("_b") - name.find('_') - 1);
    const auto& src = st.at(key);
    const auto& ref = st.at(name);
    const int C = int(src.shape[0]), S = int(src.shape[1]), B = int(ref.shape[1]);
    EXPECT_EQ(ref.shape[0], C);
    EXPECT_EQ(ref.shape[2], B);
    const std::vector<float> in = src.to_f32();
    const std::vector<float> want = ref.to_f32();
    std::vector<float> got(size_t(C) * B * B, NAN);
    fn(in.data(), C, S, got.data(), B);
    double maxref = 0, worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      maxref = std::max(maxref, double(std::fabs(want[i])));
      worst = std::max(worst, double(std::fabs(got[i] - want[i])));
    }
    EXPECT_LE(worst, 1e-4 * maxref) << name << " max|ref| " << maxref;
    ++n;
  }
  return n;
}

TEST(LowFreqTorch, FftCropMatchesTorchFft) {
  EXPECT_EQ(check_cases("fft", vit::fft_lowfreq_crop), 13);
}

TEST(LowFreqTorch, AntialiasDownsampleMatchesInterpolate) {
  EXPECT_EQ(check_cases("aa", vit::antialias_downsample), 16);
}

TEST(LowFreqTorch, FftCropKeepsChannelMeans) {
  const auto& src = reference().at("c3_s224");
  const int C = 3, S = 224;
  const std::vector<float> in = src.to_f32();
  for (int B : {2, 32, 96, 160, 222}) {
    std::vector<float> out(size_t(C) * B * B);
    vit::fft_lowfreq_crop(in.data(), C, S, out.data(), B);
    for (int c = 0; c < C; ++c) {
      double m_in = 0, m_out = 0;
      for (int i = 0; i < S * S; ++i) m_in += in[size_t(c) * S * S + i];
      for (int i = 0; i < B * B; ++i) m_out += out[size_t(c) * B * B + i];
      m_in /= double(S) * S;
      m_out /= double(B) * B;
      EXPECT_NEAR(m_out, m_in, 1e-4 * std::max(1.0, std::fabs(m_in))) << "B " << B << " c " << c;
    }
  }
  // Bandwidth 2 keeps frequencies -1 and 0: a constant image stays constant at any bandwidth.
  std::vector<float> flat(size_t(S) * S, 0.75f), o(16);
  vit::fft_lowfreq_crop(flat.data(), 1, S, o.data(), 4);
  for (float v : o) EXPECT_NEAR(v, 0.75f, 1e-5);
}

TEST(LowFreqTorch, ConcurrentCallsAgree) {
  const auto& src = reference().at("c3_s32");
  const std::vector<float> in = src.to_f32();
  std::vector<float> want(3 * 16 * 16);
  vit::fft_lowfreq_crop(in.data(), 3, 32, want.data(), 16);
  std::vector<std::vector<float>> got(4, std::vector<float>(want.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        // new sizes plan concurrently with execution of cached plans
        std::vector<float> scratch(3 * (10 + 2 * t) * (10 + 2 * t));
        vit::fft_lowfreq_crop(in.data(), 3, 32, scratch.data(), 10 + 2 * t);
        vit::fft_lowfreq_crop(in.data(), 3, 32, got[t].data(), 16);
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], want) << "thread " << t;
}

TEST(LowFreqTorch, RejectsBadArguments) {
  std::vector<float> in(3 * 8 * 8, 0.f), out(3 * 8 * 8);
  EXPECT_THROW(vit::fft_lowfreq_crop(in.data(), 3, 8, out.data(), 3), vit::Error);   // odd
  EXPECT_THROW(vit::fft_lowfreq_crop(in.data(), 3, 8, out.data(), 10), vit::Error);  // > S
  EXPECT_THROW(vit::fft_lowfreq_crop(in.data(), 3, 8, out.data(), 0), vit::Error);
  EXPECT_THROW(vit::fft_lowfreq_crop(in.data(), 0, 8, out.data(), 4), vit::Error);
  EXPECT_THROW(vit::antialias_downsample(in.data(), 3, 8, out.data(), 9), vit::Error);
  EXPECT_THROW(vit::antialias_downsample(in.data(), 3, 8, out.data(), 0), vit::Error);
  // Full bandwidth is the identity.
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 7) - 3.f;
  vit::fft_lowfreq_crop(in.data(), 3, 8, out.data(), 8);
  EXPECT_EQ(out, in);
}

}  // namespace
