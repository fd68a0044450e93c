#include "cli/train_args.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <variant>
#include <vector>

#include "core/common.h"

namespace vit {

namespace {

using Target = std::variant<int*, int64_t*, double*, std::string*>;

struct Option {
  std::string flags;  // CLI11 spelling, e.g. "-b,--batch-size"
  std::string key;    // YAML / args.yaml key, e.g. "batch_size"
  std::string help;
  Target target;
};

// The one declaration of every option.
std::vector<Option> options(TrainArgs& a) {
  return {
      {"--data-dir", "data_dir", "data directory (IDX pair per split)", &a.data_dir},
      {"--model", "model", "model preset", &a.model},
      {"--img-size", "img_size", "input image size (0 = the preset's)", &a.img_size},
      {"--num-classes", "num_classes", "classes (0 = from the data)", &a.num_classes},
      {"--gp", "gp", "classifier: token or avg (default: the preset's)", &a.gp},
      {"--ffn", "ffn", "FFN: mlp or local (default: the preset's)", &a.ffn},
      {"--drop-path", "drop_path", "stochastic depth rate (linear over depth)", &a.drop_path},
      {"-b,--batch-size", "batch_size", "batch size per step", &a.batch_size},
      {"--grad-accum-steps", "grad_accum_steps", "micro-batches per update", &a.grad_accum_steps},
      {"--epochs", "epochs", "epochs to train", &a.epochs},
      {"--opt", "opt", "optimizer (adamw)", &a.opt},
      {"--lr", "lr", "peak learning rate", &a.lr},
      {"--min-lr", "min_lr", "cosine floor", &a.min_lr},
      {"--warmup-epochs", "warmup_epochs", "linear warmup length (epochs)", &a.warmup_epochs},
      {"--warmup-lr", "warmup_lr", "learning rate at the start of warmup", &a.warmup_lr},
      {"--weight-decay", "weight_decay", "AdamW decoupled weight decay", &a.weight_decay},
      {"--clip-grad", "clip_grad", "max global grad norm (0 = off)", &a.clip_grad},
      {"--smoothing", "smoothing", "label smoothing", &a.smoothing},
      {"--crop-pad", "crop_pad", "random-crop padding in pixels (0 = off)", &a.crop_pad},
      {"--hflip", "hflip", "horizontal flip probability", &a.hflip},
      {"--seed", "seed", "random seed", &a.seed},
      {"--output", "output", "parent folder of run folders", &a.output},
      {"--experiment", "experiment", "run folder name (default: time-model-size)", &a.experiment},
      {"--resume", "resume", "continue the run in this folder (or state file)", &a.resume},
      {"--initial-checkpoint", "initial_checkpoint", "start from these timm-layout weights",
       &a.initial_checkpoint},
      {"--log-interval", "log_interval", "updates between log lines", &a.log_interval},
      {"--eval-interval", "eval_interval", "epochs between evaluations", &a.eval_interval},
      {"--patience", "patience", "early stopping: evaluations without improvement (0 = off)",
       &a.patience},
      {"-j,--workers", "workers", "threads (0 = all cores)", &a.workers},
      {"--device", "device", "cpu or cuda", &a.device},
      {"--stop-after-updates", "stop_after_updates",
       "save the state and stop after this many updates (testing)", &a.stop_after_updates},
  };
}

std::string normalise_key(std::string k) {
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

void apply_yaml(const std::string& path, std::vector<Option>& opts) {
  if (!std::filesystem::is_regular_file(path))
    throw Error(fmt::format("config file '{}' does not exist", path));
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw Error(fmt::format("config file '{}' is not valid YAML: {}", path, e.msg));
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw Error(fmt::format("config file '{}' is not a key: value map", path));
  for (const auto& kv : root) {
    const std::string key = normalise_key(kv.first.as<std::string>());
    auto it = std::find_if(opts.begin(), opts.end(), [&](const Option& o) { return o.key == key; });
    if (it == opts.end())
      throw Error(fmt::format("config file '{}': unknown key '{}'", path, kv.first.as<std::string>()));
    if (key == "config") throw Error(fmt::format("config file '{}' cannot name another config", path));
    const YAML::Node& v = kv.second;
    try {
      if (!v.IsScalar()) throw YAML::BadConversion(v.Mark());
      std::visit(
          [&](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            *p = v.as<T>();
          },
          it->target);
    } catch (const YAML::Exception&) {
      const char* kind = std::visit(
          [](auto* p) -> const char* {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::string>) return "a string";
            else if constexpr (std::is_same_v<T, double>) return "a number";
            else return "an integer";
          },
          it->target);
      throw Error(fmt::format("config file '{}': '{}' must be {}", path, key, kind));
    }
  }
}

void validate(const TrainArgs& a) {
  VIT_CHECK(a.batch_size > 0, "--batch-size must be positive");
  VIT_CHECK(a.grad_accum_steps > 0, "--grad-accum-steps must be positive");
  VIT_CHECK(a.epochs > 0, "--epochs must be positive");
  VIT_CHECK(a.opt == "adamw", fmt::format("--opt {}: only adamw is supported", a.opt));
  VIT_CHECK(a.lr > 0, "--lr must be positive");
  VIT_CHECK(a.min_lr >= 0 && a.warmup_lr >= 0, "--min-lr and --warmup-lr must be >= 0");
  VIT_CHECK(a.warmup_epochs >= 0, "--warmup-epochs must be >= 0");
  VIT_CHECK(a.weight_decay >= 0, "--weight-decay must be >= 0");
  VIT_CHECK(a.clip_grad >= 0, "--clip-grad must be >= 0");
  VIT_CHECK(a.smoothing >= 0 && a.smoothing < 1, "--smoothing must be in [0, 1)");
  VIT_CHECK(a.drop_path >= 0 && a.drop_path < 1, "--drop-path must be in [0, 1)");
  VIT_CHECK(a.crop_pad >= 0, "--crop-pad must be >= 0");
  VIT_CHECK(a.hflip >= 0 && a.hflip <= 1, "--hflip must be in [0, 1]");
  VIT_CHECK(a.img_size >= 0 && a.num_classes >= 0, "--img-size and --num-classes must be >= 0");
  VIT_CHECK(a.log_interval > 0 && a.eval_interval > 0,
            "--log-interval and --eval-interval must be positive");
  VIT_CHECK(a.patience >= 0 && a.workers >= 0, "--patience and --workers must be >= 0");
  VIT_CHECK(a.device == "cpu" || a.device == "cuda",
            fmt::format("--device {}: use cpu or cuda", a.device));
  VIT_CHECK(a.gp.empty() || a.gp == "token" || a.gp == "avg",
            fmt::format("--gp {}: use token or avg", a.gp));
  VIT_CHECK(a.ffn.empty() || a.ffn == "mlp" || a.ffn == "local",
            fmt::format("--ffn {}: use mlp or local", a.ffn));
  VIT_CHECK(a.stop_after_updates >= 0, "--stop-after-updates must be >= 0");
}

}  // namespace

TrainArgs parse_train_args(int argc, const char* const* argv) {
  TrainArgs a;
  std::vector<Option> opts = options(a);
  // The config file sets defaults first, so flags given on the command line override it.
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if ((s == "-c" || s == "--config") && i + 1 < argc) a.config = argv[i + 1];
    if (s.rfind("--config=", 0) == 0) a.config = s.substr(9);
  }
  if (!a.config.empty()) apply_yaml(a.config, opts);

  CLI::App app{"Train a Vision Transformer (timm-style flags; -c FILE.yaml sets defaults)",
               "vitrain train"};
  // A repeated flag takes its last value, as argparse does (lets scripts append overrides).
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  for (auto& o : opts)
    std::visit([&](auto* p) { app.add_option(o.flags, *p, o.help); }, o.target);
  std::string config_flag = a.config;
  app.add_option("-c,--config", config_flag, "YAML file of defaults (keys as the flags)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested(app.help());
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("train: {}", e.what()));
  }
  validate(a);
  return a;
}

std::string to_yaml(const TrainArgs& in) {
  TrainArgs a = in;
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& o : options(a)) {
    // Not part of the recipe: where it came from, and how this process was started.
    if (o.key == "resume" || o.key == "stop_after_updates") continue;  // not part of a recipe
    out << YAML::Key << o.key << YAML::Value;
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, double>)
            out << fmt::format("{:.17g}", *p);
          else if constexpr (std::is_same_v<T, std::string>)
            out << YAML::DoubleQuoted << *p;
          else
            out << *p;
        },
        o.target);
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace vit
