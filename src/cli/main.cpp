// vitrain: train, evaluate, export and benchmark Vision Transformers.
#include <fmt/format.h>
#include <malloc.h>  // mallopt (glibc), on every target

#if defined(__SSE3__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/bench.h"
#include "cli/bench_data.h"
#include "cli/eval_export.h"
#include "cli/launch_check.h"
#include "cli/prepare.h"
#include "cli/train_args.h"
#include "core/common.h"
#include "core/fatal_signal.h"
#include "core/omp_wait.h"
#include "dist/launch_env.h"
#include "train/trainer.h"
#ifdef VIT_HAS_CUDA
#include "train/engine_cuda.h"
#endif

namespace {
constexpr const char* kUsage =
    "usage: vitrain <command> [options]\n"
    "commands:\n"
    "  train    train a model (defaults: Fashion-MNIST, the default recipe)\n"
    "  eval     evaluate a checkpoint on a data set\n"
    "  export   write a timm-loadable folder (model.safetensors + config.json)\n"
    "  prepare  pack an ImageFolder into train.vitpack + val.vitpack for fast loading\n"
    "  bench    training throughput on synthetic data; bench-data: input-pipeline img/s\n"
    "  launch-check  whether the ranks of a mpirun / torchrun / srun job find each other\n"
    "run 'vitrain <command> --help' for the options of a command\n";

// The one error line, and exit status 1. A rank of a multi-process job ends at once: exit
// handlers and static destructors could wait on the other ranks (MPI_Finalize, NCCL), which wait
// in a collective for this one; its exit makes the launcher end them.
int report_error(const std::string& what) {
  const int rank = vit::rank_in_multi_rank_job();
  if (rank < 0) {
    fmt::print(stderr, "error: {}\n", what);
    return 1;
  }
  fmt::print(stderr, "error: rank {}: {}\n", rank, what);
  std::fflush(nullptr);
  std::_Exit(1);
}

// `vitrain train`: with --resume, the run's own args.yaml is the config and flags override it.
int run_train_command(int argc, char** argv) {
  vit::TrainArgs args;
  try {
    args = vit::parse_train_args(argc, argv);
    if (!args.resume.empty()) {
      VIT_CHECK(args.config.empty(), "use either --resume or -c/--config, not both");
      namespace fs = std::filesystem;
      VIT_CHECK(fs::exists(args.resume),
                fmt::format("--resume: '{}' does not exist (give a run folder or its state file)",
                            args.resume));
      const fs::path dir = fs::is_directory(args.resume) ? fs::path(args.resume)
                                                         : fs::path(args.resume).parent_path();
      const std::string cfg = (dir / "args.yaml").string();
      VIT_CHECK(fs::is_regular_file(cfg),
                fmt::format("--resume: '{}' is not a run folder (no args.yaml)", dir.string()));
      std::vector<const char*> av = {argv[0], "-c", cfg.c_str()};
      for (int i = 1; i < argc; ++i) av.push_back(argv[i]);
      args = vit::parse_train_args(int(av.size()), av.data());
    }
  } catch (const vit::HelpRequested& h) {
    fmt::print("{}", h.what());
    return 0;
  }
  return vit::run_train(args, vit::to_yaml(args));
}

}  // namespace

int main(int argc, char** argv) {
  vit::limit_openmp_spinning(argv);  // first: it may start the program again
  // Decoded images and batches are 0.1-10 MB buffers allocated per sample: served by mmap (glibc's
  // default above 128 KiB) each one costs fresh page faults, ~15% of the loader's time. Keep
  // them on the heap, where freed memory is reused.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  // Flush denormals to zero (inputs and results), before any worker thread exists so every
  // OpenMP thread inherits it: saturating activations (GELU tails, softmax) otherwise produce
  // denormals whose slow path made training several times slower as it progressed.
#if defined(__SSE3__)
  // MXCSR is per thread: set it in the master and, explicitly, in every OpenMP worker.
#pragma omp parallel
  {
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
  }
#endif
  vit::install_fatal_signal_handlers();  // SIGBUS on a truncated mapped file; EFBIG, not SIGXFSZ
  const std::string cmd = argc > 1 ? argv[1] : "";
#ifdef VIT_HAS_CUDA
  vit::register_cuda_backend();  // --device cuda/auto can find the GPU
#endif
  try {
    if (cmd == "train") return run_train_command(argc - 1, argv + 1);
    if (cmd == "eval") return vit::run_eval(argc - 1, argv + 1);
    if (cmd == "export") return vit::run_export(argc - 1, argv + 1);
    if (cmd == "bench") return vit::run_bench(argc - 1, argv + 1);
    if (cmd == "prepare") return vit::run_prepare(argc - 1, argv + 1);
    if (cmd == "bench-data") return vit::run_bench_data(argc - 1, argv + 1);
    if (cmd == "launch-check") return vit::run_launch_check(argc - 1, argv + 1);
    if (cmd == "" || cmd == "-h" || cmd == "--help") {
      fmt::print("{}", kUsage);
      return cmd.empty() ? 2 : 0;
    }
    fmt::print(stderr, "error: unknown command '{}'\n{}", cmd, kUsage);
    return 2;
  } catch (const vit::Error& e) {
    return report_error(e.what());
  } catch (const std::bad_alloc&) {
    return report_error("out of memory");
  } catch (const std::exception& e) {
    return report_error(e.what());
  }
}
