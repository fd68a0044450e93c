// File formats: safetensors round trip, layout and every validation rule; atomic writes; IDX
// parsing and its bounds; .npy output read back by NumPy.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/atomic_file.h"
#include "io/idx.h"
#include "io/npy.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using vit::Index;

namespace {

class IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vitrain_io_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  // A safetensors file from a raw header JSON and a data buffer.
  void write_st(const std::string& name, const std::string& header, const std::string& data) {
    const uint64_t n = header.size();
    std::string b(reinterpret_cast<const char*>(&n), 8);
    write_raw(name, b + header + data);
  }
  // Expects read_safetensors to throw a vit::Error whose message contains `needle`.
  void expect_rejected(const std::string& name, const std::string& needle) {
    try {
      vit::io::read_safetensors(path(name));
      ADD_FAILURE() << name << " was accepted";
    } catch (const vit::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << name << ": " << e.what();
    }
  }
  fs::path dir_;
};

TEST_F(IoTest, SafetensorsRoundTripAndLayout) {
  vit::io::SafeTensors st;
  st.metadata["epoch"] = "3";
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  st.add_f32("b.weight", {2, 3}, a.data());
  st.add_f32("a.scalar", {}, a.data());
  st.add_f32("c.empty", {0, 4}, a.data());
  vit::io::Tensor bytes;
  bytes.name = "d.bytes";
  bytes.dtype = vit::io::DType::U8;
  bytes.shape = {3};
  bytes.data = {1, 2, 3};
  st.add(bytes);
  vit::io::Tensor half;
  half.name = "e.half";
  half.dtype = vit::io::DType::F16;
  half.shape = {3};
  half.data = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00};  // 1.0, -2.0, smallest subnormal
  st.add(half);
  vit::io::write_safetensors(path("x.safetensors"), st);

  const auto rt = vit::io::read_safetensors(path("x.safetensors"));
  EXPECT_EQ(rt.metadata.at("epoch"), "3");
  EXPECT_EQ(rt.metadata.at("format"), "pt");
  EXPECT_EQ(rt.at("b.weight").shape, (std::vector<Index>{2, 3}));
  EXPECT_EQ(rt.at("b.weight").to_f32(), a);
  EXPECT_EQ(rt.at("a.scalar").to_f32(), std::vector<float>{1.5f});
  EXPECT_EQ(rt.at("c.empty").numel(), 0);
  EXPECT_EQ(rt.at("d.bytes").data, bytes.data);
  const auto h = rt.at("e.half").to_f32();
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_FLOAT_EQ(h[2], std::ldexp(1.0f, -24));
  EXPECT_THROW(rt.at("d.bytes").to_f32(), vit::Error);
  EXPECT_THROW(rt.at("missing"), vit::Error);

  // Layout: header length a multiple of 8; tensors by descending dtype size, then name.
  std::ifstream f(path("x.safetensors"), std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), {});
  uint64_t n;
  std::memcpy(&n, all.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const auto hdr = nlohmann::json::parse(all.substr(8, n));
  EXPECT_EQ(hdr["a.scalar"]["data_offsets"][0], 0);
  EXPECT_LT(hdr["b.weight"]["data_offsets"][0], hdr["e.half"]["data_offsets"][0]);
  EXPECT_LT(hdr["e.half"]["data_offsets"][0], hdr["d.bytes"]["data_offsets"][0]);
}

TEST_F(IoTest, SafetensorsRejectsMalformedFiles) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data8(8, '\0');
  write_raw("tiny", "abc");
  expect_rejected("tiny", "8-byte");
  {
    const uint64_t n = 200'000'000;
    write_raw("huge_header", std::string(reinterpret_cast<const char*>(&n), 8) + "{}");
  }
  expect_rejected("huge_header", "100 MB");
  write_st("trunc_header", ok, "");
  {  // claim a longer header than present
    const uint64_t n = ok.size() + 50;
    write_raw("header_past_end", std::string(reinterpret_cast<const char*>(&n), 8) + ok);
  }
  expect_rejected("header_past_end", "truncated");
  expect_rejected("trunc_header", "outside");
  write_st("bad_json", "{not json", data8);
  expect_rejected("bad_json", "JSON");
  write_st("meta_nonstring", R"({"__metadata__":{"a":1}})", "");
  expect_rejected("meta_nonstring", "not a string");
  write_st("dtype", R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", data8);
  expect_rejected("dtype", "unsupported dtype");
  write_st("size", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8);
  expect_rejected("size", "bytes for shape");
  write_st("overlap",
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           data8);
  expect_rejected("overlap", "overlap");
  write_st("hole",
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
           data8);
  expect_rejected("hole", "hole");
  write_st("trailing", ok, data8 + "xx");
  expect_rejected("trailing", "after the last tensor");
  write_st("dup",
           R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           data8);
  EXPECT_THROW(vit::io::read_safetensors(path("dup")), vit::Error);
  write_st("fields", R"({"t":{"dtype":"F32","shape":[2]}})", data8);
  expect_rejected("fields", "data_offsets");
  write_st("good", ok, data8);
  EXPECT_NO_THROW(vit::io::read_safetensors(path("good")));
  EXPECT_THROW(vit::io::read_safetensors(path("does_not_exist")), vit::Error);
}

