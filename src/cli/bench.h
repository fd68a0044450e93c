#pragma once
namespace vit {
int run_bench(int argc, char** argv);  // argv[0] is the subcommand name
}
