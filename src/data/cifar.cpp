#include "data/cifar.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "core/common.h"

namespace vit::data {

namespace fs = std::filesystem;

namespace {

constexpr Index kPixels = 3 * 32 * 32;

bool has(const fs::path& dir, const char* name) {
  std::error_code ec;
  return fs::is_regular_file(dir / name, ec);
}

CifarKind kind_of(const fs::path& d) {
  if (has(d, "data_batch_1.bin") || has(d, "test_batch.bin")) return CifarKind::Cifar10;
  if (has(d, "train.bin") || has(d, "test.bin")) return CifarKind::Cifar100;
  return CifarKind::None;
}

// Appends the records of one file; label_bytes = 1 (CIFAR-10) or 2 (CIFAR-100, fine = 2nd).
void read_records(const std::string& path, int label_bytes, int num_classes, ImageDataset& d) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw Error(fmt::format("{}: cannot open CIFAR file", path));
  const std::streamoff size = f.tellg();
  const Index rec = label_bytes + kPixels;
  if (size <= 0 || size % rec != 0)
    throw Error(
        fmt::format("{}: size {} bytes is not a non-zero multiple of the {}-byte CIFAR-{} "
                    "record (truncated or wrong file?)",
                    path, size, rec, num_classes));
  const Index n = size / rec;
  std::vector<uint8_t> buf(static_cast<size_t>(size));
  f.seekg(0);
  if (!f.read(reinterpret_cast<char*>(buf.data()), size))
    throw Error(fmt::format("{}: read error", path));
  const size_t px0 = d.pixels.size();
  d.pixels.resize(px0 + size_t(n * kPixels));
  d.labels.reserve(size_t(d.n + n));
  for (Index i = 0; i < n; ++i) {
    const uint8_t* r = buf.data() + i * rec;
    const int label = r[label_bytes - 1];
    if (label >= num_classes)
      throw Error(fmt::format("{}: record {} has label {}, outside 0..{} (not a CIFAR-{} file?)",
                              path, i, label, num_classes - 1, num_classes));
    if (label_bytes == 2 && r[0] >= 20)
      throw Error(fmt::format("{}: record {} has coarse label {}, outside 0..19", path, i, r[0]));
    d.labels.push_back(label);
    std::copy(r + label_bytes, r + rec, d.pixels.begin() + px0 + size_t(i * kPixels));
  }
  d.n += n;
}

// One name per non-empty line; returns empty unless exactly `k` names are found.
std::vector<std::string> read_names(const fs::path& p, int k) {
  std::vector<std::string> names;
  std::ifstream f(p);
  std::string line;
  while (f && std::getline(f, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  if (int(names.size()) != k) return {};
  return names;
}

}  // namespace

CifarLayout detect_cifar(const std::string& dir) {
  for (const fs::path& d : {fs::path(dir), fs::path(dir) / "cifar-10-batches-bin",
                            fs::path(dir) / "cifar-100-binary"}) {
    const CifarKind k = kind_of(d);
    if (k != CifarKind::None) return {k, d.string()};
  }
  return {};
}

ImageDataset load_cifar(const std::string& dir, bool train) {
  const CifarLayout lay = detect_cifar(dir);
  if (lay.kind == CifarKind::None)
    throw Error(fmt::format(
        "{}: no CIFAR binary files (expected data_batch_1..5.bin + test_batch.bin for CIFAR-10, "
        "or train.bin + test.bin for CIFAR-100, here or in cifar-10-batches-bin/ or "
        "cifar-100-binary/)",
        dir));
  const fs::path d(lay.dir);
  ImageDataset ds;
  ds.channels = 3;
  ds.height = 32;
  ds.width = 32;
  if (lay.kind == CifarKind::Cifar10) {
    ds.num_classes = 10;
    std::vector<std::string> files;
    if (train)
      for (int i = 1; i <= 5; ++i) files.push_back(fmt::format("data_batch_{}.bin", i));
    else
      files.push_back("test_batch.bin");
    for (const std::string& f : files)
      if (!has(d, f.c_str()))
        throw Error(fmt::format("{}: missing CIFAR-10 file {}", d.string(), f));
    for (const std::string& f : files) read_records((d / f).string(), 1, 10, ds);
    ds.class_names = read_names(d / "batches.meta.txt", 10);
    if (ds.class_names.empty())
      ds.class_names = {"airplane", "automobile", "bird",  "cat",  "deer",
                        "dog",      "frog",       "horse", "ship", "truck"};
  } else {
    ds.num_classes = 100;
    const std::string f = train ? "train.bin" : "test.bin";
    if (!has(d, f.c_str()))
      throw Error(fmt::format("{}: missing CIFAR-100 file {}", d.string(), f));
    read_records((d / f).string(), 2, 100, ds);
    ds.class_names = read_names(d / "fine_label_names.txt", 100);
    if (ds.class_names.empty())
      for (int i = 0; i < 100; ++i) ds.class_names.push_back(std::to_string(i));
  }
  return ds;
}

}  // namespace vit::data
