#include "cli/train_args.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <variant>
#include <vector>

#include "core/common.h"
#include "core/utf8.h"
#include "ops/kernel_options.h"
#include "train/batch_config.h"
#include "train/budget.h"
#include "train/curriculum.h"

namespace vit {

namespace {

using Target = std::variant<bool*, int*, int64_t*, double*, std::string*>;

struct Option {
  std::string flags;  // CLI11 spelling, e.g. "-b,--batch-size"
  std::string key;    // YAML / args.yaml key, e.g. "batch_size"
  std::string help;
  Target target;
};

// The one declaration of every option.
std::vector<Option> options(TrainArgs& a) {
  return {
      {"--data-dir", "data_dir",
       "data directory: IDX or CIFAR files, an ImageFolder root (train/, val/) or the output "
       "folder of vitrain prepare",
       &a.data_dir},
      {"--class-map", "class_map", "ImageFolder class order: a file with one class per line",
       &a.class_map},
      {"--model", "model", "model preset", &a.model},
      {"--img-size", "img_size", "input image size (0 = the preset's)", &a.img_size},
      {"--num-classes", "num_classes", "classes (0 = from the data)", &a.num_classes},
      {"--gp", "gp", "classifier: token or avg (default: the preset's)", &a.gp},
      {"--ffn", "ffn", "FFN: mlp, mlp_tanh (GELU's tanh form) or local (default: the preset's)",
       &a.ffn},
      {"--stem", "stem",
       "patch embedding: patch (one stride-P conv) or conv (3x3 stride-2 convs + LayerNorm + "
       "ReLU, then 1x1; P a power of two) (default: the preset's)",
       &a.stem},
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
      {"--hflip", "hflip",
       "horizontal flip probability (-1 = 0.5 for image folders, 0 for in-memory data)", &a.hflip},
      // timm augmentation pipeline (validated in train/batch_config.cpp).
      {"--aa", "aa", "RandAugment, e.g. rand-m9-mstd0.5-inc1 (empty = off)", &a.aa},
      {"--reprob", "reprob", "random erasing probability (pixel mode)", &a.reprob},
      {"--aug-repeats", "aug_repeats",
       "repeated augmentation: each sample this many times per epoch (1 = off)", &a.aug_repeats},
      {"--mixup", "mixup", "mixup alpha (0 = off)", &a.mixup},
      {"--cutmix", "cutmix", "cutmix alpha (0 = off)", &a.cutmix},
      {"--mixup-prob", "mixup_prob", "probability of mixing a batch", &a.mixup_prob},
      {"--mixup-switch-prob", "mixup_switch_prob", "cutmix share when both are on",
       &a.mixup_switch_prob},
      {"--color-jitter", "color_jitter", "colour jitter strength (0 = off; ignored with --aa)",
       &a.color_jitter},
      {"--scale", "scale", "RandomResizedCrop area range LO,HI, e.g. 0.08,1 (empty = no RRC)",
       &a.scale},
      {"--ratio", "ratio", "RandomResizedCrop aspect range LO,HI", &a.ratio},
      {"--train-interpolation", "train_interpolation", "bilinear, bicubic or random",
       &a.train_interpolation},
      {"--crop-pct", "crop_pct", "eval resize to size/crop_pct + centre crop (0 = plain resize)",
       &a.crop_pct},
      {"--seed", "seed", "random seed", &a.seed},
      {"--output", "output", "parent folder of run folders", &a.output},
      {"--experiment", "experiment", "run folder name (default: time-model-size)", &a.experiment},
      {"--resume", "resume", "continue the run in this folder (or state file)", &a.resume},
      {"--initial-checkpoint", "initial_checkpoint", "start from these timm-layout weights",
       &a.initial_checkpoint},
      {"--log-interval", "log_interval", "updates between log lines", &a.log_interval},
      {"--eval-interval", "eval_interval", "epochs between evaluations", &a.eval_interval},
      {"--model-ema", "model_ema",
       "keep an exponential moving average of the weights; it is evaluated beside them and "
       "its metric picks model_best",
       &a.model_ema},
      {"--model-ema-decay", "model_ema_decay", "EMA decay per update", &a.model_ema_decay},
      {"--dist-timeout", "dist_timeout",
       "data parallel: seconds a collective may wait for the other ranks before this rank ends "
       "with a message (0 = forever)",
       &a.dist_timeout},
      {"--shard-optimizer", "shard_optimizer",
       "data parallel (mpirun): ZeRO-1, each rank updates its block of the weights and AdamW "
       "moments (reduce-scatter the gradients, all-gather the weights)",
       &a.shard_optimizer},
      {"--model-ema-warmup", "model_ema_warmup",
       "EMA decay warm-up: 1 - (1 + step)^(-2/3), capped at --model-ema-decay",
       &a.model_ema_warmup},
      {"--patience", "patience", "early stopping: evaluations without improvement (0 = off)",
       &a.patience},
      {"--max-bad-steps", "max_bad_steps",
       "updates with a non-finite loss or grad norm are skipped; this many in a row stop the run",
       &a.max_bad_steps},
      {"-j,--workers", "workers",
       "threads for compute and for decoding streamed images (0 = all cores)", &a.workers},
      {"--device", "device",
       "auto (the GPU when one is usable, else the CPU), cpu, cuda, or emu (the CPU bf16 "
       "emulation of the GPU's numerics, for testing)",
       &a.device},
      {"--precision", "precision", "cuda: bf16 (mixed precision, fp32 master weights) or fp32",
       &a.precision},
      {"--fp32-residual", "fp32_residual",
       "bf16 modes: keep the residual stream and its gradient in fp32 (as PyTorch autocast "
       "does); the other activations stay bf16",
       &a.fp32_residual},
      {"--kernels", "kernels",
       "kernel options k=v,... (the plan chooses the rest; the run folder's kernels.json says "
       "what ran):\n" + kernel_options_help(),
       &a.kernels},
      {"--cuda-graph", "cuda_graph",
       "cuda: replay each micro-batch's forward and backward as a CUDA graph (one launch "
       "instead of hundreds: small models; the same bits); on by default, --cuda-graph=false "
       "runs every kernel eagerly; no effect on the CPU or in data-parallel runs",
       &a.cuda_graph},
      {"--augment-on-device", "augment_on_device",
       "resize, flip, RandAugment / colour jitter, normalise, erase and mix training images "
       "where the model runs (on the GPU: uint8 crops travel, not float images); not with "
       "EfficientTrain++, replay or an in-memory set's pad-and-crop path",
       &a.augment_on_device},
      {"--stop-after-updates", "stop_after_updates",
       "save the state and stop after this many updates (testing)", &a.stop_after_updates},
      {"--curriculum", "curriculum", "seed method: none, size (Borealis) or efficienttrain (ET++)",
       &a.curriculum},
      {"--init-size", "init_size", "size curriculum: first training size (0 = one size step)",
       &a.init_size},
      {"--size-step", "size_step", "size curriculum: pixels added per step (0 = patch size)",
       &a.size_step},
      {"--size-every", "size_every", "size curriculum: epochs per size step", &a.size_every},
      {"--lowfreq", "lowfreq", "efficienttrain low-frequency crop: fft or downsample", &a.lowfreq},
      {"--et-table", "et_table",
       "efficienttrain size table: deit, swin, convnext (scaled to the final size) or ten "
       "comma-separated sizes",
       &a.et_table},
      {"--et-warmup", "et_warmup", "efficienttrain LR warm-up, as a fraction of the compute",
       &a.et_warmup},
      {"--budget", "budget", "wall-clock budget (24h, 90m, 45s, 1h30m); replaces --epochs",
       &a.budget},
      {"--replay", "replay", "replay buffer: train each fresh batch R times (1 = off)", &a.replay},
      {"--eval-size", "eval_size", "evaluation image size (0 = the final training size)",
       &a.eval_size},
  };
}

std::string long_flag(const std::string& flags) {  // "-b,--batch-size" -> "--batch-size"
  const size_t at = flags.rfind("--");
  return at == std::string::npos ? flags : flags.substr(at, flags.find(',', at) - at);
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
    const std::string name = kv.first.IsScalar() ? kv.first.as<std::string>() : "?";
    const std::string key = normalise_key(name);
    if (key == "config")
      throw Error(fmt::format("config file '{}' cannot name another config", path));
    auto it = std::find_if(opts.begin(), opts.end(), [&](const Option& o) { return o.key == key; });
    if (it == opts.end())
      throw Error(
          fmt::format("config file '{}': unknown key '{}' (keys are the flag names of "
                      "'vitrain train --help', e.g. batch_size or batch-size)",
                      path, name));
    const YAML::Node& v = kv.second;
    try {
      std::visit(
          [&](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::string>) {
              if (v.IsNull()) {  // `experiment:` or `experiment: null` (timm's None)
                p->clear();
                return;
              }
            }
            if (!v.IsScalar()) throw YAML::BadConversion(v.Mark());
            *p = v.as<T>();
          },
          it->target);
    } catch (const YAML::Exception&) {
      const char* kind = std::visit(
          [](auto* p) -> const char* {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::string>)
              return "a string";
            else if constexpr (std::is_same_v<T, bool>)
              return "true or false";
            else if constexpr (std::is_same_v<T, double>)
              return "a number";
            else
              return "an integer";
          },
          it->target);
      throw Error(fmt::format("config file '{}': '{}' must be {}", path, name, kind));
    }
  }
}

