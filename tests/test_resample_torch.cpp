// Grid resampling against torch.nn.functional.interpolate (bilinear/bicubic, antialias on/off,
// up- and down-sampling, non-square), the reference written by tests/reference/resample_ref.py.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "io/safetensors.h"
#include "model/resample.h"

namespace {

TEST(ResampleTorch, MatchesInterpolate) {
  const std::string path = std::string(VIT_REFERENCE_DIR) + "/resample.safetensors";
  const vit::io::SafeTensors st = vit::io::read_safetensors(path);
  std::stringstream cases(st.metadata.at("cases"));
  std::string name;
  int n = 0;
  while (std::getline(cases, name, ',')) {
    const auto& src = st.at(name + ".src");
    const auto& dst = st.at(name + ".dst");
    const vit::Index hi = src.shape[0], wi = src.shape[1], C = src.shape[2];
    const vit::Index ho = dst.shape[0], wo = dst.shape[1];
    const vit::Interp mode =
        name.rfind("bilinear", 0) == 0 ? vit::Interp::Bilinear : vit::Interp::Bicubic;
    const bool aa = name.find("_aa_") != std::string::npos;
    const std::vector<float> in = src.to_f32();
    const std::vector<double> want = dst.to_f64();
    std::vector<float> got(ho * wo * C);
    vit::resample_grid(in.data(), hi, wi, got.data(), ho, wo, C, mode, aa);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LT(worst, 2e-6) << name;
    ++n;
  }
  EXPECT_EQ(n, 24);
}

TEST(ResamplePosEmbed, KeepsClassTokenRow) {
  const vit::Index C = 3, g_old = 2, g_new = 3;
  std::vector<float> src((1 + g_old * g_old) * C), dst((1 + g_new * g_new) * C);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i) * 0.5f - 1.0f;
  vit::resample_pos_embed(src.data(), g_old, dst.data(), g_new, 1, C, vit::Interp::Bicubic, false);
  for (vit::Index c = 0; c < C; ++c) EXPECT_EQ(dst[c], src[c]);
  // A constant grid stays constant (weights sum to one).
  std::vector<float> flat(g_old * g_old * C, 2.5f), out(g_new * g_new * C);
  vit::resample_grid(flat.data(), g_old, g_old, out.data(), g_new, g_new, C, vit::Interp::Bicubic,
                     true);
  for (float v : out) EXPECT_NEAR(v, 2.5f, 1e-6);
}

}  // namespace
