// File formats: safetensors round trip, byte layout and every validation rule; atomic writes;
// IDX parsing (plain and gzip) and its bounds; .npy output read back by NumPy.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "io/atomic_file.h"
#include "io/idx.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using vit::Index;
using vit::io::DType;

namespace {

class IoTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  std::string slurp(const std::string& name) const {
    std::ifstream f(path(name), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  vit::testing::TempDir tmp_;
  fs::path dir_ = tmp_.path;
};

// Runs f and returns the vit::Error message (fails the test if nothing or something else is
// thrown).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const vit::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-vit::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

#define EXPECT_ERROR_HAS(stmt, needle)                                      \
  do {                                                                      \
    const std::string msg_ = error_of([&] { stmt; });                       \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: " << msg_; \
  } while (0)

std::string le64(uint64_t n) {
  return std::string(reinterpret_cast<const char*>(&n), 8);
}

// A safetensors file image from a raw header JSON and a data buffer.
std::string st_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

vit::io::Tensor make(const std::string& name, DType dt, std::vector<Index> shape) {
  vit::io::Tensor t;
  t.name = name;
  t.dtype = dt;
  t.shape = std::move(shape);
  t.data.resize(size_t(t.numel()) * vit::io::dtype_size(dt));
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = uint8_t(i * 37 + name.size());
  return t;
}

// ---------------------------------------------------------------------------------------------
// safetensors

TEST_F(IoTest, SafetensorsRoundTripsEveryDtypeScalarAndEmpty) {
  vit::io::SafeTensors st;
  st.metadata["epoch"] = "3";
  st.metadata["note"] = "hello \"quoted\" \xc3\xa9";
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  st.add_f32("w.f32", {2, 3}, a.data());
  st.add_f32("scalar", {}, a.data());
  st.add_f32("empty", {0, 4}, nullptr);
  for (DType dt : {DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::U8})
    st.add(make(std::string("t.") + vit::io::dtype_name(dt), dt, {3, 2}));
  st.add(make("u8.empty", DType::U8, {5, 0}));
  vit::io::write_safetensors(path("x.safetensors"), st);

  const auto rt = vit::io::read_safetensors(path("x.safetensors"));
  EXPECT_EQ(rt.metadata.at("epoch"), "3");
  EXPECT_EQ(rt.metadata.at("note"), st.metadata.at("note"));
  EXPECT_EQ(rt.metadata.at("format"), "pt");
  ASSERT_EQ(rt.tensors.size(), st.tensors.size());
  for (const auto& t : st.tensors) {
    const auto& r = rt.at(t.name);
    EXPECT_EQ(r.dtype, t.dtype) << t.name;
    EXPECT_EQ(r.shape, t.shape) << t.name;
    EXPECT_EQ(r.data, t.data) << t.name;
  }
  EXPECT_EQ(rt.at("w.f32").to_f32(), a);
  EXPECT_EQ(rt.at("scalar").shape, std::vector<Index>{});
  EXPECT_EQ(rt.at("scalar").to_f32(), std::vector<float>{1.5f});
  EXPECT_EQ(rt.at("empty").numel(), 0);
  EXPECT_TRUE(rt.at("empty").to_f32().empty());
  EXPECT_EQ(rt.find("missing"), nullptr);
  EXPECT_ERROR_HAS(rt.at("missing"), "missing");
  EXPECT_ERROR_HAS(rt.at("t.I32").to_f32(), "integer dtype");
}

TEST_F(IoTest, SafetensorsMetadataOptionalAndFormatOverridable) {
  // No __metadata__ at all is fine.
  write_raw("nometa", st_bytes(R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "ab"));
  const auto st = vit::io::read_safetensors(path("nometa"));
  EXPECT_TRUE(st.metadata.empty());
  EXPECT_EQ(st.at("t").data, (std::vector<uint8_t>{'a', 'b'}));
  // Empty file content (no tensors) round-trips.
  vit::io::SafeTensors none;
  none.metadata["format"] = "np";
  vit::io::write_safetensors(path("none"), none);
  const auto rt = vit::io::read_safetensors(path("none"));
  EXPECT_TRUE(rt.tensors.empty());
  EXPECT_EQ(rt.metadata.at("format"), "np");
}

TEST_F(IoTest, SafetensorsByteExactLayout) {
  vit::io::SafeTensors st;
  st.metadata["k"] = "v";
  const float f[2] = {1.0f, 2.0f};
  st.add(make("z.u8", DType::U8, {3}));
  st.add_f32("b", {2}, f);
  st.add(make("c.f64", DType::F64, {1}));
  st.add_f32("a", {1}, f);
  st.add(make("h", DType::F16, {2}));
  vit::io::write_safetensors(path("x"), st);

  // Descending dtype size, then name: c.f64 (8), a, b (4), h (2), z.u8 (1).
  std::string header = R"({"__metadata__":{"format":"pt","k":"v"},)"
                       R"("c.f64":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
                       R"("h":{"dtype":"F16","shape":[2],"data_offsets":[20,24]},)"
                       R"("z.u8":{"dtype":"U8","shape":[3],"data_offsets":[24,27]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size() % 8, 0u);
  std::string data;
  for (const char* name : {"c.f64", "a", "b", "h", "z.u8"}) {
    const auto& d = st.at(name).data;
    data.append(reinterpret_cast<const char*>(d.data()), d.size());
  }
  EXPECT_EQ(slurp("x"), st_bytes(header, data));
  EXPECT_EQ(listing(), std::vector<std::string>{"x"});  // no temp file left behind
}

TEST_F(IoTest, HalfAndBfloatConversions) {
  auto half = [](std::vector<uint16_t> bits) {
    vit::io::Tensor t;
    t.name = "h";
    t.dtype = DType::F16;
    t.shape = {Index(bits.size())};
    t.data.resize(bits.size() * 2);
    std::memcpy(t.data.data(), bits.data(), t.data.size());
    return t;
  };
  const auto h = half({0x3c00, 0xc000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x7c00, 0xfc00, 0x8000,
                       0x3555, 0x7e00, 0xfe01})
                     .to_f32();
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], std::ldexp(1.0f, -24));         // smallest subnormal
  EXPECT_EQ(h[3], 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(h[4], std::ldexp(1.0f, -14));         // smallest normal
  EXPECT_EQ(h[5], 65504.0f);                      // largest finite
  EXPECT_EQ(h[6], std::numeric_limits<float>::infinity());
  EXPECT_EQ(h[7], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(h[8], 0.0f);
  EXPECT_TRUE(std::signbit(h[8]));
  EXPECT_EQ(h[9], 0x555 * std::ldexp(1.0f, -12));  // 0x3555 = 0.333251953125
  EXPECT_TRUE(std::isnan(h[10]));
  EXPECT_TRUE(std::isnan(h[11]));
  EXPECT_TRUE(std::signbit(h[11]));
  // Every half converts exactly; f64 agrees with f32.
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  const auto f = half(all).to_f32();
  const auto d = half(all).to_f64();
  for (int i = 0; i < 65536; ++i) {
    if (std::isnan(f[i])) {
      EXPECT_TRUE(std::isnan(d[i]));
      continue;
    }
    ASSERT_EQ(double(f[i]), d[i]) << i;
    const int exp = (i >> 10) & 0x1f, man = i & 0x3ff;
    const double want = (exp == 0 ? std::ldexp(man, -24) : std::ldexp(man | 0x400, exp - 25));
    ASSERT_EQ(std::fabs(d[i]), exp == 31 ? INFINITY : want) << i;
    ASSERT_EQ(std::signbit(d[i]), bool(i & 0x8000)) << i;
  }

  vit::io::Tensor bf;
  bf.name = "b";
  bf.dtype = DType::BF16;
  bf.shape = {3};
  const uint16_t bbits[3] = {0x3f80, 0xc040, 0x7f80};
  bf.data.resize(6);
  std::memcpy(bf.data.data(), bbits, 6);
  EXPECT_EQ(bf.to_f32(), (std::vector<float>{1.0f, -3.0f, INFINITY}));
  EXPECT_EQ(bf.to_f64(), (std::vector<double>{1.0, -3.0, INFINITY}));

  vit::io::Tensor f64 = make("d", DType::F64, {1});
  const double pi = 3.141592653589793;
  std::memcpy(f64.data.data(), &pi, 8);
  EXPECT_EQ(f64.to_f64()[0], pi);
  EXPECT_EQ(f64.to_f32()[0], float(pi));
}

TEST_F(IoTest, SafetensorsAddChecksItsInput) {
  vit::io::SafeTensors st;
  const float v[2] = {1, 2};
  st.add_f32("a", {2}, v);
  EXPECT_ERROR_HAS(st.add_f32("a", {1}, v), "duplicate");
  auto t = make("b", DType::F32, {2});
  t.data.pop_back();
  EXPECT_ERROR_HAS(st.add(t), "'b'");
  EXPECT_ERROR_HAS(st.add(make("__metadata__", DType::U8, {1})), "reserved");
  // Bypassing add() still cannot produce an invalid file.
  st.tensors.push_back(t);
  EXPECT_ERROR_HAS(vit::io::write_safetensors(path("x"), st), "'b'");
  EXPECT_TRUE(listing().empty());
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* needle;
};

TEST_F(IoTest, SafetensorsRejectsEveryMalformedFile) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string d8(8, '\0');
  auto one = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return R"({"t":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets +
           "}}";
  };
  std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::vector<Malformed> cases = {
      {"empty", "", "8-byte"},
      {"tiny", "abc", "8-byte"},
      {"header_too_large", le64(100'000'001) + "{}", "100 MB"},
      {"header_huge", le64(~uint64_t(0)) + "{}", "100 MB"},
      {"header_past_end", le64(ok.size() + 50) + ok, "truncated"},
      {"data_truncated", st_bytes(ok, std::string(4, '\0')), "outside"},
      {"bad_json", st_bytes("{not json", d8), "not valid JSON"},
      {"nul_padding", st_bytes(ok + std::string(3, '\0'), d8), "not valid JSON"},
      {"nul_inside",
       st_bytes(
           R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})" + std::string(1, '\0') + "{}",
           "x"),
       "NUL"},
      {"bad_utf8", st_bytes("{\"\xff\":1}", ""), "not valid JSON"},
      {"deep_nesting", st_bytes(deep, ""), "not a JSON object"},
      {"not_object", st_bytes("[1,2]", ""), "not a JSON object"},
      {"meta_nonstring", st_bytes(R"({"__metadata__":{"a":1}})", ""), "'a' is not a string"},
      {"meta_not_object", st_bytes(R"({"__metadata__":"x"})", ""), "__metadata__"},
      {"entry_not_object", st_bytes(R"({"t":5})", ""), "needs dtype"},
      {"missing_offsets", st_bytes(R"({"t":{"dtype":"F32","shape":[2]}})", d8), "data_offsets"},
      {"unknown_dtype", st_bytes(one(R"("Q7")", "[2]", "[0,8]"), d8), "unsupported dtype"},
      {"dtype_bool", st_bytes(one(R"("BOOL")", "[8]", "[0,8]"), d8), "unsupported dtype"},
      {"dtype_not_string", st_bytes(one("4", "[2]", "[0,8]"), d8), "unsupported dtype"},
      {"shape_not_list", st_bytes(one(R"("F32")", "2", "[0,8]"), d8), "shape is not a list"},
      {"shape_negative", st_bytes(one(R"("F32")", "[-2]", "[0,8]"), d8), "non-negative"},
      {"shape_float", st_bytes(one(R"("F32")", "[2.0]", "[0,8]"), d8), "non-negative"},
      {"shape_overflow",
       st_bytes(one(R"("F64")", "[4294967296,4294967296,4294967296]", "[0,8]"), d8), "too large"},
      // Hardening review (issue 17): a zero dimension used to skip the size check, so these were
      // accepted and numel() overflowed (UB) or a dimension read back negative.
      {"shape_overflow_with_zero",
       st_bytes(one(R"("F32")", "[4611686018427387904,4611686018427387904,0]", "[0,0]"), ""),
       "too large"},
      {"shape_dim_over_int64", st_bytes(one(R"("F32")", "[0,18446744073709551615]", "[0,0]"), ""),
       "too large"},
      {"offsets_short", st_bytes(one(R"("F32")", "[2]", "[0]"), d8), "data_offsets"},
      {"offsets_negative", st_bytes(one(R"("F32")", "[2]", "[-8,0]"), d8), "data_offsets"},
      {"offsets_reversed", st_bytes(one(R"("F32")", "[0]", "[8,0]"), d8), "outside"},
      {"offsets_past_end", st_bytes(one(R"("F32")", "[2]", "[8,16]"), d8), "outside"},
      {"wrong_size", st_bytes(one(R"("F32")", "[3]", "[0,8]"), d8), "need 12"},
      {"first_not_zero", st_bytes(one(R"("F32")", "[1]", "[4,8]"), d8), "hole"},
      {"overlap",
       st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                d8),
       "overlap"},
      {"hole",
       st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                d8),
       "hole"},
      {"trailing_bytes", st_bytes(ok, d8 + "xx"), "size mismatch"},
      {"duplicate_key",
       st_bytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                d8),
       "duplicate key 't'"},
      {"duplicate_meta_key", st_bytes(R"({"__metadata__":{"a":"1","a":"2"}})", ""),
       "duplicate key 'a'"},
  };
  for (const auto& c : cases) {
    write_raw(c.name, c.bytes);
    SCOPED_TRACE(c.name);
    const std::string msg = error_of([&] { vit::io::read_safetensors(path(c.name)); });
    EXPECT_NE(msg.find(c.needle), std::string::npos) << "message: " << msg;
    EXPECT_NE(msg.find(path(c.name)), std::string::npos) << "message lacks the path: " << msg;
  }
  write_raw("good", st_bytes(ok, d8));
  EXPECT_NO_THROW(vit::io::read_safetensors(path("good")));
  EXPECT_ERROR_HAS(vit::io::read_safetensors(path("does_not_exist")), "does_not_exist");
  EXPECT_ERROR_HAS(vit::io::read_safetensors(dir_.string()), "directory");
}

