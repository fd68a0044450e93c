// `vitrain train` options: defaults, flags, config-file precedence (file sets defaults, flags
// win), typos and wrong types in the file, invalid values, and args.yaml round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/train_args.h"
#include "core/common.h"
#include "core/utf8.h"

namespace fs = std::filesystem;

namespace {

vit::TrainArgs parse(std::vector<std::string> args) {
  std::vector<const char*> av = {"train"};
  for (const auto& a : args) av.push_back(a.c_str());
  return vit::parse_train_args(int(av.size()), av.data());
}

// The vit::Error message of parsing args, or "(accepted)".
std::string message(std::vector<std::string> args) {
  try {
    parse(args);
  } catch (const vit::Error& e) {
    return std::string(e.what());
  }
  return std::string("(accepted)");
}

std::string temp_yaml(const std::string& name, const std::string& text) {
  const std::string p =
      (fs::temp_directory_path() / ("vitrain_args_" + std::to_string(getpid()) + name)).string();
  std::ofstream(p) << text;
  return p;
}

TEST(TrainArgs, Defaults) {
  const vit::TrainArgs a = parse({});
  EXPECT_EQ(a.model, "vit_fmnist_hybrid");
  EXPECT_EQ(a.data_dir, "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(a.batch_size, 64);
  EXPECT_EQ(a.opt, "adamw");
  EXPECT_EQ(a.device, "auto");
}

// recipes/fmnist.yaml promises to spell out the flag defaults: the effective configs must agree.
TEST(TrainArgs, DefaultRecipeFileIsTheDefaults) {
  const vit::TrainArgs from_file = parse({"-c", VIT_SOURCE_DIR "/recipes/fmnist.yaml"});
  EXPECT_EQ(vit::to_yaml(from_file), vit::to_yaml(parse({})));
  // The quick recipe differs only in its length.
  vit::TrainArgs quick = parse({"-c", VIT_SOURCE_DIR "/recipes/fmnist_quick.yaml"});
  EXPECT_EQ(quick.epochs, 3);
  quick.epochs = parse({}).epochs;
  EXPECT_EQ(vit::to_yaml(quick), vit::to_yaml(parse({})));
}

TEST(TrainArgs, FlagsAndShortForms) {
  const vit::TrainArgs a = parse({"-b",
                                  "64",
                                  "--lr",
                                  "3e-4",
                                  "--epochs",
                                  "7",
                                  "-j",
                                  "1",
                                  "--model",
                                  "vit_tiny_patch4_28",
                                  "--gp",
                                  "token",
                                  "--ffn",
                                  "local",
                                  "--clip-grad",
                                  "1.5",
                                  "--patience",
                                  "3",
                                  "--max-bad-steps",
                                  "4"});
  EXPECT_EQ(a.batch_size, 64);
  EXPECT_DOUBLE_EQ(a.lr, 3e-4);
  EXPECT_EQ(a.epochs, 7);
  EXPECT_EQ(a.workers, 1);
  EXPECT_EQ(a.model, "vit_tiny_patch4_28");
  EXPECT_EQ(a.gp, "token");
  EXPECT_EQ(a.ffn, "local");
  EXPECT_DOUBLE_EQ(a.clip_grad, 1.5);
  EXPECT_EQ(a.patience, 3);
  EXPECT_EQ(a.max_bad_steps, 4);
}

TEST(TrainArgs, ConfigSetsDefaultsAndFlagsOverride) {
  const std::string cfg = temp_yaml("prec.yaml", "batch_size: 32\nlr: 0.01\nwarmup-epochs: 2\n");
  vit::TrainArgs a = parse({"-c", cfg});
  EXPECT_EQ(a.batch_size, 32);
  EXPECT_DOUBLE_EQ(a.lr, 0.01);
  EXPECT_DOUBLE_EQ(a.warmup_epochs, 2.0);             // dashed keys work too
  a = parse({"--lr", "0.5", "-c", cfg, "-b", "16"});  // flags win wherever they stand
  EXPECT_EQ(a.batch_size, 16);
  EXPECT_DOUBLE_EQ(a.lr, 0.5);
  EXPECT_DOUBLE_EQ(a.warmup_epochs, 2.0);
  fs::remove(cfg);
}

TEST(TrainArgs, ConfigInEverySpelling) {
  const std::string cfg = temp_yaml("spell.yaml", "epochs: 9\nexperiment:\n");
  EXPECT_EQ(parse({"--config", cfg}).epochs, 9);
  EXPECT_EQ(parse({"--config=" + cfg}).epochs, 9);
  EXPECT_EQ(parse({"-c" + cfg}).epochs, 9);
  EXPECT_EQ(parse({"-c", cfg}).config, cfg);
  EXPECT_EQ(parse({"-c", cfg}).experiment, "");  // a null value is an empty string
  EXPECT_EQ(parse({"-c", cfg, "--epochs", "2"}).epochs, 2);
  fs::remove(cfg);
}

TEST(TrainArgs, ConfigValuesShowInHelp) {
  const std::string cfg = temp_yaml("help.yaml", "batch_size: 77\n");
  try {
    parse({"-c", cfg, "--help"});
    ADD_FAILURE() << "--help did not throw HelpRequested";
  } catch (const vit::HelpRequested& h) {
    const std::string text = h.what();
    EXPECT_NE(text.find("--batch-size"), std::string::npos);
    EXPECT_NE(text.find("77"), std::string::npos);
  }
  fs::remove(cfg);
}

TEST(TrainArgs, ConfigErrorsNameTheProblem) {
  const std::string typo = temp_yaml("typo.yaml", "batch_sise: 32\n");
  const std::string type = temp_yaml("type.yaml", "epochs: many\n");
  const std::string list = temp_yaml("list.yaml", "- a\n- b\n");
  const std::string broken = temp_yaml("broken.yaml", "epochs: [1,\n");
  EXPECT_NE(message({"-c", typo}).find("unknown key 'batch_sise'"), std::string::npos);
  EXPECT_NE(message({"-c", typo}).find(typo), std::string::npos);  // names the file
  EXPECT_NE(message({"-c", type}).find(type), std::string::npos);
  EXPECT_NE(message({"-c", type}).find("'epochs' must be an integer"), std::string::npos);
  EXPECT_NE(message({"-c", list}).find("key: value"), std::string::npos);
  EXPECT_NE(message({"-c", broken}).find("not valid YAML"), std::string::npos);
  EXPECT_NE(message({"-c", "/nonexistent.yaml"}).find("does not exist"), std::string::npos);
  for (const auto& p : {typo, type, list, broken}) fs::remove(p);
}

TEST(TrainArgs, InvalidFlagsAreErrors) {
  EXPECT_THROW(parse({"--no-such-flag"}), vit::Error);
  EXPECT_THROW(parse({"--epochs", "ten"}), vit::Error);
  EXPECT_THROW(parse({"-b", "0"}), vit::Error);
  EXPECT_THROW(parse({"--lr", "-1"}), vit::Error);
  EXPECT_THROW(parse({"--opt", "sgd"}), vit::Error);
  EXPECT_THROW(parse({"--device", "tpu"}), vit::Error);
  EXPECT_THROW(parse({"--gp", "max"}), vit::Error);
  EXPECT_THROW(parse({"--smoothing", "1.5"}), vit::Error);
  EXPECT_THROW(parse({"--epochs", "2.5"}), vit::Error);
  EXPECT_THROW(parse({"--lr", "inf"}), vit::Error);
  EXPECT_THROW(parse({"--grad-accum-steps", "0"}), vit::Error);
  EXPECT_THROW(parse({"--ffn", "conv"}), vit::Error);
  EXPECT_THROW(parse({"--warmup-epochs", "-1"}), vit::Error);
  EXPECT_THROW(parse({"--max-bad-steps", "0"}), vit::Error);
  EXPECT_THROW(parse({"--lr"}), vit::Error);   // missing value
  EXPECT_THROW(parse({"stray"}), vit::Error);  // positional
  EXPECT_THROW(parse({"--help"}), vit::HelpRequested);
  EXPECT_THROW(parse({"-h"}), vit::HelpRequested);
}

TEST(TrainArgs, ErrorsAreOneLine) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--no-such-flag"}, {"--epochs", "ten"}, {"--lr"}, {"stray"}}) {
    try {
      parse(args);
      ADD_FAILURE() << "accepted " << args[0];
    } catch (const vit::Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_FALSE(m.empty());
    }
  }
  try {
    parse({"--no-such-flag"});
  } catch (const vit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--no-such-flag"), std::string::npos) << e.what();
  }
}

