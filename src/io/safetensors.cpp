#include "io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_file.h"

namespace vit::io {

static_assert(std::endian::native == std::endian::little, "vitrain assumes a little-endian host");

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;

struct DTypeInfo {
  DType d;
  const char* name;
  int size;
};
constexpr DTypeInfo kDTypes[] = {{DType::F32, "F32", 4}, {DType::F64, "F64", 8},
                                 {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2},
                                 {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
                                 {DType::U8, "U8", 1}};

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(float(mant), -24);  // zero or subnormal
  else if (exp == 31)
    v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(float(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

template <typename Out>
std::vector<Out> convert(const Tensor& t) {
  const Index n = t.numel();
  std::vector<Out> out(n);
  const uint8_t* p = t.data.data();
  for (Index i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::F32: {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = Out(v);
        break;
      }
      case DType::F64: {
        double v;
        std::memcpy(&v, p + 8 * i, 8);
        out[i] = Out(v);
        break;
      }
      case DType::BF16: {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = Out(std::bit_cast<float>(uint32_t(b) << 16));
        break;
      }
      case DType::F16: {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = Out(half_to_float(b));
        break;
      }
      default:
        throw Error(fmt::format("tensor '{}' has integer dtype {}, expected a float tensor",
                                t.name, dtype_name(t.dtype)));
    }
  }
  return out;
}

}  // namespace

const char* dtype_name(DType d) {
  for (const auto& i : kDTypes)
    if (i.d == d) return i.name;
  return "?";
}

int dtype_size(DType d) {
  for (const auto& i : kDTypes)
    if (i.d == d) return i.size;
  return 0;
}

Index Tensor::numel() const {
  Index n = 1;
  for (Index d : shape) n *= d;
  return n;
}

std::vector<float> Tensor::to_f32() const { return convert<float>(*this); }
std::vector<double> Tensor::to_f64() const { return convert<double>(*this); }

const Tensor* SafeTensors::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const Tensor& SafeTensors::at(const std::string& name) const {
  const Tensor* t = find(name);
  if (!t) throw Error(fmt::format("safetensors file has no tensor '{}'", name));
  return *t;
}

void SafeTensors::add_f32(const std::string& name, std::vector<Index> shape, const float* values) {
  Tensor t;
  t.name = name;
  t.dtype = DType::F32;
  t.shape = std::move(shape);
  t.data.resize(size_t(t.numel()) * 4);
  if (!t.data.empty()) std::memcpy(t.data.data(), values, t.data.size());
  add(std::move(t));
}

void SafeTensors::add(Tensor t) {
  VIT_CHECK(!find(t.name), fmt::format("duplicate tensor '{}'", t.name));
  VIT_CHECK(Index(t.data.size()) == t.numel() * dtype_size(t.dtype),
            fmt::format("tensor '{}': data size does not match shape", t.name));
  tensors.push_back(std::move(t));
}

SafeTensors read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  auto bad = [&](const std::string& why) {
    return Error(fmt::format("'{}' is not a valid safetensors file: {}", path, why));
  };
  if (bytes.size() < 8) throw bad("shorter than its 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeader) throw bad(fmt::format("header length {} exceeds the 100 MB limit", n));
  if (8 + n > bytes.size()) throw bad("truncated (header runs past the end of the file)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(n));
  } catch (const nlohmann::json::exception& e) {
    throw bad(fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  SafeTensors st;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw bad(fmt::format("__metadata__ value of '{}' is not a string", m.key()));
        st.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      throw bad(fmt::format("entry '{}' needs dtype, shape and data_offsets", key));
    Tensor t;
    t.name = key;
    const auto& dt = v["dtype"];
    bool known = false;
    if (dt.is_string())
      for (const auto& i : kDTypes)
        if (dt.get<std::string>() == i.name) {
          t.dtype = i.d;
          known = true;
        }
    if (!known) throw bad(fmt::format("tensor '{}' has unsupported dtype {}", key, dt.dump()));
    if (!v["shape"].is_array()) throw bad(fmt::format("tensor '{}': shape is not a list", key));
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad(fmt::format("tensor '{}': bad dimension", key));
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t(1) << 48) / dim)
        throw bad(fmt::format("tensor '{}': shape too large", key));
      numel *= dim;
      t.shape.push_back(Index(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      throw bad(fmt::format("tensor '{}': data_offsets must be two non-negative integers", key));
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (e < b || e > data_size)
      throw bad(fmt::format("tensor '{}': data_offsets [{}, {}] outside the {}-byte buffer", key,
                            b, e, data_size));
    if (e - b != numel * uint64_t(dtype_size(t.dtype)))
      throw bad(fmt::format("tensor '{}': {} bytes for shape of {} elements", key, e - b, numel));
    t.data.assign(bytes.begin() + long(8 + n + b), bytes.begin() + long(8 + n + e));
    spans.push_back({b, e, key});
    st.tensors.push_back(std::move(t));
  }
  // The tensors must tile the data buffer exactly: no holes, no overlaps, nothing left over.
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t pos = 0;
  for (const auto& s : spans) {
    if (s.begin != pos)
      throw bad(fmt::format("tensor '{}' starts at {} but the previous one ends at {} ({})",
                            s.name, s.begin, pos, s.begin < pos ? "overlap" : "hole"));
    pos = s.end;
  }
  if (pos != data_size)
    throw bad(fmt::format("{} bytes after the last tensor (expected exactly {})",
                          data_size - pos, pos));
  return st;
}

void write_safetensors(const std::string& path, const SafeTensors& st) {
  std::vector<const Tensor*> order;
  for (const auto& t : st.tensors) order.push_back(&t);
  // The reference writer's order: larger dtype alignment first, then by name.
  std::sort(order.begin(), order.end(), [](const Tensor* a, const Tensor* b) {
    const int sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  nlohmann::ordered_json header;
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : st.metadata) meta[k] = v;
  header["__metadata__"] = meta;
  uint64_t off = 0;
  for (const Tensor* t : order) {
    header[t->name] = {{"dtype", dtype_name(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {off, off + t->data.size()}}};
    off += t->data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + off);
  const uint64_t n = text.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += text;
  for (const Tensor* t : order) out.append(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  write_file_atomic(path, out);
}

}  // namespace vit::io