// Hostile input must never crash: every truncation and many byte flips of a valid file either
// load or throw vit::Error.
TEST_F(IoTest, SafetensorsSurvivesTruncationAndCorruption) {
  vit::io::SafeTensors st;
  st.metadata["m"] = "x";
  st.add(make("a", DType::F32, {2, 2}));
  st.add(make("b", DType::F16, {3}));
  st.add(make("c", DType::U8, {0}));
  vit::io::write_safetensors(path("v"), st);
  const std::string good = slurp("v");
  for (size_t len = 0; len < good.size(); ++len) {
    write_raw("t", good.substr(0, len));
    EXPECT_THROW(vit::io::read_safetensors(path("t")), vit::Error) << len;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000; ++i) {
    std::string bad = good;
    for (int k = 0; k < 1 + i % 3; ++k) bad[rng() % bad.size()] = char(rng());
    write_raw("f", bad);
    try {
      vit::io::read_safetensors(path("f"));
    } catch (const vit::Error&) {
    }
  }
}

// ---------------------------------------------------------------------------------------------
// atomic files

TEST_F(IoTest, AtomicWriteReplacesAndLeavesNoTemp) {
  vit::io::write_file_atomic(path("f.txt"), "old contents, longer");
  vit::io::write_file_atomic(path("f.txt"), "new");
  EXPECT_EQ(vit::io::read_file(path("f.txt")), "new");
  vit::io::write_file_atomic(path("empty"), "");
  EXPECT_EQ(vit::io::read_file(path("empty")), "");
  const std::string big(3 << 20, 'z');
  vit::io::write_file_atomic(path("big"), big);
  EXPECT_EQ(vit::io::read_file(path("big")), big);
  EXPECT_EQ(listing(), (std::vector<std::string>{"big", "empty", "f.txt"}));
}

