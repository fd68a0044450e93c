// The host instantiations of the model: CPU fp32 (training), fp64 (finite differences) and the
// CPU bf16 emulation (bf16 or fp32 residual stream). The CUDA ones are in vit_cuda.cpp (built with
// the CUDA backend only).
#include "model/vit_impl.h"

namespace vit {

template class VitModel<CpuBackend<float>>;
template class VitModel<CpuBackend<double>>;
template class VitModel<EmuBackend>;
template class VitModel<EmuBackendFp32Residual>;

}  // namespace vit
