#include "io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_file.h"

namespace vit::io {

static_assert(std::endian::native == std::endian::little, "vitrain assumes a little-endian host");

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;
// Element counts above this are rejected before multiplying, so byte sizes never overflow.
constexpr uint64_t kMaxNumel = uint64_t(1) << 56;

struct DTypeInfo {
  DType d;
  const char* name;
  int size;
};
constexpr DTypeInfo kDTypes[] = {{DType::F32, "F32", 4},   {DType::F64, "F64", 8},
                                 {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2},
                                 {DType::I64, "I64", 8},   {DType::I32, "I32", 4},
                                 {DType::U8, "U8", 1}};

// IEEE binary16 -> binary32, exact (every half value is representable as a float).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, or NaN keeping its payload
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);  // rebias 15 -> 127
  } else if (man == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal (man * 2^-24): shift the leading 1 up to the implicit-bit position.
    uint32_t e = 113;
    while (!(man & 0x400)) {
      man <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((man & 0x3ff) << 13);
  }
  return std::bit_cast<float>(bits);
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename Out>
std::vector<Out> convert(const Tensor& t) {
  const Index n = t.numel();
  if (t.data.size() != uint64_t(n) * dtype_size(t.dtype))
    throw Error(
        fmt::format("tensor '{}': {} data bytes do not match its shape", t.name, t.data.size()));
  std::vector<Out> out(n);
  const uint8_t* p = t.data.data();
  switch (t.dtype) {
    case DType::F32:
      for (Index i = 0; i < n; ++i) out[i] = Out(load<float>(p + 4 * i));
      break;
    case DType::F64:
      for (Index i = 0; i < n; ++i) out[i] = Out(load<double>(p + 8 * i));
      break;
    case DType::BF16:  // the upper half of a float32
      for (Index i = 0; i < n; ++i)
        out[i] = Out(std::bit_cast<float>(uint32_t(load<uint16_t>(p + 2 * i)) << 16));
      break;
    case DType::F16:
      for (Index i = 0; i < n; ++i) out[i] = Out(half_to_float(load<uint16_t>(p + 2 * i)));
      break;
    default:
      throw Error(fmt::format("tensor '{}' has integer dtype {}, expected a float tensor", t.name,
                              dtype_name(t.dtype)));
  }
  return out;
}

// Read-only file descriptor that reads exact byte ranges.
class InFile {
 public:
  explicit InFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || S_ISDIR(st.st_mode)) {
      const int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
      ::close(fd_);
      throw Error(fmt::format("cannot read '{}': {}", path, std::strerror(err)));
    }
    size_ = uint64_t(st.st_size);
  }
  ~InFile() { ::close(fd_); }
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;

  uint64_t size() const { return size_; }
  void read(uint64_t offset, void* dst, size_t n) const {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw Error(fmt::format("cannot read '{}': {}", path_,
                                got < 0 ? std::strerror(errno) : "file shrank while reading"));
      p += got;
      offset += uint64_t(got);
      n -= size_t(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Parses JSON, reporting the first duplicate key in any object (nlohmann keeps the last one).
nlohmann::json parse_json_no_duplicates(const std::string& text, std::string* duplicate) {
  std::vector<std::set<std::string>> open_objects;
  auto cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {
      open_objects.emplace_back();
    } else if (ev == E::object_end) {
      open_objects.pop_back();
    } else if (ev == E::key && !open_objects.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(k).second && duplicate->empty()) *duplicate = k;
    }
    return true;
  };
  return nlohmann::json::parse(text, cb);
}

struct Entry {
  Tensor tensor;
  uint64_t begin = 0, end = 0;
};

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

std::vector<float> Tensor::to_f32() const {
  return convert<float>(*this);
}
std::vector<double> Tensor::to_f64() const {
  return convert<double>(*this);
}

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
  for (Index d : t.shape)
    VIT_CHECK(d >= 0, fmt::format("tensor '{}': negative dimension {}", name, d));
  t.data.resize(size_t(t.numel()) * 4);
  if (!t.data.empty()) std::memcpy(t.data.data(), values, t.data.size());
  add(std::move(t));
}

void SafeTensors::add(Tensor t) {
  VIT_CHECK(t.name != "__metadata__", "'__metadata__' is reserved and cannot name a tensor");
  VIT_CHECK(!find(t.name), fmt::format("duplicate tensor '{}'", t.name));
  for (Index d : t.shape)
    VIT_CHECK(d >= 0, fmt::format("tensor '{}': negative dimension {}", t.name, d));
  VIT_CHECK(
      t.data.size() == uint64_t(t.numel()) * dtype_size(t.dtype),
      fmt::format("tensor '{}': {} data bytes do not match its shape", t.name, t.data.size()));
  tensors.push_back(std::move(t));
}