TEST(TrainArgs, ArgsYamlRoundTrips) {
  const vit::TrainArgs a = parse({"-b", "48", "--lr", "0.00123456789", "--experiment", "my run: 1",
                                  "--drop-path", "0.1", "--seed", "7"});
  const std::string yaml = vit::to_yaml(a);
  const std::string p = temp_yaml("rt.yaml", yaml);
  const vit::TrainArgs b = parse({"-c", p});
  EXPECT_EQ(vit::to_yaml(b), yaml);
  EXPECT_EQ(b.batch_size, 48);
  EXPECT_DOUBLE_EQ(b.lr, 0.00123456789);
  EXPECT_EQ(b.experiment, "my run: 1");
  EXPECT_EQ(b.seed, 7);
  fs::remove(p);
  // Defaults round-trip too, and doubles are spelled as YAML 1.1 floats (1.0e-05, not 1e-05).
  const std::string def = vit::to_yaml(parse({}));
  EXPECT_NE(def.find("min_lr: 1.0e-05"), std::string::npos) << def;
  EXPECT_NE(def.find("batch_size: 64"), std::string::npos) << def;
  const std::string p2 = temp_yaml("rt2.yaml", def);
  EXPECT_EQ(vit::to_yaml(parse({"-c", p2})), def);
  fs::remove(p2);
}

