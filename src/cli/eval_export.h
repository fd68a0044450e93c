#pragma once
namespace vit {
int run_eval(int argc, char** argv);    // `vitrain eval`; argv[0] is the subcommand name
int run_export(int argc, char** argv);  // `vitrain export`
}  // namespace vit
