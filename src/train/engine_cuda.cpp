// The CUDA instantiations of the model and the engine (fp32 and bf16 storage, the latter also
// with an fp32 residual stream), and their registration. Built only with the CUDA backend, by
// the host compiler.
#include "train/engine_cuda.h"

#include "backend/cuda.h"
#include "core/profile.h"
#include "dist/comm_nccl.h"
#include "model/vit_impl.h"
#include "train/engine_impl.h"

namespace vit {

template class VitModel<CudaBackend<float>>;
template class VitModel<CudaBackend<cuda::bf16>>;
template class VitModel<CudaBackend<cuda::bf16, float>>;

namespace {
std::unique_ptr<Engine> make_cuda_engine(const EngineOptions& opt) {
  if (Profile::enabled()) cuda::install_profile_timer();  // device times, not launch times
  // fp32: the stream is fp32 already (--fp32-residual has no effect).
  if (opt.precision == "fp32") return std::make_unique<ModelEngine<CudaBackend<float>>>(opt);
  VIT_CHECK(opt.precision == "bf16",
            fmt::format("--precision {}: use bf16 or fp32", opt.precision));
  if (opt.fp32_residual) return std::make_unique<ModelEngine<CudaBackend<cuda::bf16, float>>>(opt);
  return std::make_unique<ModelEngine<CudaBackend<cuda::bf16>>>(opt);
}
}  // namespace

void register_cuda_backend() {
  CudaEngineHooks hooks;
  hooks.device_count = [](std::string* why) { return cuda::device_count(why); };
  hooks.make = &make_cuda_engine;
#ifdef VIT_HAS_NCCL
  hooks.make_nccl_comm = &make_nccl_comm;
#endif
  register_cuda_engine(hooks);
}

}  // namespace vit