TEST(TrainArgs, SeedMethodFlags) {
  const vit::TrainArgs d = parse({});
  EXPECT_EQ(d.curriculum, "none");
  EXPECT_EQ(d.lowfreq, "fft");
  EXPECT_EQ(d.budget, "");
  EXPECT_EQ(d.replay, 1);
  EXPECT_EQ(d.eval_size, 0);
  const vit::TrainArgs a =
      parse({"--curriculum", "size", "--init-size", "8", "--size-step", "4", "--size-every", "2",
             "--lowfreq", "downsample", "--budget", "90m", "--replay", "4", "--eval-size", "32"});
  EXPECT_EQ(a.curriculum, "size");
  EXPECT_EQ(a.init_size, 8);
  EXPECT_EQ(a.size_step, 4);
  EXPECT_EQ(a.size_every, 2);
  EXPECT_EQ(a.lowfreq, "downsample");
  EXPECT_EQ(a.budget, "90m");
  EXPECT_EQ(a.replay, 4);
  EXPECT_EQ(a.eval_size, 32);
  EXPECT_EQ(parse({"--curriculum", "efficienttrain"}).curriculum, "efficienttrain");
  EXPECT_EQ(d.et_table, "deit");
  EXPECT_DOUBLE_EQ(d.et_warmup, 0.2);
  const vit::TrainArgs e = parse({"--et-table", "convnext", "--et-warmup", "0.05"});
  EXPECT_EQ(e.et_table, "convnext");
  EXPECT_DOUBLE_EQ(e.et_warmup, 0.05);
  for (const char* b : {"24h", "45s", "1h30m", "600"}) EXPECT_EQ(parse({"--budget", b}).budget, b);
  // Bad values are one-line errors naming the flag.
  for (const auto& bad : std::vector<std::vector<std::string>>{{"--curriculum", "borealis"},
                                                               {"--lowfreq", "lanczos"},
                                                               {"--budget", "10x"},
                                                               {"--budget", "0s"},
                                                               {"--budget", "-5m"},
                                                               {"--replay", "0"},
                                                               {"--size-every", "0"},
                                                               {"--init-size", "-1"},
                                                               {"--eval-size", "-4"},
                                                               {"--et-table", "resnet"},
                                                               {"--et-warmup", "1"},
                                                               {"--et-warmup", "-0.1"},
                                                               {"--et-warmup", "nan"}}) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted " << bad[0] << " " << bad[1];
    } catch (const vit::Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  // YAML keys and the args.yaml dump.
  const std::string p = temp_yaml("seed.yaml",
                                  "curriculum: efficienttrain\nlowfreq: downsample\nbudget: 45s\n"
                                  "replay: 2\ninit-size: 12\nsize_step: 8\nsize_every: 3\n"
                                  "eval_size: 28\n");
  const vit::TrainArgs c = parse({"-c", p});
  EXPECT_EQ(c.curriculum, "efficienttrain");
  EXPECT_EQ(c.lowfreq, "downsample");
  EXPECT_EQ(c.budget, "45s");
  EXPECT_EQ(c.replay, 2);
  EXPECT_EQ(c.init_size, 12);
  EXPECT_EQ(c.size_step, 8);
  EXPECT_EQ(c.size_every, 3);
  EXPECT_EQ(c.eval_size, 28);
  const std::string yaml = vit::to_yaml(c);
  for (const char* k :
       {"curriculum: \"efficienttrain\"", "lowfreq: \"downsample\"", "budget: \"45s\"", "replay: 2",
        "init_size: 12", "size_step: 8", "size_every: 3", "eval_size: 28"})
    EXPECT_NE(yaml.find(k), std::string::npos) << k << "\n" << yaml;
  const std::string p2 = temp_yaml("seed2.yaml", yaml);
  EXPECT_EQ(vit::to_yaml(parse({"-c", p2})), yaml);
  fs::remove(p);
  fs::remove(p2);
}

}  // namespace