TEST_F(IoTest, AtomicWriteFailuresThrowAndLeaveNothing) {
  const std::string missing = path("no/such/dir/f.txt");
  const std::string msg = error_of([&] { vit::io::write_file_atomic(missing, "x"); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  EXPECT_TRUE(listing().empty());
  // Renaming over a non-empty directory fails after the temp file exists: it must be removed.
  fs::create_directories(path("d/sub"));
  EXPECT_ERROR_HAS(vit::io::write_file_atomic(path("d"), "x"), path("d"));
  EXPECT_EQ(listing(), std::vector<std::string>{"d"});

  EXPECT_ERROR_HAS(vit::io::read_file(path("missing.txt")), "No such file");
  EXPECT_ERROR_HAS(vit::io::read_file(path("d")), "directory");
}

// ---------------------------------------------------------------------------------------------
// IDX

std::string idx_bytes(uint8_t type, std::vector<uint32_t> dims, size_t payload) {
  std::string b = {0, 0, char(type), char(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(char(d >> s));
  for (size_t i = 0; i < payload; ++i) b.push_back(char(i % 251));
  return b;
}

void write_gz(const std::string& p, const std::string& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

TEST_F(IoTest, IdxReadsPlainAndGzip) {
  write_raw("img", idx_bytes(0x08, {3, 2, 2}, 12));
  write_gz(path("img.gz"), idx_bytes(0x08, {3, 2, 2}, 12));
  write_gz(path("lab.gz"), idx_bytes(0x08, {3}, 3));
  for (const char* f : {"img", "img.gz"}) {
    const auto a = vit::io::read_idx(path(f));
    EXPECT_EQ(a.dims, (std::vector<Index>{3, 2, 2}));
    ASSERT_EQ(a.data.size(), 12u);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(a.data[i], i);
  }
  const auto d = vit::io::read_idx_pair(path("img.gz"), path("lab.gz"));
  EXPECT_EQ(d.n, 3);
  EXPECT_EQ(d.rows, 2);
  EXPECT_EQ(d.cols, 2);
  EXPECT_EQ(d.images.size(), 12u);
  EXPECT_EQ(d.labels, (std::vector<uint8_t>{0, 1, 2}));
  // Larger than zlib's internal buffers, four dimensions, and empty arrays.
  write_gz(path("big.gz"), idx_bytes(0x08, {10, 3, 100, 100}, 300000));
  const auto big = vit::io::read_idx(path("big.gz"));
  ASSERT_EQ(big.data.size(), 300000u);
  EXPECT_EQ(big.data[299999], 299999 % 251);
  write_raw("zero", idx_bytes(0x08, {0, 28, 28}, 0));
  EXPECT_TRUE(vit::io::read_idx(path("zero")).data.empty());
  write_raw("zero_huge", idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0}, 0));
  EXPECT_EQ(vit::io::read_idx(path("zero_huge")).dims[0], 0xFFFFFFFF);
}

TEST_F(IoTest, IdxRejectsBadFiles) {
  auto rejects = [&](const std::string& name, const std::string& bytes, const std::string& needle,
                     bool gz) {
    SCOPED_TRACE(name + (gz ? " (gz)" : ""));
    const std::string p = path(name + (gz ? ".gz" : ""));
    if (gz)
      write_gz(p, bytes);
    else
      write_raw(name, bytes);
    const std::string msg = error_of([&] { vit::io::read_idx(p); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
  };
  for (bool gz : {false, true}) {
    rejects("empty", "", "magic", gz);
    rejects("magic", "\x01\x02\x08\x01", "magic", gz);
    rejects("type_f32", idx_bytes(0x0D, {2}, 8), "0x0d is not supported", gz);
    rejects("type_i8", idx_bytes(0x09, {2}, 2), "0x09 is not supported", gz);
    rejects("ndims0", idx_bytes(0x08, {}, 1), "0 dimensions", gz);
    rejects("ndims5", idx_bytes(0x08, {1, 1, 1, 1, 1}, 1), "5 dimensions", gz);
    rejects("short_header", idx_bytes(0x08, {3, 2, 2}, 0).substr(0, 9), "truncated", gz);
    rejects("truncated", idx_bytes(0x08, {3, 2, 2}, 11), "truncated", gz);
    rejects("no_data", idx_bytes(0x08, {3, 2, 2}, 0), "truncated", gz);
    rejects("extra", idx_bytes(0x08, {3, 2, 2}, 13), "extra bytes", gz);
    rejects("huge", idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, 4), "too large", gz);
    rejects("over_16g", idx_bytes(0x08, {0x10000, 0x10000, 5}, 4), "too large", gz);
    // Passes the size cap but the data is missing: must fail without allocating it all.
    rejects("lying", idx_bytes(0x08, {60000, 28, 28}, 100), "truncated", gz);
  }

  // Corrupt gzip: cut inside the deflate data, cut inside the trailer, flipped CRC.
  write_gz(path("full.gz"), idx_bytes(0x08, {30, 20, 20}, 12000));
  const std::string gz = slurp("full.gz");
  ASSERT_GT(gz.size(), 80u);
  write_raw("cut.gz", gz.substr(0, gz.size() / 2));
  EXPECT_ERROR_HAS(vit::io::read_idx(path("cut.gz")), "cut.gz");
  write_raw("cut_trailer.gz", gz.substr(0, gz.size() - 3));
  EXPECT_ERROR_HAS(vit::io::read_idx(path("cut_trailer.gz")), "gzip");
  std::string crc = gz;
  crc[crc.size() - 6] ^= 0x55;
  write_raw("crc.gz", crc);
  EXPECT_ERROR_HAS(vit::io::read_idx(path("crc.gz")), "gzip");
  std::string garbled = gz;
  for (size_t i = 20; i < 60; ++i) garbled[i] = char(0xff);
  write_raw("garbled.gz", garbled);
  EXPECT_THROW(vit::io::read_idx(path("garbled.gz")), vit::Error);

  EXPECT_ERROR_HAS(vit::io::read_idx(path("missing")), "No such file");
}

TEST_F(IoTest, IdxPairChecksShapesAndCounts) {
  write_gz(path("img.gz"), idx_bytes(0x08, {3, 2, 2}, 12));
  write_gz(path("lab.gz"), idx_bytes(0x08, {3}, 3));
  write_gz(path("lab4.gz"), idx_bytes(0x08, {4}, 4));
  EXPECT_ERROR_HAS(vit::io::read_idx_pair(path("img.gz"), path("lab4.gz")), "count mismatch");
  EXPECT_ERROR_HAS(vit::io::read_idx_pair(path("lab.gz"), path("lab.gz")), "(n, rows, cols)");
  EXPECT_ERROR_HAS(vit::io::read_idx_pair(path("img.gz"), path("img.gz")), "labels of shape");
}

TEST_F(IoTest, FashionMnistFromDebianLoads) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const auto d = vit::io::read_idx_pair(dir + "/t10k-images-idx3-ubyte.gz",
                                        dir + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(d.n, 10000);
  EXPECT_EQ(d.rows, 28);
  EXPECT_EQ(d.cols, 28);
  EXPECT_EQ(d.images.size(), 10000u * 28 * 28);
  std::vector<int> count(256, 0);
  for (uint8_t l : d.labels) ++count[l];
  for (int c = 0; c < 10; ++c) EXPECT_GT(count[c], 0) << c;
  for (int c = 10; c < 256; ++c) EXPECT_EQ(count[c], 0) << c;
}

// ---------------------------------------------------------------------------------------------
// .npy

bool have_numpy() {
  return std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") == 0;
}

TEST_F(IoTest, NpyRoundTripAndLayout) {
  const std::vector<float> v = {1, 2, 3, 4, 5, 6.5f};
  const std::vector<std::vector<Index>> shapes = {{2, 3}, {6}, {1, 2, 3, 1}, {}, {0, 3}};
  for (const auto& s : shapes) {
    vit::io::write_npy_f32(path("a.npy"), v.data(), s);
    const std::string b = slurp("a.npy");
    Index n = 1;
    for (Index d : s) n *= d;
    const size_t header = b.size() - size_t(n) * 4;
    EXPECT_EQ(header % 64, 0u);
    EXPECT_EQ(b[header - 1], '\n');
    EXPECT_EQ(b.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    std::vector<Index> shape;
    const auto back = vit::io::read_npy_f32(path("a.npy"), &shape);
    EXPECT_EQ(shape, s);
    EXPECT_EQ(back, std::vector<float>(v.begin(), v.begin() + n));
  }
  EXPECT_NE(slurp("a.npy").find("'shape': (0, 3)"), std::string::npos);
  vit::io::write_npy_f32(path("b.npy"), v.data(), {6});
  EXPECT_NE(slurp("b.npy").find("'shape': (6,)"), std::string::npos);
  EXPECT_EQ(listing(), (std::vector<std::string>{"a.npy", "b.npy"}));
}

TEST_F(IoTest, NpyReaderValidatesHeader) {
  auto npy = [](const std::string& dict, const std::string& data) {
    const uint16_t hl = uint16_t(dict.size());
    return std::string("\x93NUMPY\x01\x00", 8) +
           std::string(reinterpret_cast<const char*>(&hl), 2) + dict + data;
  };
  const std::string d8(8, '\0');
  const std::vector<Malformed> cases = {
      {"magic", "NUMPY...........", "bad magic"},
      {"version", std::string("\x93NUMPY\x07\x00\x00\x00", 10), "version 7"},
      {"short", npy("{'descr': '<f4'", "").substr(0, 14), "truncated"},
      {"descr", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }\n", d8), "'<f8'"},
      {"fortran", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", d8), "Fortran"},
      {"no_shape", npy("{'descr': '<f4', 'fortran_order': False, }\n", d8), "no 'shape'"},
      {"syntax", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), \n", d8),
       "bad .npy header"},
      {"neg_dim", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", d8),
       "non-negative"},
      {"huge_dim",
       npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", d8),
       "too large"},
      {"overflow",
       npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, "
           "4294967296, 4294967296), }\n",
           d8),
       "do not match"},
      {"size", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n", d8),
       "do not match"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    write_raw(c.name, c.bytes);
    const std::string msg = error_of([&] { vit::io::read_npy_f32(path(c.name), nullptr); });
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
  write_raw("ok", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", d8));
  EXPECT_EQ(vit::io::read_npy_f32(path("ok"), nullptr), (std::vector<float>{0, 0}));
}

TEST_F(IoTest, NumpyReadsOurNpyAndWeReadNumpys) {
  if (!have_numpy()) GTEST_SKIP() << "no numpy to cross-check";
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = 0.5f * i - 3.0f;
  vit::io::write_npy_f32(path("a.npy"), v.data(), {2, 3, 4});
  vit::io::write_npy_f32(path("s.npy"), v.data(), {});
  vit::io::write_npy_f32(path("e.npy"), v.data(), {0, 5});
  const std::string py =
      "import numpy as np, sys; d=sys.argv[1]\n"
      "a=np.load(d+'/a.npy'); assert a.shape==(2,3,4) and a.dtype==np.float32, a.shape\n"
      "assert (a.ravel()==np.arange(24,dtype=np.float32)*0.5-3).all()\n"
      "s=np.load(d+'/s.npy'); assert s.shape==() and s==-3\n"
      "e=np.load(d+'/e.npy'); assert e.shape==(0,5)\n"
      "np.save(d+'/np.npy', np.linspace(0,1,15,dtype=np.float32).reshape(5,3))\n";
  write_raw("check.py", py);
  const std::string cmd = "/usr/bin/python3 " + path("check.py") + " " + dir_.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::vector<Index> shape;
  const auto back = vit::io::read_npy_f32(path("np.npy"), &shape);
  EXPECT_EQ(shape, (std::vector<Index>{5, 3}));
  ASSERT_EQ(back.size(), 15u);
  EXPECT_FLOAT_EQ(back[14], 1.0f);
  EXPECT_FLOAT_EQ(back[7], 0.5f);
}

}  // namespace
