#include "io/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <map>

#include "io/atomic_file.h"

namespace vit::io {

static_assert(std::endian::native == std::endian::little, "vitrain assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";

// The header is a Python dict literal; this reads exactly the subset NumPy writes: string keys
// mapping to a string, True/False, or a tuple of non-negative integers.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  struct Value {
    std::string str;  // string value, or "True"/"False"
    std::vector<Index> tuple;
    bool is_tuple = false;
  };

  std::map<std::string, Value> parse() {
    std::map<std::string, Value> out;
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      const std::string key = string();
      expect(':');
      if (!out.emplace(key, value()).second) fail(fmt::format("duplicate key '{}'", key));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;
    skip_ws();
    if (i_ != s_.size()) fail("unexpected text after the dict");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(fmt::format("'{}': bad .npy header at character {}: {}", path_, i_, why));
  }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++i_;
  }
  std::string string() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    const size_t end = s_.find(q, i_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string r = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return r;
  }
  Value value() {
    skip_ws();
    Value v;
    if (peek() == '\'' || peek() == '"') {
      v.str = string();
    } else if (s_.compare(i_, 4, "True") == 0 || s_.compare(i_, 5, "False") == 0) {
      v.str = s_[i_] == 'T' ? "True" : "False";
      i_ += v.str.size();
    } else if (peek() == '(') {
      ++i_;
      v.is_tuple = true;
      while (true) {
        skip_ws();
        if (peek() == ')') break;
        v.tuple.push_back(integer());
        skip_ws();
        if (peek() == ',')
          ++i_;
        else if (peek() != ')')
          fail("expected ',' or ')' in the shape");
      }
      ++i_;
    } else {
      fail("expected a string, True/False or a tuple");
    }
    return v;
  }
  Index integer() {
    if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a non-negative integer");
    Index n = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      if (n > (Index(1) << 40)) fail("dimension too large");
      n = n * 10 + (s_[i_++] - '0');
    }
    return n;
  }

  const std::string& s_;
  const std::string& path_;
  size_t i_ = 0;
};

}  // namespace

void write_npy_f32(const std::string& path, const float* data, const std::vector<Index>& shape) {
  Index n = 1;
  for (Index d : shape) {
    if (d < 0) throw Error(fmt::format("cannot write '{}': negative dimension {}", path, d));
    n *= d;
  }
  // A 1-element tuple needs its trailing comma in Python syntax: (5,).
  std::string dict = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}{}), }}",
                                 fmt::join(shape, ", "), shape.size() == 1 ? "," : "");
  // magic(6) + version(2) + header length(2) + dict + padding + '\n' is a multiple of 64.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  if (dict.size() > 0xffff)
    throw Error(fmt::format("cannot write '{}': .npy header too long", path));
  std::string out(kMagic, 6);
  out += '\x01';  // format version 1.0
  out += '\x00';
  const uint16_t hl = uint16_t(dict.size());
  out.append(reinterpret_cast<const char*>(&hl), 2);
  out += dict;
  out.append(reinterpret_cast<const char*>(data), size_t(n) * sizeof(float));
  write_file_atomic(path, out);
}

std::vector<float> read_npy_f32(const std::string& path, std::vector<Index>* shape) {
  const std::string b = read_file(path);
  if (b.size() < 10 || b.compare(0, 6, kMagic, 6) != 0)
    throw Error(fmt::format("'{}' is not a .npy file (bad magic)", path));
  const int major = static_cast<unsigned char>(b[6]);
  if (major < 1 || major > 3)
    throw Error(fmt::format("'{}': .npy format version {} is not supported", path, major));
  // Version 1 has a 2-byte header length, versions 2 and 3 a 4-byte one.
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (b.size() < 8 + len_bytes) throw Error(fmt::format("'{}' is truncated (header)", path));
  uint32_t hl = 0;
  std::memcpy(&hl, b.data() + 8, len_bytes);
  const size_t data_start = 8 + len_bytes + size_t(hl);
  if (b.size() < data_start) throw Error(fmt::format("'{}' is truncated (header)", path));

  const std::string text = b.substr(8 + len_bytes, hl);
  const auto dict = HeaderParser(text, path).parse();
  auto get = [&](const char* key) -> const HeaderParser::Value& {
    const auto it = dict.find(key);
    if (it == dict.end()) throw Error(fmt::format("'{}': .npy header has no '{}'", path, key));
    return it->second;
  };
  const auto& descr = get("descr");
  if (descr.is_tuple || descr.str != "<f4")
    throw Error(
        fmt::format("'{}': dtype '{}' is not little-endian float32 ('<f4')", path, descr.str));
  if (get("fortran_order").str != "False")
    throw Error(fmt::format("'{}': Fortran-order arrays are not supported", path));
  const auto& sh = get("shape");
  if (!sh.is_tuple) throw Error(fmt::format("'{}': .npy shape is not a tuple", path));

  const size_t payload = b.size() - data_start;
  uint64_t n = 1;
  for (Index d : sh.tuple) {
    if (d != 0 && n > payload / uint64_t(d)) {
      n = UINT64_MAX;  // more elements than the file could hold
      break;
    }
    n *= uint64_t(d);
  }
  if (std::find(sh.tuple.begin(), sh.tuple.end(), 0) != sh.tuple.end()) n = 0;
  if (n == UINT64_MAX || payload != n * 4)
    throw Error(fmt::format("'{}': {} data bytes do not match shape ({})", path, payload,
                            fmt::join(sh.tuple, ", ")));
  std::vector<float> v(n);
  if (n) std::memcpy(v.data(), b.data() + data_start, n * 4);
  if (shape) *shape = sh.tuple;
  return v;
}

}  // namespace vit::io