SafeTensors read_safetensors(const std::string& path) {
  const InFile file(path);
  auto bad = [&](const std::string& why) {
    return Error(fmt::format("'{}' is not a valid safetensors file: {}", path, why));
  };
  if (file.size() < 8) throw bad("shorter than its 8-byte header length");
  uint64_t n = 0;
  file.read(0, &n, 8);
  if (n > kMaxHeader) throw bad(fmt::format("header length {} exceeds the 100 MB limit", n));
  if (8 + n > file.size())
    throw bad(
        fmt::format("truncated: header of {} bytes but the file has only {}", n, file.size()));
  std::string text(n, '\0');
  file.read(8, text.data(), n);

  // nlohmann stops at a NUL byte as if the input ended there; JSON never contains a raw one.
  if (text.find('\0') != std::string::npos)
    throw bad("header is not valid JSON (it contains a NUL byte)");
  nlohmann::json header;
  std::string duplicate;
  try {
    header = parse_json_no_duplicates(text, &duplicate);
  } catch (const nlohmann::json::exception& e) {
    throw bad(fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!duplicate.empty()) throw bad(fmt::format("duplicate key '{}' in the header", duplicate));
  if (!header.is_object()) throw bad("header is not a JSON object");

  const uint64_t data_size = file.size() - 8 - n;
  SafeTensors st;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object of strings");
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
    Entry e;
    Tensor& t = e.tensor;
    t.name = key;
    const auto& dt = v["dtype"];
    const DTypeInfo* info = nullptr;
    if (dt.is_string())
      for (const auto& i : kDTypes)
        if (dt.get_ref<const std::string&>() == i.name) info = &i;
    if (!info)
      throw bad(
          fmt::format("tensor '{}' has unsupported dtype {} (supported: F32, F64, BF16, "
                      "F16, I64, I32, U8)",
                      key, dt.dump()));
    t.dtype = info->d;

    const auto& shape = v["shape"];
    if (!shape.is_array()) throw bad(fmt::format("tensor '{}': shape is not a list", key));
    // The product of the non-zero dimensions is bounded even when a zero makes the tensor
    // empty: every later numel() (an Index product) must not overflow, whatever the order.
    bool has_zero = false;
    uint64_t nonzero_numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned())
        throw bad(fmt::format("tensor '{}': shape entry {} is not a non-negative integer", key,
                              d.dump()));
      const uint64_t dim = d.get<uint64_t>();
      has_zero |= dim == 0;
      if (dim != 0 && nonzero_numel > kMaxNumel / dim)
        throw bad(fmt::format("tensor '{}': shape {} is too large", key, shape.dump()));
      if (dim != 0) nonzero_numel *= dim;
      t.shape.push_back(Index(dim));
    }
    const uint64_t numel = has_zero ? 0 : nonzero_numel;

    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      throw bad(
          fmt::format("tensor '{}': data_offsets must be [begin, end] non-negative integers", key));
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.end < e.begin || e.end > data_size)
      throw bad(fmt::format("tensor '{}': data_offsets [{}, {}] outside the {}-byte data buffer",
                            key, e.begin, e.end, data_size));
    const uint64_t want = numel * uint64_t(info->size);
    if (e.end - e.begin != want)
      throw bad(fmt::format("tensor '{}': data_offsets span {} bytes but {} {} elements need {}",
                            key, e.end - e.begin, numel, info->name, want));
    entries.push_back(std::move(e));
  }

  // Sorted by offset, the tensors must tile the data buffer exactly: no holes, no overlaps, and
  // nothing left over at the end.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  for (const Entry* e : by_offset) {
    if (e->begin != pos)
      throw bad(fmt::format("tensor '{}' starts at byte {} but the data before it ends at {} ({})",
                            e->tensor.name, e->begin, pos, e->begin < pos ? "overlap" : "hole"));
    pos = e->end;
  }
  if (pos != data_size)
    throw bad(
        fmt::format("file size mismatch: tensors end at data byte {} but the data buffer "
                    "has {} bytes",
                    pos, data_size));

  // Only now, with every size checked against the file, allocate and read the tensors.
  for (auto& e : entries) {
    e.tensor.data.resize(e.end - e.begin);
    file.read(8 + n + e.begin, e.tensor.data.data(), e.tensor.data.size());
    st.tensors.push_back(std::move(e.tensor));
  }
  return st;
}

void write_safetensors(const std::string& path, const SafeTensors& st) {
  std::vector<const Tensor*> order;
  std::set<std::string> names;
  for (const auto& t : st.tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      throw Error(fmt::format("cannot write '{}': tensor name '{}' is duplicate or reserved", path,
                              t.name));
    for (Index d : t.shape)
      if (d < 0)
        throw Error(
            fmt::format("cannot write '{}': tensor '{}' has a negative dimension", path, t.name));
    if (t.data.size() != uint64_t(t.numel()) * dtype_size(t.dtype))
      throw Error(fmt::format("cannot write '{}': tensor '{}' has {} data bytes for its shape",
                              path, t.name, t.data.size()));
    order.push_back(&t);
  }
  // The reference writer's order: larger dtype size (alignment) first, then by name.
  std::sort(order.begin(), order.end(), [](const Tensor* a, const Tensor* b) {
    const int sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : st.metadata) meta[k] = v;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = std::move(meta);
  uint64_t off = 0;
  for (const Tensor* t : order) {
    header[t->name] = {{"dtype", dtype_name(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {off, off + t->data.size()}}};
    off += t->data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
    throw Error(fmt::format("cannot write '{}': {}", path, e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data buffer 8-byte aligned

  std::string out;
  out.reserve(8 + text.size() + off);
  const uint64_t n = text.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += text;
  for (const Tensor* t : order)
    out.append(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  write_file_atomic(path, out);
}

}  // namespace vit::io
