// `--ffn mlp_tanh` (the GELU's tanh form, which the GPU fuses into fc1's GEMM epilogues) end to
// end on the toy IDX data (8x8 grey images, patch 4): args.yaml and the checkpoint record it, a
// bad value is one clear error, and the export is a timm ViT with act_layer gelu_tanh that the
// PyTorch reference (tests/reference/timm_logits_check.py) builds and runs to vitrain's logits.
// After one epoch on 8x8 images fc1's pre-activations are too small for the two GELUs to differ
// at the check's tolerance, so config.json's act_layer is what tells them apart here; the
// numerics are test_golden's (mlp_tanh_token: the erf GELU in its place misses PyTorch's logits
// by 1.5e-4 against the 1e-4 tolerance, measured) and test_model_fd's.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_harness.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using vit::testing::run_vitrain;
using vit::testing::RunResult;

namespace {

class GeluTanhCli : public vit::testing::CliTest {};

TEST_F(GeluTanhCli, TrainsAndExportsATimmViTWithTheTanhGelu) {
  const std::string flags = "train --data-dir " + data_ +
                            " --model vit_fmnist_tiny --ffn mlp_tanh --img-size 8 --output " +
                            (dir_ / "out").string() +
                            " --experiment tanh -b 64 --epochs 1 -j 2 --seed 5 --hflip 0";
  const RunResult t = run_vitrain(flags, dir_.string());
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(vit::testing::slurp(dir_ / "out" / "tanh" / "args.yaml").find("ffn: \"mlp_tanh\""),
            std::string::npos);
  const std::string ckpt = (dir_ / "out" / "tanh" / "last.safetensors").string();
  EXPECT_EQ(vit::load_weights(ckpt).cfg.ffn, vit::Ffn::MlpTanh);

  const std::string exp = (dir_ / "texp").string(), npy = (dir_ / "logits.npy").string();
  const RunResult x = run_vitrain("export --checkpoint " + ckpt + " --out " + exp, dir_.string());
  ASSERT_EQ(x.exit_code, 0) << x.err;
  const auto cfg = nlohmann::json::parse(vit::testing::slurp(fs::path(exp) / "config.json"));
  EXPECT_EQ(cfg.at("architecture"), "vit_tiny_patch16_224");  // timm builds it
  EXPECT_EQ(cfg.at("model_args").at("act_layer"), "gelu_tanh");
  const RunResult e =
      run_vitrain("eval --checkpoint " + ckpt + " --data-dir " + data_ + " --save-logits " + npy,
                  dir_.string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const RunResult check =
      vit::testing::run_logits_check(exp, npy, data_, dir_.string(), "--allow-reference");
  EXPECT_EQ(check.exit_code, 0) << check.out;
}

TEST_F(GeluTanhCli, UnknownFfnIsOneClearError) {
  const RunResult bad = run_vitrain("train --data-dir " + data_ + " --ffn gelu_erf", dir_.string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--ffn gelu_erf: use mlp, mlp_tanh or local"), std::string::npos)
      << bad.err;
}

}  // namespace
