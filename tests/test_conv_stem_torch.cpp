// The whole conv stem (src/model/conv_stem.h) on the CPU fp32 backend against PyTorch: an image
// (2, 3, 24, 24) through torch_vit.ConvStem with patch 8 (three 3x3 stride-2 layers of widths
// 16, 16, 24, each Conv2d without bias + LayerNorm over channels + ReLU, then a 1x1 Conv2d with
// bias to C = 24), forward tokens and every stem parameter's gradient for a random upstream
// gradient, in fp64 from the same fp32 values (tests/reference/torch_ref.py, case conv_stem).
// Same error metric as test_ops_torch.cpp: max |ours - torch| / max |torch| per tensor, 1e-5
// (a chain of GEMMs and LayerNorms in fp32; measured ~1e-7..1e-6).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "backend/host.h"
#include "io/safetensors.h"
#include "model/conv_stem.h"

namespace {

using vit::Index;
using Vec = std::vector<float>;

const std::string kRefPath = std::string(VIT_REFERENCE_DIR) + "/ops.safetensors";
constexpr double kTol = 1e-5;

// Max |ours - want| / max |want|, printed; ours must be finite.
void expect_close(const float* ours, const std::string& name) {
  static const vit::io::SafeTensors st = vit::io::read_safetensors(kRefPath);
  const std::vector<double> want = st.at(name).to_f64();
  double scale = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(ours[i])) << name << "[" << i << "]";
    scale = std::max(scale, std::fabs(want[i]));
    err = std::max(err, std::fabs(ours[i] - want[i]));
  }
  const double rel = err / std::max(scale, 1e-30);
  EXPECT_LE(rel, kTol) << name << " (scale " << scale << ")";
  std::printf("  %-48s rel err %.2e\n", name.c_str(), rel);
}

TEST(ConvStemTorch, ForwardAndBackwardMatchPyTorch) {
  if (!std::filesystem::exists(kRefPath)) {
    if (std::getenv("VIT_ALLOW_MISSING_REFERENCE") != nullptr)
      GTEST_SKIP() << "no PyTorch reference at " << kRefPath;
    FAIL() << "missing PyTorch reference " << kRefPath
           << ": run tests/reference/torch_ref.py (the torch_reference ctest fixture)";
  }
  const vit::io::SafeTensors st = vit::io::read_safetensors(kRefPath);
  const std::vector<float> d = st.at("conv_stem.dims").to_f32();
  const Index B = Index(d[0]);
  vit::ModelConfig cfg;
  cfg.in_chans = int(d[1]);
  cfg.img_size = int(d[2]);
  cfg.patch_size = int(d[3]);
  cfg.embed_dim = int(d[4]);
  cfg.num_heads = 1;
  cfg.depth = 1;
  cfg.stem = vit::Stem::Conv;
  cfg.validate();
  ASSERT_EQ(cfg.stem_widths(), (std::vector<int>{16, 16, 24}));

  // The stem's tensors: exactly the module's state_dict, same shapes.
  const vit::ParamTable table = vit::build_param_table(cfg);
  Vec params(size_t(table.total), 0.0f), grads(size_t(table.total), 0.0f);
  std::set<std::string> ours, theirs;
  for (const auto& t : st.tensors)
    if (t.name.rfind("conv_stem.w.", 0) == 0) theirs.insert(t.name.substr(12));
  for (const auto& s : table.specs) {
    if (s.name.rfind("patch_embed.", 0) != 0) continue;
    ours.insert(s.name);
    const vit::io::Tensor& t = st.at("conv_stem.w." + s.name);
    ASSERT_EQ(t.shape, s.shape) << s.name;
    const Vec v = t.to_f32();
    std::copy(v.begin(), v.end(), params.begin() + s.offset);
  }
  ASSERT_EQ(ours, theirs);

  // Activations: each slot its own NaN-filled vector (an unwritten element shows).
  std::deque<Vec> bufs;
  auto slot = [&](float*& ptr, const std::string&, Index n) {
    bufs.emplace_back(size_t(n), std::numeric_limits<float>::quiet_NaN());
    ptr = bufs.back().data();
  };
  vit::StemActs<float, float> acts;
  vit::plan_stem(acts, cfg, B, slot);
  const auto w = vit::bind_view(table, cfg, params.data());
  const auto g = vit::bind_view(table, cfg, grads.data());

  using Cpu = vit::CpuBackend<float>;
  const Vec img = st.at("conv_stem.img").to_f32(), dout = st.at("conv_stem.dout").to_f32();
  Vec out(size_t(B * cfg.num_patches() * cfg.embed_dim), std::numeric_limits<float>::quiet_NaN());
  vit::stem_forward<Cpu>(acts, w, out.data(), img.data(), B, cfg);
  expect_close(out.data(), "conv_stem.out");
  vit::stem_backward<Cpu>(acts, w, g, dout.data(), B, cfg);
  for (const auto& s : table.specs)
    if (s.name.rfind("patch_embed.", 0) == 0)
      expect_close(grads.data() + s.offset, "conv_stem.d." + s.name);
}

}  // namespace
