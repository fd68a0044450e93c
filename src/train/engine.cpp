#include "train/engine.h"

#include <fmt/format.h>

#include "train/engine_impl.h"

namespace vit {

namespace {
CudaEngineHooks g_cuda;  // set by register_cuda_engine in binaries that link the CUDA backend
}  // namespace

void register_cuda_engine(const CudaEngineHooks& hooks) {
  g_cuda = hooks;
}

bool cuda_engine_linked() {
  return g_cuda.make != nullptr;
}

std::string resolve_device(const std::string& device) {
  if (device == "cpu" || device == "emu") return device;
  VIT_CHECK(device == "cuda" || device == "auto",
            fmt::format("--device {}: use cpu, cuda or auto", device));
  std::string why;
  if (!cuda_engine_linked())
    why = "this build has no CUDA backend (no CUDA toolkit was found at build time)";
  else if (g_cuda.device_count(&why) > 0)
    return "cuda";
  if (device == "auto") return "cpu";
  throw Error(fmt::format("--device cuda: no usable GPU: {}; use --device cpu", why));
}

std::shared_ptr<Comm> make_run_comm(const std::string& device, double timeout_s) {
  if (device != "cuda") return make_comm();
  const LaunchEnv env = read_launch_env();
  if (env.size <= 1) return make_comm();
  VIT_CHECK(g_cuda.make_nccl_comm,
            fmt::format("launched by {} with {} ranks on the GPU, but this vitrain was built "
                        "without NCCL (it comes with the CUDA toolkit: rebuild where "
                        "/usr/local/cuda has nccl.h)",
                        launcher_name(env.launcher), env.size));
  // Under mpirun the NCCL world joins MPI itself, after it has chosen the device.
  return g_cuda.make_nccl_comm(env, nullptr, timeout_s);
}

std::string format_state_memory(const StateMemory& mem, bool on_gpu, int shards) {
  const double mib = 1024.0 * 1024.0;
  return fmt::format(
      "Training state per rank: {:.1f} MiB in {} memory (weights {:.1f}, gradients {:.1f}, AdamW "
      "moments {:.1f}{}{})",
      mem.total() / mib, on_gpu ? "device" : "host", mem.weights / mib, mem.grads / mib,
      mem.optimizer / mib, shards > 1 ? fmt::format(" (ZeRO-1: 1/{})", shards) : std::string(),
      mem.ema > 0 ? fmt::format(", EMA {:.1f}", mem.ema / mib) : std::string());
}

std::unique_ptr<Engine> make_engine(const EngineOptions& opt) {
  if (opt.device == "cpu") return std::make_unique<ModelEngine<CpuBackend<float>>>(opt);
  if (opt.device == "emu" && opt.fp32_residual)
    return std::make_unique<ModelEngine<EmuBackendFp32Residual>>(opt);
  if (opt.device == "emu") return std::make_unique<ModelEngine<EmuBackend>>(opt);
  VIT_CHECK(opt.device == "cuda", fmt::format("engine: unknown device '{}'", opt.device));
  resolve_device("cuda");  // throws with the reason when there is no GPU
  return g_cuda.make(opt);
}

}  // namespace vit
