// Registers the CUDA engine with make_engine / resolve_device (src/train/engine.h). Called by
// the binaries that link the CUDA backend (vitrain's main, the GPU tests).
#pragma once

namespace vit {
void register_cuda_backend();
}  // namespace vit
