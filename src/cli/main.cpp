// vitrain: train, evaluate, export and benchmark Vision Transformers.
#include <fmt/format.h>

#include <cstring>
#include <string>

#include "cli/bench.h"
#include "core/common.h"

namespace {
constexpr const char* kUsage =
    "usage: vitrain <command> [options]\n"
    "commands:\n"
    "  train    train a model (defaults: Fashion-MNIST, the default recipe)\n"
    "  eval     evaluate a checkpoint on a data set\n"
    "  export   write a timm-loadable folder (model.safetensors + config.json)\n"
    "  bench    training throughput on synthetic data\n"
    "run 'vitrain <command> --help' for the options of a command\n";
}

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  try {
    if (cmd == "bench") return vit::run_bench(argc - 1, argv + 1);
    if (cmd == "" || cmd == "-h" || cmd == "--help") {
      fmt::print("{}", kUsage);
      return cmd.empty() ? 2 : 0;
    }
    fmt::print(stderr, "error: unknown command '{}'\n{}", cmd, kUsage);
    return 2;
  } catch (const vit::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
