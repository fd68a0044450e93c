// --initial-checkpoint: start from the weights of a timm-layout safetensors file (fine-tuning).
// The position-embedding grid is resampled as timm does (bicubic, antialias) when the image
// size differs, the head is re-initialised when the class count differs, and anything else
// that does not fit is a vit::Error naming the key.
#pragma once
#include <cstdio>
#include <string>

#include "model/config.h"
#include "model/params.h"

namespace vit {

// Overwrites `params` (table layout, already initialised) with the file's weights; prints what
// was adapted to `log`.
void load_initial_checkpoint(const std::string& path, const ModelConfig& cfg,
                             const ParamTable& table, float* params, FILE* log);

}  // namespace vit
