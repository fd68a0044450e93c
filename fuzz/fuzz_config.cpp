// libFuzzer target: the `-c FILE.yaml` config of `vitrain train` (cli/train_args.h): YAML
// parsing, key lookup, typed conversion and validation of the values, through
// parse_train_config (what `train -c FILE` returns, without building the flag parser, which
// does not depend on the input and took ~80% of each execution). An accepted config must
// also round-trip through args.yaml (to_yaml), documented as a valid config that reproduces the
// run: a dump that is refused or reads back differently aborts (reported as a crash).
#include <cstdio>
#include <cstdlib>

#include "cli/train_args.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static vit::fuzz::MemFile file("config"), dump("args");
  file.set(data, size);
  std::string yaml;
  vit::fuzz::expect_value_or_error(
      [&] { yaml = vit::to_yaml(vit::parse_train_config(file.path())); });
  if (yaml.empty()) return 0;  // refused with a vit::Error: fine
  // Accepted: args.yaml must read back, to the same dump.
  dump.set(reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size());
  std::string again;
  try {
    again = vit::to_yaml(vit::parse_train_config(dump.path()));
  } catch (const vit::Error& e) {
    again = std::string("vit::Error: ") + e.what();
  }
  if (again != yaml) {
    std::fprintf(stderr, "args.yaml does not round-trip:\n%s\n---- read back as:\n%s\n",
                 yaml.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
