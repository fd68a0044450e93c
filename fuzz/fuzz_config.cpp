// libFuzzer target: the `-c FILE.yaml` config of `vitrain train` (cli/train_args.h): YAML
// parsing, key lookup, typed conversion and validation of the values. An accepted config must
// also round-trip through args.yaml (to_yaml), which is documented to be a valid config that
// reproduces the run: a difference aborts (reported as a crash).
#include <cstdio>
#include <cstdlib>

#include "cli/train_args.h"
#include "fuzz_util.h"

namespace {

vit::TrainArgs parse_config(const std::string& path) {
  const char* argv[] = {"train", "-c", path.c_str()};
  return vit::parse_train_args(3, argv);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static vit::fuzz::MemFile file("config"), dump("args");
  file.set(data, size);
  return vit::fuzz::expect_value_or_error([&] {
    const std::string yaml = vit::to_yaml(parse_config(file.path()));
    dump.set(reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size());
    const std::string again = vit::to_yaml(parse_config(dump.path()));
    if (again != yaml) {
      std::fprintf(stderr, "args.yaml does not round-trip:\n%s\n---- read back as:\n%s\n",
                   yaml.c_str(), again.c_str());
      std::abort();
    }
  });
}
