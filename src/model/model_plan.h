// The kernel plan of a model (ops/kernel_plan.h): every op shape of a ViT at a batch and its
// image sizes, planned before the first pass, so the run folder's kernels.json lists them all.
#pragma once
#include <vector>

#include "model/config.h"
#include "ops/kernel_plan.h"

namespace vit {

// Whether attention runs fused (flash) for `cfg` at batch `batch`: `plan`'s choice, else the
// active plan's, else the rules' under default options.
bool plans_flash(KernelPlan* plan, const ModelConfig& cfg, Index batch, Storage storage);

// Plans every op of `cfg` at batch `batch` and each image size (the curriculum's sizes; the
// model's own when empty), with the keys the model's ops ask with.
void plan_model(KernelPlan& plan, const ModelConfig& cfg, Index batch,
                const std::vector<int>& sizes, Storage storage);

}  // namespace vit
