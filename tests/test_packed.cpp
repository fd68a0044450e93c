// Packed image file: write from an ImageFolder, read back (raw and JPEG), corruption handling.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/common.h"
#include "data/decode.h"
#include "data/image_folder.h"
#include "data/packed.h"
#include "temp_dir.h"

using namespace vit::data;
namespace fs = std::filesystem;

using vit::testing::TempDir;

namespace {

Image gradient(int h, int w, int seed) {
  Image img(h, w, 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      img.at(y, x)[0] = uint8_t((x * 255) / std::max(1, w - 1));
      img.at(y, x)[1] = uint8_t((y * 255) / std::max(1, h - 1));
      img.at(y, x)[2] = uint8_t((seed * 40 + (x + y) / 2) & 255);
    }
  return img;
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

double mean_abs_diff(const Image& a, const Image& b) {
  EXPECT_EQ(a.px.size(), b.px.size());
  if (a.px.size() != b.px.size()) return 1e9;
  double s = 0;
  for (size_t i = 0; i < a.px.size(); ++i) s += std::abs(int(a.px[i]) - int(b.px[i]));
  return s / double(a.px.size());
}

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Folder with PNG + JPEG sources of several sizes; returns the sources in index order.
struct Fixture {
  TempDir dir;
  fs::path split;
  FolderIndex idx;
  std::vector<Image> sources;  // as decoded from the files (full size)
  Fixture() {
    split = dir.path / "train";
    write_bytes(split / "ant" / "a.png", encode_png(gradient(40, 100, 0)));      // wide
    write_bytes(split / "ant" / "b.JPG", encode_jpeg(gradient(90, 30, 1), 95));  // tall
    write_bytes(split / "bee" / "c.png", encode_png(gradient(20, 24, 2)));       // small
    write_bytes(split / "bee" / "d.jpeg", encode_jpeg(gradient(64, 64, 3), 95));
    idx = index_image_folder(split.string());
    for (const auto& f : idx.files) sources.push_back(decode_image_file(f));
  }
};

}  // namespace

TEST(Packed, RawRoundTrip) {
  Fixture fx;
  const std::string out = (fx.dir.path / "train.vpk").string();
  const PackStats st = write_packed(out, fx.idx, 50, /*jpeg=*/false, 90, 2);
  EXPECT_EQ(st.written, 4u);
  EXPECT_EQ(st.skipped, 0u);
  EXPECT_EQ(st.bytes, fs::file_size(out));
  for (const auto& e : fs::directory_iterator(fx.dir.path))  // no temp file left behind
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();

  PackedReader r(out);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r.classes(), (std::vector<std::string>{"ant", "bee"}));
  EXPECT_EQ(r.num_classes(), 2);
  EXPECT_FALSE(r.is_jpeg());
  EXPECT_EQ(r.max_side(), 50);
  EXPECT_EQ(r.labels(), (std::vector<int32_t>{0, 0, 1, 1}));
  const int want_hw[4][2] = {{20, 50}, {50, 17}, {20, 24}, {50, 50}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.label(i), fx.idx.labels[i]);
    Image img = r.decode(i);
    EXPECT_EQ(img.h, want_hw[i][0]) << i;
    EXPECT_EQ(img.w, want_hw[i][1]) << i;
    EXPECT_EQ(img.c, 3);
    // Raw storage is exact: equal to the same resize applied here.
    const Image ref = resize_max_side(fx.sources[i], 50);
    if (i == 2) {
      EXPECT_EQ(img.px, fx.sources[i].px);  // small enough: untouched
    }
    // Short sides below max_side: no DCT scaling, so raw storage equals the resize exactly.
    EXPECT_EQ(img.px, ref.px) << i;
  }
  EXPECT_THROW(r.decode(4), vit::Error);

  // Moving keeps the mapping valid.
  PackedReader moved = std::move(r);
  EXPECT_FALSE(r.is_open());
  EXPECT_EQ(moved.decode(2).px, fx.sources[2].px);
}

