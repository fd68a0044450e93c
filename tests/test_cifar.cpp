// CIFAR-10/100 binary readers on files generated in the official layout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/common.h"
#include "data/cifar.h"
#include "data/dataset.h"
#include "data/source.h"
#include "temp_dir.h"

using namespace vit::data;
namespace fs = std::filesystem;

using vit::testing::TempDir;

namespace {

uint8_t pixel(int rec, int c, int y, int x) {
  return uint8_t(rec * 7 + c * 50 + y * 3 + x);
}

// n records starting at global record id `first`; label bytes computed from the id.
void write_file(const fs::path& p, int first, int n, int label_bytes, int classes) {
  std::ofstream f(p, std::ios::binary);
  for (int r = first; r < first + n; ++r) {
    if (label_bytes == 2) f.put(char(r % 20));
    f.put(char(r % classes));
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 32; ++x) f.put(char(pixel(r, c, y, x)));
  }
}

void check(const ImageDataset& d, int first, int n, int classes) {
  ASSERT_EQ(d.n, n);
  EXPECT_EQ(d.channels, 3);
  EXPECT_EQ(d.height, 32);
  EXPECT_EQ(d.width, 32);
  EXPECT_EQ(d.num_classes, classes);
  EXPECT_EQ(int(d.class_names.size()), classes);
  ASSERT_EQ(d.pixels.size(), size_t(n) * 3072);
  ASSERT_EQ(d.labels.size(), size_t(n));
  for (int i = 0; i < n; ++i) {
    const int r = first + i;
    ASSERT_EQ(d.labels[i], r % classes);
    for (int c = 0; c < 3; ++c)
      for (int y : {0, 13, 31})
        for (int x : {0, 7, 31})
          ASSERT_EQ(d.pixels[size_t(i) * 3072 + c * 1024 + y * 32 + x], pixel(r, c, y, x));
  }
}

void make_cifar10(const fs::path& d, int per_batch) {
  fs::create_directories(d);
  for (int b = 1; b <= 5; ++b)
    write_file(d / ("data_batch_" + std::to_string(b) + ".bin"), (b - 1) * per_batch, per_batch, 1,
               10);
  write_file(d / "test_batch.bin", 1000, 4, 1, 10);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const vit::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Cifar, Cifar10OfficialSubfolder) {
  TempDir t;
  const fs::path d = t.path / "cifar-10-batches-bin";
  make_cifar10(d, 3);
  std::ofstream(d / "batches.meta.txt") << "a0\na1\na2\na3\na4\na5\na6\na7\na8\na9\n\n";
  const CifarLayout lay = detect_cifar(t.path.string());
  EXPECT_EQ(lay.kind, CifarKind::Cifar10);
  EXPECT_EQ(lay.dir, d.string());
  const ImageDataset tr = load_cifar(t.path.string(), true);
  check(tr, 0, 15, 10);
  EXPECT_EQ(tr.class_names[3], "a3");
  const ImageDataset te = load_cifar(d.string(), false);  // the folder itself works too
  check(te, 1000, 4, 10);
}

TEST(Cifar, Cifar10DefaultNamesAndMissingBatch) {
  TempDir t;
  make_cifar10(t.path, 2);
  const ImageDataset te = load_cifar(t.path.string(), false);
  EXPECT_EQ(te.class_names[0], "airplane");
  EXPECT_EQ(te.class_names[9], "truck");
  fs::remove(t.path / "data_batch_4.bin");
  const std::string m = error_of([&] { load_cifar(t.path.string(), true); });
  EXPECT_NE(m.find("data_batch_4.bin"), std::string::npos) << m;
}

TEST(Cifar, Cifar100FineLabels) {
  TempDir t;
  const fs::path d = t.path / "cifar-100-binary";
  fs::create_directories(d);
  write_file(d / "train.bin", 0, 120, 2, 100);
  write_file(d / "test.bin", 500, 3, 2, 100);
  EXPECT_EQ(detect_cifar(t.path.string()).kind, CifarKind::Cifar100);
  const ImageDataset tr = load_cifar(t.path.string(), true);
  check(tr, 0, 120, 100);
  EXPECT_EQ(tr.class_names[42], "42");
  {
    std::ofstream names(d / "fine_label_names.txt");
    for (int i = 0; i < 100; ++i) names << "c" << i << "\n";
  }
  const ImageDataset te = load_cifar(t.path.string(), false);
  check(te, 500, 3, 100);
  EXPECT_EQ(te.class_names[99], "c99");
}

TEST(Cifar, BadSizesAndLabels) {
  TempDir t;
  make_cifar10(t.path, 2);
  // Truncated file: not a multiple of 3073.
  fs::resize_file(t.path / "test_batch.bin", 3073 * 2 + 100);
  std::string m = error_of([&] { load_cifar(t.path.string(), false); });
  EXPECT_NE(m.find("test_batch.bin"), std::string::npos) << m;
  EXPECT_NE(m.find("multiple"), std::string::npos) << m;
  // Empty file.
  fs::resize_file(t.path / "test_batch.bin", 0);
  EXPECT_THROW(load_cifar(t.path.string(), false), vit::Error);
  // Label out of range.
  write_file(t.path / "test_batch.bin", 0, 2, 1, 10);
  {
    std::fstream f(t.path / "test_batch.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3073);
    f.put(char(10));
  }
  m = error_of([&] { load_cifar(t.path.string(), false); });
  EXPECT_NE(m.find("label 10"), std::string::npos) << m;
  // CIFAR-100 fine label 100, and a CIFAR-10 file (3073-byte records) named train.bin.
  TempDir u;
  write_file(u.path / "train.bin", 0, 2, 2, 100);
  {
    std::fstream f(u.path / "train.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1);
    f.put(char(100));
  }
  EXPECT_THROW(load_cifar(u.path.string(), true), vit::Error);
  write_file(u.path / "train.bin", 0, 3, 1, 10);
  m = error_of([&] { load_cifar(u.path.string(), true); });
  EXPECT_NE(m.find("3074"), std::string::npos) << m;
  // Nothing there.
  TempDir v;
  EXPECT_EQ(detect_cifar(v.path.string()).kind, CifarKind::None);
  m = error_of([&] { load_cifar(v.path.string(), true); });
  EXPECT_NE(m.find(v.path.string()), std::string::npos) << m;
}

TEST(Cifar, LoadDataDirAcceptsCifar10) {
  TempDir t;
  const fs::path d = t.path / "cifar-10-batches-bin";
  make_cifar10(d, 2);
  for (const fs::path& p : {d, t.path}) {  // the batches folder or its parent
    const DataSplits s = load_data_dir(p.string());
    EXPECT_EQ(s.format, "cifar10");
    ASSERT_NE(s.train->memory(), nullptr);
    check(*s.train->memory(), 0, 10, 10);
    check(*s.val->memory(), 1000, 4, 10);
    ASSERT_EQ(s.mean.size(), 3u);
    ASSERT_EQ(s.std.size(), 3u);
  }
}
