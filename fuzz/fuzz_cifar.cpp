// libFuzzer target: the CIFAR-10 / CIFAR-100 binary batch reader (data/cifar.h), through its
// public entry point load_cifar(dir). The reader takes a directory, so one is made at start-up
// holding symlinks to two in-memory files (the batch and the class-name file); no file is
// written per input.
//
// Input layout: byte 0 bit 0 picks CIFAR-10 (0) or CIFAR-100 (1); bytes 1-2 (little-endian) are
// the length of the class-name text that follows; the rest is the batch file (test_batch.bin or
// test.bin).
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "data/cifar.h"
#include "fuzz_util.h"

namespace {

namespace fs = std::filesystem;

struct CifarDirs {
  vit::fuzz::MemFile batch{"cifar_batch"}, names{"cifar_names"};
  fs::path root;
  CifarDirs() {
    char tmpl[] = "/tmp/vit_fuzz_cifar_XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    root = tmpl;
    fs::create_directories(root / "c10");
    fs::create_directories(root / "c100");
    fs::create_symlink(batch.path(), root / "c10" / "test_batch.bin");
    fs::create_symlink(names.path(), root / "c10" / "batches.meta.txt");
    fs::create_symlink(batch.path(), root / "c100" / "test.bin");
    fs::create_symlink(names.path(), root / "c100" / "fine_label_names.txt");
  }
  ~CifarDirs() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static CifarDirs dirs;
  if (size < 3) return 0;
  const bool cifar100 = data[0] & 1;
  const size_t names_len = std::min<size_t>(data[1] | (data[2] << 8), size - 3);
  dirs.names.set(data + 3, names_len);
  dirs.batch.set(data + 3 + names_len, size - 3 - names_len);
  return vit::fuzz::expect_value_or_error([&] {
    (void)vit::data::load_cifar((dirs.root / (cifar100 ? "c100" : "c10")).string(), false);
  });
}
