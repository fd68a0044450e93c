#include "train/resize_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "model/resample.h"

namespace vit {

void map_buffer(const ModelConfig& from_cfg, const ParamTable& from, const float* src,
                const ModelConfig& to_cfg, const ParamTable& to, float* dst,
                bool clamp_nonnegative) {
  for (const ParamSpec& d : to.specs) {
    const ParamSpec& s = from.at(d.name);
    if (d.name == "pos_embed") {
      const Index C = d.shape.back();
      resample_pos_embed(src + s.offset, from_cfg.grid(), dst + d.offset, to_cfg.grid(),
                         to_cfg.num_prefix(), C, Interp::Bicubic, false);
      if (clamp_nonnegative)
        for (Index i = 0; i < d.numel(); ++i) dst[d.offset + i] = std::max(dst[d.offset + i], 0.0f);
      continue;
    }
    VIT_CHECK(s.numel() == d.numel(),
              fmt::format("resize_model: '{}' has {} elements at size {} but {} at size {}", d.name,
                          s.numel(), from_cfg.img_size, d.numel(), to_cfg.img_size));
    std::memcpy(dst + d.offset, src + s.offset, sizeof(float) * size_t(d.numel()));
  }
}

ResizedBuffers resize_model(const ModelConfig& cfg, const ParamTable& table,
                            const std::vector<float>& params, const std::vector<float>& m,
                            const std::vector<float>& v, int new_size) {
  VIT_CHECK(new_size > 0 && new_size % cfg.patch_size == 0,
            fmt::format("resize_model: size {} is not a positive multiple of the patch size {}",
                        new_size, cfg.patch_size));
  VIT_CHECK(Index(params.size()) == table.total, "resize_model: params do not match the table");
  VIT_CHECK(m.size() == v.size() && (m.empty() || Index(m.size()) == table.total),
            "resize_model: AdamW moments do not match the table");
  ResizedBuffers r;
  r.cfg = cfg;
  r.cfg.img_size = new_size;
  r.table = build_param_table(r.cfg);
  r.params.resize(size_t(r.table.total));
  map_buffer(cfg, table, params.data(), r.cfg, r.table, r.params.data(), false);
  if (!m.empty()) {
    r.m.resize(size_t(r.table.total));
    r.v.resize(size_t(r.table.total));
    map_buffer(cfg, table, m.data(), r.cfg, r.table, r.m.data(), false);
    map_buffer(cfg, table, v.data(), r.cfg, r.table, r.v.data(), true);
  }
  return r;
}

}  // namespace vit