// parse_train_config (the config fuzz target's entry) is `train -c FILE`: the same args for
// every recipe and the same one-line error for every refused file.
TEST(TrainArgs, ConfigAloneIsTrainDashC) {
  auto outcome = [](auto&& read) {
    try {
      return vit::to_yaml(read());
    } catch (const vit::Error& e) {
      return std::string("error: ") + e.what();
    }
  };
  // Every recipe in recipes/: each must be accepted.
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(VIT_SOURCE_DIR "/recipes"))
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  const int recipes = int(files.size());
  ASSERT_GE(recipes, 5);  // fmnist, fmnist_30m, fmnist_long, fmnist_quick, imagenet_vit_s_24h
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"alone_empty.yaml", ""},
      {"alone_ok.yaml", "batch_size: 32\nlr: 0.01\nexperiment:\nmodel-ema: true\n"},
      {"alone_typo.yaml", "batch_sise: 32\n"},
      {"alone_type.yaml", "epochs: many\n"},
      {"alone_invalid.yaml", "batch_size: -1\n"},
      {"alone_broken.yaml", "epochs: [1,\n"}};
  for (const auto& [name, text] : texts) files.push_back(temp_yaml(name, text));
  files.push_back("/nonexistent.yaml");
  int accepted = 0;
  for (const auto& f : files) {
    const std::string alone = outcome([&] { return vit::parse_train_config(f); });
    EXPECT_EQ(alone, outcome([&] { return parse({"-c", f}); })) << f;
    accepted += alone.rfind("error: ", 0) != 0;
  }
  EXPECT_EQ(accepted, recipes + 2);  // the recipes, the empty file and alone_ok
  for (const auto& t : texts) fs::remove(temp_yaml(t.first, ""));
}

// args.yaml is UTF-8: text options that are not (from a flag or a config file) are one clear
// error naming the flag, so every accepted run's args.yaml reads back as the same run. Found by
// fuzz_config: an overlong '.' in --aa was skipped by the RandAugment parser but written as '.'.
// Every number is finite, whichever option holds it: fuzz_config (2026-11-25, 68167c7) found
// `dist_timeout: .Inf` accepted, and the args.yaml it wrote refused on reading back.
TEST(TrainArgs, EveryNumberIsFinite) {
  for (const char* flag : {"--dist-timeout", "--mixup", "--cutmix", "--reprob", "--model-ema-decay",
                           "--color-jitter", "--lr"})
    for (const char* v : {"inf", "-inf", "nan"}) {
      try {
        parse({flag, v});
        ADD_FAILURE() << "accepted " << flag << " " << v;
      } catch (const vit::Error& e) {
        EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
      }
    }
  const std::string p = temp_yaml("inf.yaml", "dist_timeout: .Inf\n");
  EXPECT_THROW(parse({"-c", p}), vit::Error);
  EXPECT_THROW(vit::parse_train_config(p), vit::Error);
}

TEST(TrainArgs, TextIsUtf8) {
  EXPECT_TRUE(vit::valid_utf8("ascii, caf\xc3\xa9, \xe2\x98\x95, \xf0\x9d\x94\x81"));
  for (const char* bad : {"\xc0\xae", "\xe0\x80\xae", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xa5",
                          "caf\xe9", "\xe2\x98", "\xff"})
    EXPECT_FALSE(vit::valid_utf8(bad)) << bad;
  EXPECT_EQ(message({"--experiment", "caf\xe9"}),
            "--experiment: not valid UTF-8 text (args.yaml is UTF-8)");
  const std::string overlong = temp_yaml("overlong.yaml", "aa: rand-m9-`\xc0\xae-mstd0.5\n");
  EXPECT_EQ(message({"-c", overlong}), "--aa: not valid UTF-8 text (args.yaml is UTF-8)");
  // Valid text beyond ASCII round-trips through args.yaml byte for byte.
  const vit::TrainArgs a = parse({"--experiment", "caf\xc3\xa9 \xe2\x98\x95 \xf0\x9d\x94\x81"});
  const std::string dump = temp_yaml("utf8_rt.yaml", vit::to_yaml(a));
  EXPECT_EQ(parse({"-c", dump}).experiment, a.experiment);
  for (const auto& p : {overlong, dump}) fs::remove(p);
}