TEST(Packed, JpegRoundTripAndHint) {
  Fixture fx;
  const std::string out = (fx.dir.path / "train_jpg.vpk").string();
  const PackStats st = write_packed(out, fx.idx, 0, /*jpeg=*/true, 95, 0);  // keep sizes
  EXPECT_EQ(st.written, 4u);
  PackedReader r(out);
  EXPECT_TRUE(r.is_jpeg());
  for (size_t i = 0; i < 4; ++i) {
    Image img = r.decode(i);
    EXPECT_EQ(img.h, fx.sources[i].h);
    EXPECT_EQ(img.w, fx.sources[i].w);
    EXPECT_LT(mean_abs_diff(img, fx.sources[i]), 3.0) << i;
    EXPECT_EQ(r.entry(i).mode, 1);
  }
  // DCT-domain scaling through the reader: 64x64 with hint 32 -> 32x32.
  Image half = r.decode(3, 32);
  EXPECT_EQ(half.h, 32);
  EXPECT_EQ(half.w, 32);
  // The JPEG file is smaller than raw storage.
  const std::string raw = (fx.dir.path / "raw.vpk").string();
  write_packed(raw, fx.idx, 0, false, 95, 1);
  EXPECT_LT(fs::file_size(out), fs::file_size(raw));
}

TEST(Packed, CorruptSourcesAreSkippedAndCounted) {
  Fixture fx;
  auto jpg = encode_jpeg(gradient(30, 30, 5), 90);
  jpg.resize(jpg.size() / 2);
  write_bytes(fx.split / "ant" / "broken.jpg", jpg);
  write_bytes(fx.split / "bee" / "notimage.png", {'h', 'e', 'l', 'l', 'o'});
  const FolderIndex idx = index_image_folder(fx.split.string());
  ASSERT_EQ(idx.files.size(), 6u);
  const std::string out = (fx.dir.path / "skip.vpk").string();
  ::testing::internal::CaptureStderr();
  const PackStats st = write_packed(out, idx, 64, false, 90, 2);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(st.written, 4u);
  EXPECT_EQ(st.skipped, 2u);
  EXPECT_NE(err.find("broken.jpg"), std::string::npos) << err;
  EXPECT_NE(err.find("notimage.png"), std::string::npos) << err;
  EXPECT_NE(err.find("2 skipped"), std::string::npos) << err;
  PackedReader r(out);
  EXPECT_EQ(r.size(), 4u);
  EXPECT_EQ(r.labels(), (std::vector<int32_t>{0, 0, 1, 1}));  // labels stay aligned

  // Nothing decodable -> error, and no file (nor temp file) is created.
  FolderIndex bad;
  bad.classes = {"x"};
  bad.files = {(fx.split / "ant" / "broken.jpg").string()};
  bad.labels = {0};
  const std::string none = (fx.dir.path / "none.vpk").string();
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(write_packed(none, bad, 64, false, 90, 1), vit::Error);
  ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(none));
  for (const auto& e : fs::directory_iterator(fx.dir.path))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  // Bad arguments.
  EXPECT_THROW(write_packed(none, fx.idx, 64, true, 0, 1), vit::Error);
  FolderIndex badlabel = fx.idx;
  badlabel.labels[0] = 7;
  EXPECT_THROW(write_packed(none, badlabel, 64, false, 90, 1), vit::Error);
}

