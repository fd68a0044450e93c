// `vitrain eval` (top-1/top-5/loss of a checkpoint, optional logits as .npy) and
// `vitrain export` (a folder timm's create_model('local-dir:DIR', pretrained=True) loads).
#include "cli/eval_export.h"

#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/image_folder.h"
#include "data/source.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "ops/kernel_options.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/evaluate.h"

namespace vit {

namespace fs = std::filesystem;

namespace {

// Parses argv with CLI11, turning its errors into vit::Error; returns false after --help.
bool parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return true;
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return false;
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("{}: {}", app.get_name(), e.what()));
  }
}

std::vector<float> floats_from_meta(const Metadata& m, const std::string& key, size_t n,
                                    float fallback) {
  auto it = m.find(key);
  if (it == m.end()) return std::vector<float>(n, fallback);
  try {
    const auto v = nlohmann::json::parse(it->second).get<std::vector<float>>();
    if (v.size() == n) return v;
  } catch (const nlohmann::json::exception&) {
  }
  throw Error(fmt::format("checkpoint metadata '{}' is malformed", key));
}

std::vector<std::string> label_names_from_meta(const Metadata& m, int K) {
  auto it = m.find("label_names");
  if (it != m.end()) {
    try {
      auto v = nlohmann::json::parse(it->second).get<std::vector<std::string>>();
      if (int(v.size()) == K) return v;
    } catch (const nlohmann::json::exception&) {
    }
  }
  std::vector<std::string> names;
  for (int k = 0; k < K; ++k) names.push_back(fmt::format("class{}", k));
  return names;
}

}  // namespace

