#include "train/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "io/safetensors.h"

namespace vit {

namespace {
constexpr const char* kConfigKey = "vitrain_model";
constexpr const char* kExpAvg = "optimizer.exp_avg";
constexpr const char* kExpAvgSq = "optimizer.exp_avg_sq";
constexpr const char* kModelEma = "model_ema";  // the EMA weights, table layout (with --model-ema)

io::SafeTensors weights_tensors(const ModelConfig& cfg, const ParamTable& table,
                                const float* params, const Metadata& extra) {
  io::SafeTensors st;
  st.metadata = extra;
  st.metadata["format"] = "pt";
  st.metadata[kConfigKey] = model_config_to_json(cfg);
  st.metadata["producer"] = "vitrain";
  for (const auto& s : table.specs) st.add_f32(s.name, s.shape, params + s.offset);
  return st;
}

int64_t meta_int(const Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end())
    throw Error(fmt::format("'{}' is not a vitrain training state (no '{}')", path, key));
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw Error(fmt::format("'{}': metadata '{}' is not an integer", path, key));
  }
}

double meta_double(const Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end())
    throw Error(fmt::format("'{}' is not a vitrain training state (no '{}')", path, key));
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    throw Error(fmt::format("'{}': metadata '{}' is not a number", path, key));
  }
}

WeightsFile weights_from(const io::SafeTensors& st, const std::string& path,
                         const std::set<std::string>& allowed_extra) {
  auto it = st.metadata.find(kConfigKey);
  if (it == st.metadata.end())
    throw Error(
        fmt::format("'{}' has no vitrain model description (metadata '{}'); for a plain "
                    "timm weights file use --initial-checkpoint",
                    path, kConfigKey));
  WeightsFile w;
  w.cfg = model_config_from_json(it->second);
  w.metadata = st.metadata;
  const ParamTable table = build_param_table(w.cfg);
  w.params.assign(table.total, 0.0f);
  std::set<std::string> seen;
  for (const auto& s : table.specs) {
    const io::Tensor* t = st.find(s.name);
    if (!t) throw Error(fmt::format("'{}' lacks parameter '{}'", path, s.name));
    if (t->shape != s.shape)
      throw Error(fmt::format("'{}': parameter '{}' has shape {} but the model needs {}", path,
                              s.name, fmt::join(t->shape, "x"), fmt::join(s.shape, "x")));
    const std::vector<float> v = t->to_f32();
    std::copy(v.begin(), v.end(), w.params.begin() + s.offset);
    seen.insert(s.name);
  }
  for (const auto& t : st.tensors)
    if (!seen.count(t.name) && !allowed_extra.count(t.name))
      throw Error(fmt::format("'{}' has unexpected tensor '{}' for this model", path, t.name));
  return w;
}
}  // namespace

std::string model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"name", c.name},
                      {"img_size", c.img_size},
                      {"patch_size", c.patch_size},
                      {"in_chans", c.in_chans},
                      {"embed_dim", c.embed_dim},
                      {"depth", c.depth},
                      {"num_heads", c.num_heads},
                      {"mlp_ratio", c.mlp_ratio},
                      {"num_classes", c.num_classes},
                      {"classifier", to_string(c.classifier)},
                      {"qkv_bias", c.qkv_bias},
                      {"ffn", to_string(c.ffn)},
                      {"stem", to_string(c.stem)},
                      {"drop_path", c.drop_path},
                      {"layer_scale_init", c.layer_scale_init}};
  return j.dump();
}

ModelConfig model_config_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    ModelConfig c;
    c.name = j.at("name").get<std::string>();
    c.img_size = j.at("img_size").get<int>();
    c.patch_size = j.at("patch_size").get<int>();
    c.in_chans = j.at("in_chans").get<int>();
    c.embed_dim = j.at("embed_dim").get<int>();
    c.depth = j.at("depth").get<int>();
    c.num_heads = j.at("num_heads").get<int>();
    c.mlp_ratio = j.at("mlp_ratio").get<double>();
    c.num_classes = j.at("num_classes").get<int>();
    c.classifier = classifier_from_string(j.at("classifier").get<std::string>());
    c.qkv_bias = j.at("qkv_bias").get<bool>();
    c.ffn = ffn_from_string(j.at("ffn").get<std::string>());
    c.stem = stem_from_string(j.value("stem", "patch"));  // files before the conv stem: patch
    c.drop_path = j.value("drop_path", 0.0);
    c.layer_scale_init = j.value("layer_scale_init", 0.0);
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("invalid model description: {}", e.what()));
  }
}