TEST_F(IoTest, AtomicWriteReplacesAndLeavesNoTemp) {
  vit::io::write_file_atomic(path("f.txt"), "old");
  vit::io::write_file_atomic(path("f.txt"), "new contents");
  EXPECT_EQ(vit::io::read_file(path("f.txt")), "new contents");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  EXPECT_THROW(vit::io::write_file_atomic(path("no/such/dir/f.txt"), "x"), vit::Error);
  EXPECT_THROW(vit::io::read_file(path("missing.txt")), vit::Error);
}

std::string idx_bytes(uint8_t type, std::vector<uint32_t> dims, size_t payload) {
  std::string b = {0, 0, char(type), char(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(char(d >> s));
  for (size_t i = 0; i < payload; ++i) b.push_back(char(i % 251));
  return b;
}

void write_gz(const std::string& p, const std::string& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
}

TEST_F(IoTest, IdxReadsPlainAndGzipAndChecksBounds) {
  write_raw("img", idx_bytes(0x08, {3, 2, 2}, 12));
  write_gz(path("img.gz"), idx_bytes(0x08, {3, 2, 2}, 12));
  write_gz(path("lab.gz"), idx_bytes(0x08, {3}, 3));
  for (const char* f : {"img", "img.gz"}) {
    const auto a = vit::io::read_idx(path(f));
    EXPECT_EQ(a.dims, (std::vector<Index>{3, 2, 2}));
    ASSERT_EQ(a.data.size(), 12u);
    EXPECT_EQ(a.data[11], 11);
  }
  const auto d = vit::io::read_idx_pair(path("img.gz"), path("lab.gz"));
  EXPECT_EQ(d.n, 3);
  EXPECT_EQ(d.rows, 2);
  EXPECT_EQ(d.labels.size(), 3u);

  auto rejects = [&](const std::string& name, const std::string& bytes, const std::string& needle) {
    write_raw(name, bytes);
    try {
      vit::io::read_idx(path(name));
      ADD_FAILURE() << name << " accepted";
    } catch (const vit::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  rejects("magic", "\x01\x02\x08\x01", "magic");
  rejects("type", idx_bytes(0x0D, {2}, 8), "not supported");
  rejects("ndims", idx_bytes(0x08, {1, 1, 1, 1, 1}, 1), "dimensions");
  rejects("short_header", idx_bytes(0x08, {3, 2, 2}, 0).substr(0, 9), "truncated");
  rejects("truncated", idx_bytes(0x08, {3, 2, 2}, 11), "truncated");
  rejects("extra", idx_bytes(0x08, {3, 2, 2}, 13), "after its data");
  rejects("huge", idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF}, 4), "too large");
  write_gz(path("lab4.gz"), idx_bytes(0x08, {4}, 4));
  EXPECT_THROW(vit::io::read_idx_pair(path("img.gz"), path("lab4.gz")), vit::Error);
  EXPECT_THROW(vit::io::read_idx_pair(path("lab.gz"), path("lab.gz")), vit::Error);
  {  // truncated gzip stream
    write_gz(path("full.gz"), idx_bytes(0x08, {3, 2, 2}, 12));
    fs::resize_file(path("full.gz"), fs::file_size(path("full.gz")) - 6);
    EXPECT_THROW(vit::io::read_idx(path("full.gz")), vit::Error);
  }
  EXPECT_THROW(vit::io::read_idx(path("missing")), vit::Error);
}

TEST_F(IoTest, FashionMnistFromDebianLoads) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/t10k-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const auto d = vit::io::read_idx_pair(dir + "/t10k-images-idx3-ubyte.gz",
                                        dir + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(d.n, 10000);
  EXPECT_EQ(d.rows, 28);
  EXPECT_EQ(d.cols, 28);
  for (uint8_t l : d.labels) EXPECT_LT(l, 10);
}

TEST_F(IoTest, NpyRoundTripAndNumpyReadsIt) {
  const std::vector<float> v = {1, 2, 3, 4, 5, 6.5f};
  vit::io::write_npy_f32(path("a.npy"), v.data(), {2, 3});
  std::vector<Index> shape;
  EXPECT_EQ(vit::io::read_npy_f32(path("a.npy"), &shape), v);
  EXPECT_EQ(shape, (std::vector<Index>{2, 3}));
  EXPECT_EQ((fs::file_size(path("a.npy")) - v.size() * 4) % 64, 0u);
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
    GTEST_SKIP() << "no numpy to cross-check";
  const std::string cmd = "/usr/bin/python3 -c \"import numpy as np; a=np.load('" + path("a.npy") +
                          "'); assert a.shape==(2,3) and a.dtype==np.float32 and a[1,2]==6.5\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

}  // namespace
