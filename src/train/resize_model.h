// Changing the training image size mid-run (size curriculum, EfficientTrain++ stages): maps a
// model's parameters and its AdamW moments, laid out by the parameter table of one image size,
// to the table of another. Every tensor is copied by its timm name; pos_embed (and its moments)
// is resampled bicubic, align_corners=False, with the class-token row(s) unchanged
// (methods.md §1.4, §4). The resampled second moment is clamped at >= 0 (bicubic overshoot).
#pragma once
#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace vit {

struct ResizedBuffers {
  ModelConfig cfg;  // the old config with img_size = new size
  ParamTable table;
  std::vector<float> params, m, v;  // new table layout; m, v empty if the inputs were empty
};

// new_size must be a positive multiple of cfg.patch_size. m and v are either empty or
// table.total long. Throws vit::Error otherwise.
ResizedBuffers resize_model(const ModelConfig& cfg, const ParamTable& table,
                            const std::vector<float>& params, const std::vector<float>& m,
                            const std::vector<float>& v, int new_size);

// Maps one buffer (params or a moment) from `from` to `to` (same model but img_size).
void map_buffer(const ModelConfig& from_cfg, const ParamTable& from, const float* src,
                const ModelConfig& to_cfg, const ParamTable& to, float* dst,
                bool clamp_nonnegative);

}  // namespace vit