TEST(Packed, CorruptFilesAreErrors) {
  Fixture fx;
  const fs::path good = fx.dir.path / "good.vpk";
  write_packed(good.string(), fx.idx, 32, false, 90, 1);
  const std::vector<uint8_t> bytes = slurp(good);
  const fs::path bad = fx.dir.path / "bad.vpk";
  auto expect_error = [&](const std::vector<uint8_t>& b, const char* what) {
    write_bytes(bad, b);
    try {
      PackedReader r(bad.string());
      ADD_FAILURE() << "no error for " << what;
    } catch (const vit::Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
    }
  };
  // Truncations anywhere (header, names, blob, index) and appended bytes.
  for (size_t cut : {size_t(0), size_t(10), size_t(63), size_t(70), size_t(4096), size_t(5000),
                     bytes.size() - 24, bytes.size() - 1})
    expect_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + std::min(cut, bytes.size())),
                 "truncated");
  auto extra = bytes;
  extra.push_back(0);
  expect_error(extra, "trailing byte");
  auto patch = [&](size_t off, std::initializer_list<uint8_t> v) {
    auto b = bytes;
    std::copy(v.begin(), v.end(), b.begin() + off);
    return b;
  };
  expect_error(patch(0, {'X'}), "magic");
  expect_error(patch(8, {2}), "version");
  expect_error(patch(12, {7}), "format");
  expect_error(patch(16, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F}), "count");
  expect_error(patch(24, {0, 0, 0, 0}), "num_classes");
  // 2^24 classes in a tiny name section: refused before reserving 2^24 strings (~512 MB).
  {
    write_bytes(bad, patch(24, {0, 0, 0, 1}));
    try {
      PackedReader r(bad.string());
      ADD_FAILURE() << "no error for 2^24 classes";
    } catch (const vit::Error& e) {
      EXPECT_NE(std::string(e.what()).find("16777216 classes need at least"), std::string::npos)
          << e.what();
    }
  }
  expect_error(patch(32, {0xFF, 0xFF, 0xFF}), "names_bytes");
  expect_error(patch(40, {0xFF, 0xFF, 0xFF, 0xFF}), "data_offset");
  expect_error(patch(48, {0, 0, 0, 0, 0, 0, 0, 0x80}), "index_offset");
  expect_error(patch(64, {0xFF, 0xFF}), "class name length");
  // Index entries: the table is the last 4 * 24 bytes.
  const size_t e0 = bytes.size() - 4 * 24;
  expect_error(patch(e0 + 24 * 3, {0xFF, 0xFF, 0xFF, 0xFF}), "offset past the blob");
  expect_error(patch(e0 + 8, {0xFF, 0xFF, 0xFF, 0x7F}), "size past the blob");
  expect_error(patch(e0 + 12, {2}), "label out of range");
  expect_error(patch(e0 + 12, {0xFF, 0xFF, 0xFF, 0xFF}), "negative label");
  expect_error(patch(e0 + 16, {0, 0}), "zero height");
  expect_error(patch(e0 + 16, {21}), "raw size mismatch");
  expect_error(patch(e0 + 20, {4}), "channels");
  expect_error(patch(e0 + 21, {9}), "mode");
  expect_error(std::vector<uint8_t>(100, 0x41), "garbage");
  EXPECT_THROW(PackedReader((fx.dir.path / "missing.vpk").string()), vit::Error);
  // The good file is still fine, and a JPEG entry with corrupt bytes fails at decode time only.
  PackedReader ok(good.string());
  EXPECT_EQ(ok.size(), 4u);
  const fs::path jp = fx.dir.path / "j.vpk";
  write_packed(jp.string(), fx.idx, 32, true, 90, 1);
  auto jb = slurp(jp);
  PackedReader jr0(jp.string());
  const size_t blob0 = jb.size() - 4 * 24 - [&] {
    size_t s = 0;
    for (size_t i = 0; i < 4; ++i) s += jr0.entry(i).size;
    return s;
  }();
  const size_t off1 = blob0 + jr0.entry(1).offset;
  std::fill(jb.begin() + off1 + 2, jb.begin() + off1 + jr0.entry(1).size, 0x00);
  write_bytes(bad, jb);
  PackedReader jr(bad.string());
  EXPECT_NO_THROW(jr.decode(0));
  try {
    jr.decode(1);
    ADD_FAILURE() << "corrupt JPEG sample decoded";
  } catch (const vit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 1"), std::string::npos) << e.what();
  }
}

TEST(Packed, LargeJpegSourceDownscaledThroughDct) {
  TempDir t;
  const fs::path split = t.path / "train";
  const Image src = gradient(300, 400, 4);
  write_bytes(split / "only" / "big.jpg", encode_jpeg(src, 95));
  const FolderIndex idx = index_image_folder(split.string());
  const std::string out = (t.path / "p.vpk").string();
  ::testing::internal::CaptureStderr();
  write_packed(out, idx, 100, false, 90, 1);
  ::testing::internal::GetCapturedStderr();
  PackedReader r(out);
  const Image img = r.decode(0);
  EXPECT_EQ(img.h, 75);
  EXPECT_EQ(img.w, 100);
  EXPECT_LT(mean_abs_diff(img, resize_max_side(src, 100)), 3.0);
}