void validate(const TrainArgs& a) {
  VIT_CHECK(a.batch_size > 0, "--batch-size must be positive");
  parse_kernel_options(a.kernels);  // one error line naming the bad key or value
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
  VIT_CHECK(a.hflip == -1 || (a.hflip >= 0 && a.hflip <= 1),
            "--hflip must be in [0, 1] (or -1: 0.5 for image folders, 0 for in-memory data)");
  validate_augment_args(a);
  VIT_CHECK(a.img_size >= 0 && a.num_classes >= 0, "--img-size and --num-classes must be >= 0");
  VIT_CHECK(a.curriculum == "none" || a.curriculum == "size" || a.curriculum == "efficienttrain",
            fmt::format("--curriculum {}: must be none, size or efficienttrain", a.curriculum));
  VIT_CHECK(a.lowfreq == "fft" || a.lowfreq == "downsample",
            fmt::format("--lowfreq {}: must be fft or downsample", a.lowfreq));
  VIT_CHECK(a.et_warmup >= 0 && a.et_warmup < 1, "--et-warmup must be in [0, 1)");
  VIT_CHECK(is_named_et_table(a.et_table) || a.et_table.find(',') != std::string::npos,
            fmt::format("--et-table {}: use deit, swin, convnext or ten comma-separated sizes",
                        a.et_table));
  VIT_CHECK(a.init_size >= 0 && a.size_step >= 0 && a.eval_size >= 0,
            "--init-size, --size-step and --eval-size must be >= 0");
  VIT_CHECK(a.size_every > 0, "--size-every must be positive");
  VIT_CHECK(a.replay >= 1, "--replay must be >= 1");
  VIT_CHECK(a.aug_repeats >= 1, "--aug-repeats must be >= 1");
  if (!a.budget.empty()) (void)parse_duration_seconds(a.budget);  // throws a one-line error
  VIT_CHECK(a.log_interval > 0 && a.eval_interval > 0,
            "--log-interval and --eval-interval must be positive");
  VIT_CHECK(a.patience >= 0 && a.workers >= 0, "--patience and --workers must be >= 0");
  VIT_CHECK(a.max_bad_steps >= 1, "--max-bad-steps must be >= 1");
  VIT_CHECK(a.model_ema_decay >= 0 && a.model_ema_decay < 1, "--model-ema-decay must be in [0, 1)");
  VIT_CHECK(a.device == "auto" || a.device == "cpu" || a.device == "cuda" || a.device == "emu",
            fmt::format("--device {}: use auto, cpu, cuda or emu", a.device));
  VIT_CHECK(a.precision == "bf16" || a.precision == "fp32",
            fmt::format("--precision {}: use bf16 or fp32", a.precision));
  VIT_CHECK(a.gp.empty() || a.gp == "token" || a.gp == "avg",
            fmt::format("--gp {}: use token or avg", a.gp));
  VIT_CHECK(a.ffn.empty() || a.ffn == "mlp" || a.ffn == "mlp_tanh" || a.ffn == "local",
            fmt::format("--ffn {}: use mlp, mlp_tanh or local", a.ffn));
  VIT_CHECK(a.stem.empty() || a.stem == "patch" || a.stem == "conv",
            fmt::format("--stem {}: use patch or conv", a.stem));
  VIT_CHECK(a.stop_after_updates >= 0, "--stop-after-updates must be >= 0");
  // Every number finite: no option means anything by inf or nan, and args.yaml would not read
  // them back (fuzz_config found `dist_timeout: .Inf` accepted, then refused on reading back).
  // Text: bytes that are not UTF-8 would be replaced or re-decoded on writing args.yaml, so the
  // dump would not reproduce the run (also found by fuzz_config).
  TrainArgs copy = a;  // options() binds non-const pointers
  for (const Option& o : options(copy)) {
    if (const auto* d = std::get_if<double*>(&o.target))
      VIT_CHECK(std::isfinite(**d),
                fmt::format("{}: must be a finite number (not inf or nan)", long_flag(o.flags)));
    if (const auto* p = std::get_if<std::string*>(&o.target))
      VIT_CHECK(valid_utf8(**p),
                fmt::format("{}: not valid UTF-8 text (args.yaml is UTF-8)", long_flag(o.flags)));
  }
}

