// `vitrain train --stem conv` end to end on the toy IDX data (8x8 grey images, patch 4: two 3x3
// stride-2 layers): it trains, args.yaml and the checkpoint record the stem, an interrupted run
// resumes bitwise, and eval / export rebuild the conv-stem model from the checkpoint alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_harness.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using vit::testing::run_vitrain;
using vit::testing::RunResult;

namespace {

class ConvStemCli : public vit::testing::CliTest {
 protected:
  std::string train_flags(const std::string& experiment, const std::string& extra = "") {
    return "train --data-dir " + data_ + " --model vit_fmnist_tiny --stem conv --img-size 8 " +
           "--output " + (dir_ / "out").string() + " --experiment " + experiment +
           " -b 64 --epochs 1 --lr 2e-3 --warmup-epochs 0.5 --log-interval 1 -j 2 --seed 5 " +
           "--hflip 0 --crop-pad 0 " + extra;
  }
  std::map<int64_t, double> losses(const std::string& experiment) {
    return vit::testing::train_losses(dir_ / "out" / experiment);
  }
};

TEST_F(ConvStemCli, TrainsResumesBitwiseAndEvaluates) {
  const RunResult s = run_vitrain(train_flags("straight"), dir_.string());
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const fs::path run = dir_ / "out" / "straight";
  std::ifstream yaml(run / "args.yaml");
  std::stringstream text;
  text << yaml.rdbuf();
  EXPECT_NE(text.str().find("stem: \"conv\""), std::string::npos) << text.str();
  const vit::WeightsFile w = vit::load_weights((run / "last.safetensors").string());
  EXPECT_EQ(w.cfg.stem, vit::Stem::Conv);
  EXPECT_EQ(w.cfg.stem_widths(), (std::vector<int>{48, 96}));

  // Interrupted after 3 of the 8 updates, then resumed from the run folder alone.
  ASSERT_EQ(run_vitrain(train_flags("split", "--stop-after-updates 3"), dir_.string()).exit_code,
            0);
  const RunResult b =
      run_vitrain("train --resume " + (dir_ / "out" / "split").string(), dir_.string());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ref = losses("straight"), got = losses("split");
  ASSERT_EQ(ref.size(), 8u);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [step, loss] : ref) EXPECT_EQ(got.at(step), loss) << "step " << step;

  const RunResult e = run_vitrain(
      "eval --checkpoint " + (run / "last.safetensors").string() + " --data-dir " + data_,
      dir_.string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("top-1"), std::string::npos) << e.out;
  const RunResult x = run_vitrain("export --checkpoint " + (run / "last.safetensors").string() +
                                      " --out " + (dir_ / "exp").string(),
                                  dir_.string());
  ASSERT_EQ(x.exit_code, 0) << x.err;
  std::ifstream cj(dir_ / "exp" / "config.json");
  EXPECT_EQ(nlohmann::json::parse(cj).at("architecture"), "vitrain_vit_conv_stem");
}

// The default recipe's preset (conv stem and locality FFN) exported and checked outside vitrain
// by tests/reference/timm_logits_check.py, as gpu_check.sh does on the device: config.json names
// both parts, and the PyTorch reference module built from it gives vitrain's fp32 logits.
TEST_F(ConvStemCli, HybridExportGivesTheLogitsInThePyTorchReference) {
  const std::string flags =
      "train --data-dir " + data_ + " --model vit_fmnist_hybrid --img-size 8 --output " +
      (dir_ / "out").string() + " --experiment hybrid -b 64 --epochs 1 -j 2 --seed 5 --hflip 0";
  ASSERT_EQ(run_vitrain(flags, dir_.string()).exit_code, 0);
  const std::string ckpt = (dir_ / "out" / "hybrid" / "last.safetensors").string();
  const std::string exp = (dir_ / "hexp").string(), npy = (dir_ / "logits.npy").string();
  ASSERT_EQ(run_vitrain("export --checkpoint " + ckpt + " --out " + exp, dir_.string()).exit_code,
            0);
  const auto cfg = nlohmann::json::parse(vit::testing::slurp(fs::path(exp) / "config.json"));
  EXPECT_EQ(cfg.at("architecture"), "vitrain_vit_conv_stem");
  EXPECT_EQ(cfg.at("model_args").at("ffn"), "local");
  EXPECT_EQ(cfg.at("model_args").at("stem"), "conv");
  const RunResult e =
      run_vitrain("eval --checkpoint " + ckpt + " --data-dir " + data_ + " --save-logits " + npy,
                  dir_.string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const RunResult check = vit::testing::run_logits_check(exp, npy, data_, dir_.string());
  EXPECT_EQ(check.exit_code, 0) << check.out;
  EXPECT_NE(check.out.find("torch_vit.py (timm has no locality FFN or conv stem)"),
            std::string::npos)
      << check.out;
}

TEST_F(ConvStemCli, UnknownStemIsOneClearError) {
  const RunResult bad = run_vitrain("train --data-dir " + data_ + " --stem resnet", dir_.string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--stem resnet: use patch or conv"), std::string::npos) << bad.err;
}

}  // namespace
