#include "train/initial_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <set>

#include "io/safetensors.h"
#include "model/resample.h"

namespace vit {

void load_initial_checkpoint(const std::string& path, const ModelConfig& cfg,
                             const ParamTable& table, float* params, FILE* log) {
  const io::SafeTensors st = io::read_safetensors(path);
  const bool file_has_cls = st.find("cls_token") != nullptr;
  if (file_has_cls != (cfg.num_prefix() == 1))
    throw Error(
        fmt::format("--initial-checkpoint '{}': the file's classifier ({}) differs from "
                    "the model's ({}); pass --gp {}",
                    path, file_has_cls ? "class token" : "no class token",
                    to_string(cfg.classifier), file_has_cls ? "token" : "avg"));
  const bool head_differs = [&] {
    const io::Tensor* h = st.find("head.weight");
    return h && !h->shape.empty() && h->shape[0] != cfg.num_classes;
  }();
  std::set<std::string> used;
  for (const auto& s : table.specs) {
    const bool is_head = s.name == "head.weight" || s.name == "head.bias";
    const io::Tensor* t = st.find(s.name);
    if (is_head && head_differs) {
      used.insert(s.name);
      continue;  // keep the fresh initialisation
    }
    if (!t)
      throw Error(fmt::format("--initial-checkpoint '{}' lacks parameter '{}' of model {}", path,
                              s.name, cfg.name));
    used.insert(s.name);
    const std::vector<float> v = t->to_f32();
    if (t->shape == s.shape) {
      std::copy(v.begin(), v.end(), params + s.offset);
      continue;
    }
    if (s.name == "pos_embed" && t->shape.size() == 3 && t->shape[0] == 1 &&
        t->shape[2] == s.shape[2]) {
      const Index prefix = cfg.num_prefix(), C = s.shape[2];
      const Index grid_tokens = t->shape[1] - prefix;
      const Index g_old = Index(std::lround(std::sqrt(double(std::max<Index>(grid_tokens, 0)))));
      if (grid_tokens > 0 && g_old * g_old == grid_tokens) {
        resample_pos_embed(v.data(), g_old, params + s.offset, cfg.grid(), prefix, C,
                           Interp::Bicubic, true);
        if (log)
          fmt::print(log, "Resampled pos_embed from a {}x{} to a {}x{} grid\n", g_old, g_old,
                     cfg.grid(), cfg.grid());
        continue;
      }
    }
    throw Error(
        fmt::format("--initial-checkpoint '{}': parameter '{}' has shape [{}] but the "
                    "model needs [{}]",
                    path, s.name, fmt::join(t->shape, ", "), fmt::join(s.shape, ", ")));
  }
  for (const auto& t : st.tensors)
    if (!used.count(t.name) && t.name.rfind("optimizer.", 0) != 0)
      throw Error(
          fmt::format("--initial-checkpoint '{}' has tensor '{}' that model {} does not "
                      "have",
                      path, t.name, cfg.name));
  if (head_differs && log)
    fmt::print(log, "Re-initialised the head for {} classes\n", cfg.num_classes);
}

}  // namespace vit