void save_weights(const std::string& path, const ModelConfig& cfg, const ParamTable& table,
                  const float* params, const Metadata& extra) {
  io::write_safetensors(path, weights_tensors(cfg, table, params, extra));
}

WeightsFile load_weights(const std::string& path) {
  return weights_from(io::read_safetensors(path), path, {kExpAvg, kExpAvgSq, kModelEma});
}

void save_train_state(const std::string& path, const ModelConfig& cfg, const ParamTable& table,
                      const float* params, const TrainState& s) {
  Metadata meta = {{"step", std::to_string(s.step)},
                   {"epoch", std::to_string(s.epoch)},
                   {"update_in_epoch", std::to_string(s.update_in_epoch)},
                   {"best_metric", fmt::format("{:.17g}", s.best_metric)},
                   {"best_epoch", std::to_string(s.best_epoch)},
                   {"bad_epochs", std::to_string(s.bad_epochs)},
                   {"elapsed_s", fmt::format("{:.17g}", s.elapsed_s)},
                   {"compute_consumed", fmt::format("{:.17g}", s.compute_consumed)},
                   {"skipped_steps", std::to_string(s.skipped_steps)},
                   {"updates_since_eval", std::to_string(s.updates_since_eval)},
                   {"spent_budget_s", fmt::format("{:.17g}", s.spent_budget_s)},
                   {"args_yaml", s.args_yaml}};
  io::SafeTensors st = weights_tensors(cfg, table, params, meta);
  VIT_CHECK(Index(s.exp_avg.size()) == table.total && Index(s.exp_avg_sq.size()) == table.total,
            "optimizer state does not match the model");
  st.add_f32(kExpAvg, {table.total}, s.exp_avg.data());
  st.add_f32(kExpAvgSq, {table.total}, s.exp_avg_sq.data());
  if (!s.ema.empty()) {
    VIT_CHECK(Index(s.ema.size()) == table.total, "EMA weights do not match the model");
    st.add_f32(kModelEma, {table.total}, s.ema.data());
  }
  io::write_safetensors(path, st);
}

TrainState load_train_state(const std::string& path) {
  const io::SafeTensors st = io::read_safetensors(path);
  TrainState s;
  s.weights = weights_from(st, path, {kExpAvg, kExpAvgSq, kModelEma});
  const Index total = Index(s.weights.params.size());
  for (auto [key, dst] : {std::pair{kExpAvg, &s.exp_avg}, std::pair{kExpAvgSq, &s.exp_avg_sq}}) {
    const io::Tensor* t = st.find(key);
    if (!t) throw Error(fmt::format("'{}' is not a training state (no '{}')", path, key));
    if (t->shape != std::vector<Index>{total})
      throw Error(fmt::format("'{}': '{}' does not match the model size", path, key));
    *dst = t->to_f32();
  }
  if (const io::Tensor* t = st.find(kModelEma)) {
    if (t->shape != std::vector<Index>{total})
      throw Error(fmt::format("'{}': '{}' does not match the model size", path, kModelEma));
    s.ema = t->to_f32();
  }
  const Metadata& m = s.weights.metadata;
  s.step = meta_int(m, "step", path);
  s.epoch = meta_int(m, "epoch", path);
  s.update_in_epoch = meta_int(m, "update_in_epoch", path);
  s.best_metric = meta_double(m, "best_metric", path);
  s.best_epoch = meta_int(m, "best_epoch", path);
  s.bad_epochs = meta_int(m, "bad_epochs", path);
  s.elapsed_s = meta_double(m, "elapsed_s", path);
  if (m.count("compute_consumed")) s.compute_consumed = meta_double(m, "compute_consumed", path);
  if (m.count("skipped_steps")) s.skipped_steps = meta_int(m, "skipped_steps", path);
  if (m.count("updates_since_eval")) s.updates_since_eval = meta_int(m, "updates_since_eval", path);
  if (m.count("spent_budget_s")) s.spent_budget_s = meta_double(m, "spent_budget_s", path);
  auto it = m.find("args_yaml");
  s.args_yaml = it == m.end() ? "" : it->second;
  VIT_CHECK(s.step >= 0 && s.epoch >= 0 && s.update_in_epoch >= 0 && s.skipped_steps >= 0 &&
                s.updates_since_eval >= -1 && std::isfinite(s.spent_budget_s) &&
                s.spent_budget_s >= 0,
            fmt::format("'{}': negative loop position in the training state", path));
  return s;
}

}  // namespace vit