// A CLI11 app with every option of `opts`, plus -c/--config bound to `config`.
std::unique_ptr<CLI::App> make_app(std::vector<Option>& opts, std::string& config) {
  auto app = std::make_unique<CLI::App>(
      "Train a Vision Transformer. Flags follow timm's train.py; -c FILE.yaml sets defaults "
      "(keys as the flag names) that flags override.",
      "vitrain train");
  // A repeated flag takes its last value, as argparse does (lets scripts append overrides).
  app->option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  for (auto& o : opts)
    std::visit(
        [&](auto* p) {
          // A switch, as timm's store_true; `--model-ema=false` overrides a config's true.
          if constexpr (std::is_same_v<decltype(p), bool*>)
            app->add_flag(o.flags, *p, o.help);
          else
            app->add_option(o.flags, *p, o.help);
        },
        o.target);
  app->add_option("-c,--config", config, "YAML file of defaults (keys as the flags)");
  return app;
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

TrainArgs parse_train_args(int argc, const char* const* argv) {
  // Pass 1 only finds -c/--config, in any spelling CLI11 accepts (-c F, -cF, --config=F).
  std::string config;
  {
    TrainArgs scratch;
    std::vector<Option> opts = options(scratch);
    auto app = make_app(opts, config);
    try {
      app->parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      // pass 2 prints the help, showing the config file's values as the defaults
    } catch (const CLI::CallForAllHelp&) {
    } catch (const CLI::ParseError& e) {
      throw Error(fmt::format("train: {}", one_line(e.what())));
    }
  }
  // Pass 2: the config file sets the defaults, then the flags given override them.
  TrainArgs a;
  std::vector<Option> opts = options(a);
  a.config = config;
  if (!a.config.empty()) apply_yaml(a.config, opts);
  auto app = make_app(opts, a.config);
  try {
    app->parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested(app->help());
  } catch (const CLI::CallForAllHelp&) {
    throw HelpRequested(app->help());
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("train: {}", one_line(e.what())));
  }
  validate(a);
  return a;
}

TrainArgs parse_train_config(const std::string& path) {
  TrainArgs a;
  std::vector<Option> opts = options(a);
  a.config = path;
  apply_yaml(path, opts);
  validate(a);
  return a;
}

namespace {
// The shortest text that reads back as the same double, spelled so that YAML 1.1 readers
// (PyYAML) also see a float: "1.0e-05", not "1e-05".
std::string yaml_number(double v) {
  std::string s = fmt::format("{}", v);
  const size_t e = s.find('e');
  if (e != std::string::npos && s.find('.') == std::string::npos) s.insert(e, ".0");
  return s;
}
}  // namespace

std::string to_yaml(const TrainArgs& in) {
  TrainArgs a = in;
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& o : options(a)) {
    // Not part of the recipe: which run to continue, and a testing stop. (-c/--config is not
    // an entry of the table, so the dump never names another config.)
    if (o.key == "resume" || o.key == "stop_after_updates") continue;
    out << YAML::Key << o.key << YAML::Value;
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, double>)
            out << yaml_number(*p);
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
