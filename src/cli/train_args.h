// Options of `vitrain train`: timm's flag names, a YAML config file that sets defaults (flags
// override it, as in timm), and the effective config dumped as args.yaml. Every option is
// declared once, in train_args.cpp's table, which drives the flags, the YAML keys and the dump.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "train/train_args.h"

namespace vit {

// Thrown by parse_train_args for --help; what() is the help text (print it, exit 0).
struct HelpRequested : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// argv[0] is the subcommand name (skipped). -c/--config FILE.yaml (any spelling: -c F, -cF,
// --config=F) is applied first as defaults, keys being flag names with '-' or '_'; the flags
// given then override it. Throws HelpRequested for -h/--help, and vit::Error (one line) for
// unknown flags, bad values, and unreadable or invalid config files (a typo'd key or a
// wrongly typed value is named, with the file).
TrainArgs parse_train_args(int argc, const char* const* argv);

// What `vitrain train -c PATH` (no other flags) returns: the defaults, then the config file's
// keys, validated; the same errors. Skips building the flag parser, which is ~80% of the cost of
// parse_train_args (the config fuzz target calls this).
TrainArgs parse_train_config(const std::string& path);

// The effective config as YAML (underscore keys), itself a valid --config file.
std::string to_yaml(const TrainArgs& a);

}  // namespace vit
