// Augmentation flags of `vitrain train` (--aa, --reprob, --mixup, --cutmix, --color-jitter,
// --scale, --ratio, --train-interpolation, --crop-pct): parsing, validation, YAML keys, args.yaml,
// and their translation into data::BatchConfig / data::MixupConfig.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/train_args.h"
#include "core/common.h"
#include "train/batch_config.h"

namespace fs = std::filesystem;

namespace {

vit::TrainArgs parse(std::vector<std::string> args) {
  std::vector<const char*> av = {"train"};
  for (const auto& a : args) av.push_back(a.c_str());
  return vit::parse_train_args(int(av.size()), av.data());
}

std::string error_of(std::vector<std::string> args) {
  try {
    parse(args);
  } catch (const vit::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(AugArgs, DefaultsKeepTheLegacyPipeline) {
  const vit::TrainArgs a = parse({});
  const vit::data::BatchConfig t = vit::train_batch_config(a, 28, {0.3f}, {0.3f});
  EXPECT_FALSE(vit::data::uses_timm_pipeline(t, true));
  EXPECT_EQ(t.crop_padding, a.crop_pad);
  EXPECT_DOUBLE_EQ(t.hflip, 0.0);  // --hflip -1: no flip for in-memory data
  const vit::data::BatchConfig e = vit::eval_batch_config(a, 28, {0.3f}, {0.3f});
  EXPECT_FALSE(vit::data::uses_timm_pipeline(e, false));
  EXPECT_EQ(vit::mixup_config(a).mixup_alpha, 0.0);
}

TEST(AugArgs, FlipDefaultsToTimmsForImageFoldersAndAnExplicitValueWins) {
  const std::vector<float> m = {0.5f, 0.5f, 0.5f}, s = {0.2f, 0.2f, 0.2f};
  EXPECT_DOUBLE_EQ(vit::train_batch_config(parse({}), 32, m, s, true).hflip, 0.5);
  EXPECT_DOUBLE_EQ(vit::train_batch_config(parse({"--hflip", "0"}), 32, m, s, true).hflip, 0.0);
  EXPECT_DOUBLE_EQ(vit::train_batch_config(parse({"--hflip", "0.25"}), 32, m, s).hflip, 0.25);
  EXPECT_NE(error_of({"--hflip", "-0.5"}).find("--hflip"), std::string::npos);
}

TEST(AugArgs, DeitRecipeFlags) {
  const vit::TrainArgs a =
      parse({"--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--mixup", "0.8", "--cutmix",
             "1.0", "--scale", "0.08,1", "--train-interpolation", "bicubic", "--crop-pct", "0.875",
             "--color-jitter", "0.4"});
  const vit::data::BatchConfig t =
      vit::train_batch_config(a, 32, {0.5f, 0.5f, 0.5f}, {0.2f, 0.2f, 0.2f});
  EXPECT_TRUE(t.rrc);
  EXPECT_DOUBLE_EQ(t.scale_lo, 0.08);
  EXPECT_DOUBLE_EQ(t.scale_hi, 1.0);
  EXPECT_NEAR(t.ratio_hi, 4.0 / 3.0, 1e-12);
  EXPECT_EQ(t.auto_augment, "rand-m9-mstd0.5-inc1");
  EXPECT_DOUBLE_EQ(t.reprob, 0.25);
  EXPECT_DOUBLE_EQ(t.color_jitter, 0.4);
  EXPECT_TRUE(vit::data::uses_timm_pipeline(t, true));
  const vit::data::BatchConfig e = vit::eval_batch_config(a, 32, t.mean, t.std);
  EXPECT_DOUBLE_EQ(e.eval_crop_pct, 0.875);
  const vit::data::MixupConfig m = vit::mixup_config(a);
  EXPECT_DOUBLE_EQ(m.mixup_alpha, 0.8);
  EXPECT_DOUBLE_EQ(m.cutmix_alpha, 1.0);
  EXPECT_DOUBLE_EQ(m.switch_prob, 0.5);
  // args.yaml carries them and reads back.
  const std::string y = vit::to_yaml(a);
  EXPECT_NE(y.find("aa: \"rand-m9-mstd0.5-inc1\""), std::string::npos) << y;
  EXPECT_NE(y.find("reprob: 0.25"), std::string::npos) << y;
  const std::string p =
      (fs::temp_directory_path() / ("vitrain_aug_" + std::to_string(getpid()) + ".yaml")).string();
  std::ofstream(p) << y;
  const vit::TrainArgs b = parse({"-c", p});
  fs::remove(p);
  EXPECT_EQ(b.aa, a.aa);
  EXPECT_EQ(b.scale, a.scale);
  EXPECT_DOUBLE_EQ(b.mixup, 0.8);
  EXPECT_DOUBLE_EQ(b.crop_pct, 0.875);
}

TEST(AugArgs, ConfigKeys) {
  const std::string p =
      (fs::temp_directory_path() / ("vitrain_augk_" + std::to_string(getpid()) + ".yaml")).string();
  std::ofstream(p) << "aa: rand-m7\ncolor-jitter: 0.3\ntrain_interpolation: random\n";
  const vit::TrainArgs a = parse({"-c", p, "--reprob", "0.1"});
  fs::remove(p);
  EXPECT_EQ(a.aa, "rand-m7");
  EXPECT_DOUBLE_EQ(a.color_jitter, 0.3);
  EXPECT_EQ(a.train_interpolation, "random");
  EXPECT_DOUBLE_EQ(a.reprob, 0.1);
}

TEST(AugArgs, ClearErrors) {
  auto has = [](const std::string& msg, const char* part) {
    return msg.find(part) != std::string::npos;
  };
  EXPECT_TRUE(has(error_of({"--aa", "autoaug-v0"}), "only RandAugment"));
  EXPECT_TRUE(has(error_of({"--aa", "rand-z3"}), "unknown section 'z3'"));
  EXPECT_TRUE(has(error_of({"--reprob", "1.5"}), "--reprob"));
  EXPECT_TRUE(has(error_of({"--mixup", "-1"}), "--mixup"));
  EXPECT_TRUE(has(error_of({"--cutmix", "-0.5"}), "--cutmix"));
  EXPECT_TRUE(has(error_of({"--color-jitter", "2"}), "--color-jitter"));
  EXPECT_TRUE(has(error_of({"--scale", "0.08"}), "LO,HI"));
  EXPECT_TRUE(has(error_of({"--scale", "0.5,0.2"}), "LO <= HI"));
  EXPECT_TRUE(has(error_of({"--scale", "0.5,1.5"}), "<= 1"));
  EXPECT_TRUE(has(error_of({"--ratio", "x,1"}), "--ratio"));
  EXPECT_TRUE(has(error_of({"--train-interpolation", "lanczos"}), "bilinear, bicubic or random"));
  EXPECT_TRUE(has(error_of({"--crop-pct", "1.2"}), "--crop-pct"));
}