int run_eval(int argc, char** argv) {
  CLI::App app{"Evaluate a checkpoint: top-1, top-5 and loss on a data set", "eval"};
  std::string checkpoint, data_dir = "/usr/share/datasets/fashion-mnist", logits_path,
                          split = "val";
  std::string class_map, device = "auto", precision = "bf16", kernels;
  int batch = 256, workers = 0;
  double crop_pct = 0.0;
  bool fp32_residual = false;
  app.add_option("--checkpoint", checkpoint, "weights file (last/model_best.safetensors)")
      ->required();
  app.add_option("--data-dir", data_dir, "data directory");
  app.add_option("--split", split, "val or train")->check(CLI::IsMember({"val", "train"}));
  app.add_option("-b,--batch-size", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--save-logits", logits_path, "write float32 logits (N, K) as .npy");
  app.add_option("-j,--workers", workers, "threads (0 = all cores)");
  app.add_option("--class-map", class_map,
                 "ImageFolder class order, one name per line (default: the checkpoint's "
                 "label_names)");
  app.add_option("--crop-pct", crop_pct,
                 "resize to size/crop_pct + centre crop (0 = plain resize; ImageFolder and "
                 "packed data: 0.875)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--device", device, "auto, cpu, cuda or emu (CPU bf16 emulation)");
  app.add_option("--precision", precision, "cuda: bf16 or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_flag("--fp32-residual", fp32_residual,
               "bf16 modes: the residual stream in fp32 (as the run trained with it)");
  app.add_option("--kernels", kernels,
                 "kernel options k=v,... (as the run trained with them: its args.yaml):\n" +
                     kernel_options_help());
  if (!parse_cli(app, argc, argv)) return 0;
  if (workers > 0) omp_set_num_threads(workers);

  EngineOptions eo;
  eo.device = resolve_device(device);
  eo.precision = precision;
  eo.fp32_residual = fp32_residual;
  eo.kernels = parse_kernel_options(kernels);
  const WeightsFile w = load_weights(checkpoint);
  // ImageFolder class indices must be the training run's: its label_names pin the order.
  std::vector<std::string> classes;
  if (!class_map.empty())
    classes = data::read_class_map(class_map);
  else if (auto it = w.metadata.find("label_names"); it != w.metadata.end())
    classes = nlohmann::json::parse(it->second).get<std::vector<std::string>>();
  const data::DataSplits d = data::load_data_dir(data_dir, classes);
  const data::Source& ds = split == "val" ? *d.val : *d.train;
  VIT_CHECK(ds.channels() == w.cfg.in_chans,
            fmt::format("the checkpoint expects {} input channels, the data has {}", w.cfg.in_chans,
                        ds.channels()));
  VIT_CHECK(ds.num_classes() <= w.cfg.num_classes,
            fmt::format("the data has {} classes, the checkpoint's head only {}", ds.num_classes(),
                        w.cfg.num_classes));
  eo.cfg = w.cfg;
  eo.max_batch = batch;
  std::unique_ptr<Engine> model = make_engine(eo);
  model->write_params(w.params);
  data::BatchConfig bc;
  bc.img_size = w.cfg.img_size;
  bc.mean = floats_from_meta(w.metadata, "mean", ds.channels(), 0.0f);
  bc.std = floats_from_meta(w.metadata, "std", ds.channels(), 1.0f);
  bc.eval_crop_pct = d.streamed() && crop_pct <= 0 ? 0.875 : crop_pct;
  std::vector<float> logits;
  const EvalResult r =
      evaluate(*model, ds, bc, batch, logits_path.empty() ? nullptr : &logits, workers);
  fmt::print("Eval {} on {} ({} images) with {}: top-1 {:.2f}%  top-5 {:.2f}%  loss {:.4f}\n",
             checkpoint, data_dir, r.n, model->description(), r.top1, r.top5, r.loss);
  if (d.streamed()) fmt::print("Skipped {} unreadable images\n", ds.unreadable_count());
  if (!logits_path.empty()) {
    io::write_npy_f32(logits_path, logits.data(), {r.n, Index(w.cfg.num_classes)});
    fmt::print("Wrote logits ({} x {}) to {}\n", r.n, w.cfg.num_classes, logits_path);
  }
  return 0;
}

int run_export(int argc, char** argv) {
  CLI::App app{"Export a checkpoint as a folder timm loads (model.safetensors + config.json)",
               "export"};
  std::string checkpoint, out;
  app.add_option("--checkpoint", checkpoint, "weights file")->required();
  app.add_option("--out", out, "output folder")->required();
  if (!parse_cli(app, argc, argv)) return 0;

  const WeightsFile w = load_weights(checkpoint);
  const ModelConfig& c = w.cfg;
  std::error_code ec;
  fs::create_directories(out, ec);
  VIT_CHECK(!ec, fmt::format("cannot create '{}': {}", out, ec.message()));

  // Weights: exactly the timm state_dict, nothing else.
  const io::SafeTensors src = io::read_safetensors(checkpoint);
  io::SafeTensors dst;
  dst.metadata = {{"format", "pt"},
                  {"producer", "vitrain"},
                  {"vitrain_model", src.metadata.at("vitrain_model")}};
  const ParamTable table = build_param_table(c);
  for (const auto& s : table.specs) dst.add(src.at(s.name));
  io::write_safetensors(out + "/model.safetensors", dst);

  const bool token = c.classifier == Classifier::Token;
  const std::vector<float> mean = floats_from_meta(w.metadata, "mean", c.in_chans, 0.5f);
  const std::vector<float> std = floats_from_meta(w.metadata, "std", c.in_chans, 0.5f);
  nlohmann::json model_args = {{"img_size", c.img_size},
                               {"patch_size", c.patch_size},
                               {"in_chans", c.in_chans},
                               {"embed_dim", c.embed_dim},
                               {"depth", c.depth},
                               {"num_heads", c.num_heads},
                               {"mlp_ratio", c.mlp_ratio},
                               {"qkv_bias", c.qkv_bias},
                               {"global_pool", token ? "token" : "avg"},
                               {"class_token", token}};
  if (c.layer_scale_init > 0) model_args["init_values"] = c.layer_scale_init;
  // Any timm vit_* entry point accepts these overrides; the locality FFN and the conv stem have
  // no timm counterpart (docs/export.md documents their keys).
  const bool timm_loads = c.ffn != Ffn::Local && c.stem == Stem::Patch;
  if (c.ffn == Ffn::MlpTanh) model_args["act_layer"] = "gelu_tanh";  // timm's name for it
  const char* arch = timm_loads             ? "vit_tiny_patch16_224"
                     : c.stem == Stem::Conv ? "vitrain_vit_conv_stem"
                                            : "vitrain_vit_local_ffn";
  // A vitrain architecture names one of its two departures; both are spelled out (timm never
  // builds these, so the extra model_args cannot reach a timm constructor).
  if (!timm_loads) {
    model_args["ffn"] = to_string(c.ffn);
    model_args["stem"] = to_string(c.stem);
  }
  nlohmann::json cfg = {
      {"architecture", arch},
      {"num_classes", c.num_classes},
      {"num_features", c.embed_dim},
      {"global_pool", token ? "token" : "avg"},
      {"label_names", label_names_from_meta(w.metadata, c.num_classes)},
      {"model_args", model_args},
      {"pretrained_cfg",
       {{"tag", "vitrain"},
        {"input_size", {c.in_chans, c.img_size, c.img_size}},
        {"interpolation", "bilinear"},
        {"crop_pct", 1.0},
        {"crop_mode", "center"},
        {"mean", mean},
        {"std", std},
        {"num_classes", c.num_classes},
        {"first_conv", c.stem == Stem::Conv ? "patch_embed.stem.0.conv" : "patch_embed.proj"},
        {"classifier", "head"}}}};
  io::write_file_atomic(out + "/config.json", cfg.dump(2) + "\n");
  fmt::print("Exported {} to {} (model.safetensors, config.json){}\n", checkpoint, out,
             timm_loads ? "" : "; locality-FFN and conv-stem models load in vitrain, not in timm");
  return 0;
}

}  // namespace vit
