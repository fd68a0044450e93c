#include "data/packed.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/common.h"
#include "core/fatal_signal.h"
#include "core/warning.h"
#include "data/decode.h"
#include "data/stage_clock.h"

namespace vit::data {

namespace {

constexpr char kMagic[8] = {'V', 'I', 'T', 'P', 'A', 'C', 'K', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kEntryBytes = 24;
constexpr uint64_t kAlign = 4096;
constexpr uint32_t kMaxClasses = 1u << 24;

void put_u16(std::vector<uint8_t>& b, uint16_t v) {
  for (int i = 0; i < 2; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
uint16_t get_u16(const uint8_t* p) {
  return uint16_t(p[0] | (p[1] << 8));
}
uint32_t get_u32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
uint64_t get_u64(const uint8_t* p) {
  return uint64_t(get_u32(p)) | (uint64_t(get_u32(p + 4)) << 32);
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

// Temp file that removes itself unless committed.
struct TempFile {
  std::string path;
  FILE* f = nullptr;
  bool committed = false;
  ~TempFile() {
    if (f) std::fclose(f);
    if (!committed && !path.empty()) std::remove(path.c_str());
  }
};

void write_all(TempFile& t, const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, t.f) != n)
    throw Error(fmt::format("{}: write failed: {}", t.path, std::strerror(errno)));
}

struct Sample {
  bool ok = false;
  std::string err;
  std::vector<uint8_t> bytes;
  int h = 0, w = 0, c = 0;
};

Sample prepare(const std::string& file, int max_side, bool jpeg, int quality) {
  Sample s;
  try {
    // A short-side hint of max_side guarantees the DCT-scaled image still has its longer side
    // >= max_side, so the final resize is always a true downscale from at least that size.
    Image img = decode_image_file(file, max_side > 0 ? max_side : 0);
    img = resize_max_side(img, max_side);
    if (img.h > 65535 || img.w > 65535)
      throw Error(fmt::format("{}: image {}x{} too large for the packed format (use max_side)",
                              file, img.w, img.h));
    s.h = img.h;
    s.w = img.w;
    s.c = img.c;
    if (jpeg) {
      s.bytes = encode_jpeg(img, quality);
    } else {
      s.bytes = std::move(img.px);
    }
    if (s.bytes.size() > UINT32_MAX) throw Error(fmt::format("{}: sample too large", file));
    s.ok = true;
  } catch (const std::exception& e) {
    s.err = e.what();
    if (s.err.rfind(file, 0) != 0) s.err = file + ": " + s.err;  // always names the file
  }
  return s;
}

void fsync_dir_of(const std::string& path) {
  // (Not `dir = "."` on an empty one: GCC 12 warns of a false overlap in that assignment.)
  const std::string parent = std::filesystem::path(path).parent_path().string();
  const std::string dir = parent.empty() ? std::string(".") : parent;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

PackStats write_packed(const std::string& out_path, const FolderIndex& idx, int max_side, bool jpeg,
                       int quality, int threads) {
  VIT_CHECK(idx.files.size() == idx.labels.size(),
            fmt::format("{}: folder index has {} files but {} labels", out_path, idx.files.size(),
                        idx.labels.size()));
  VIT_CHECK(!idx.classes.empty() && idx.classes.size() <= kMaxClasses,
            fmt::format("{}: bad class count {}", out_path, idx.classes.size()));
  VIT_CHECK(max_side <= 65535, fmt::format("{}: max_side {} exceeds 65535", out_path, max_side));
  VIT_CHECK(!jpeg || (quality >= 1 && quality <= 100),
            fmt::format("{}: JPEG quality {} outside 1..100", out_path, quality));
  for (size_t i = 0; i < idx.labels.size(); ++i)
    VIT_CHECK(idx.labels[i] >= 0 && size_t(idx.labels[i]) < idx.classes.size(),
              fmt::format("{}: label {} of {} outside 0..{}", out_path, idx.labels[i], idx.files[i],
                          idx.classes.size() - 1));
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));

  std::vector<uint8_t> names;
  for (const std::string& n : idx.classes) {
    put_u32(names, uint32_t(n.size()));
    names.insert(names.end(), n.begin(), n.end());
  }
  const uint64_t data_offset = align_up(kHeaderBytes + names.size(), kAlign);

  TempFile tmp;
  tmp.path = fmt::format("{}.tmp.{}", out_path, ::getpid());
  tmp.f = std::fopen(tmp.path.c_str(), "wb");
  if (!tmp.f)
    throw Error(fmt::format("{}: cannot create packed file: {}", tmp.path, std::strerror(errno)));
  std::vector<uint8_t> zeros(data_offset - kHeaderBytes - names.size(), 0);
  std::vector<uint8_t> header(kHeaderBytes, 0);  // placeholder, rewritten at the end
  write_all(tmp, header.data(), header.size());
  write_all(tmp, names.data(), names.size());
  write_all(tmp, zeros.data(), zeros.size());

  PackStats st;
  std::vector<uint8_t> table;
  table.reserve(idx.files.size() * kEntryBytes);
  uint64_t blob = 0;
  const size_t n = idx.files.size();
  const size_t batch = std::max<size_t>(64, size_t(threads) * 16);
  std::vector<Sample> results;
  size_t next_report = n / 10;
  for (size_t b0 = 0; b0 < n; b0 += batch) {
    const size_t b1 = std::min(n, b0 + batch);
    results.assign(b1 - b0, Sample{});
    std::atomic<size_t> next{b0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < b1;)
        results[i - b0] = prepare(idx.files[i], max_side, jpeg, quality);
    };
    const int nt = int(std::min<size_t>(size_t(threads), b1 - b0));
    std::vector<std::thread> pool;
    for (int t = 1; t < nt; ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();

    for (size_t i = b0; i < b1; ++i) {
      Sample& s = results[i - b0];
      if (!s.ok) {
        ++st.skipped;
        warn("skipping undecodable image " + s.err);
        continue;
      }
      write_all(tmp, s.bytes.data(), s.bytes.size());
      put_u64(table, blob);
      put_u32(table, uint32_t(s.bytes.size()));
      put_u32(table, uint32_t(idx.labels[i]));
      put_u16(table, uint16_t(s.h));
      put_u16(table, uint16_t(s.w));
      table.push_back(uint8_t(s.c));
      table.push_back(jpeg ? 1 : 0);
      table.push_back(0);
      table.push_back(0);
      blob += s.bytes.size();
      ++st.written;
      s.bytes = {};
    }
    if (n >= 1000 && b1 >= next_report && b1 < n) {
      std::fprintf(stderr, "packing %s: %zu/%zu images\n", out_path.c_str(), b1, n);
      next_report += n / 10;
    }
  }
  if (st.written == 0)
    throw Error(fmt::format("{}: none of the {} source images could be decoded", out_path, n));

  const uint64_t index_offset = data_offset + blob;
  write_all(tmp, table.data(), table.size());
  header.clear();
  header.insert(header.end(), kMagic, kMagic + 8);
  put_u32(header, kVersion);
  put_u32(header, jpeg ? 1 : 0);
  put_u64(header, st.written);
  put_u32(header, uint32_t(idx.classes.size()));
  put_u32(header, uint32_t(std::max(0, max_side)));
  put_u64(header, names.size());
  put_u64(header, data_offset);
  put_u64(header, index_offset);
  put_u32(header, jpeg ? uint32_t(quality) : 0);
  put_u32(header, 0);
  if (std::fseek(tmp.f, 0, SEEK_SET) != 0)
    throw Error(fmt::format("{}: seek failed: {}", tmp.path, std::strerror(errno)));
  write_all(tmp, header.data(), header.size());
  if (std::fflush(tmp.f) != 0 || ::fsync(::fileno(tmp.f)) != 0)
    throw Error(fmt::format("{}: flush failed: {}", tmp.path, std::strerror(errno)));
  const int rc = std::fclose(tmp.f);
  tmp.f = nullptr;
  if (rc != 0) throw Error(fmt::format("{}: close failed: {}", tmp.path, std::strerror(errno)));
  if (std::rename(tmp.path.c_str(), out_path.c_str()) != 0)
    throw Error(fmt::format("{}: cannot rename {} into place: {}", out_path, tmp.path,
                            std::strerror(errno)));
  tmp.committed = true;
  fsync_dir_of(out_path);
  st.bytes = index_offset + table.size();
  std::fprintf(stderr, "packed %s: %zu images written, %zu skipped (undecodable), %.1f MiB\n",
               out_path.c_str(), st.written, st.skipped, double(st.bytes) / (1 << 20));
  return st;
}

// ---------------------------------------------------------------------------------------------

PackedReader::~PackedReader() {
  close();
}

PackedReader::PackedReader(PackedReader&& o) noexcept {
  *this = std::move(o);
}

PackedReader& PackedReader::operator=(PackedReader&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    base_ = o.base_;
    file_size_ = o.file_size_;
    data_offset_ = o.data_offset_;
    format_ = o.format_;
    max_side_ = o.max_side_;
    classes_ = std::move(o.classes_);
    entries_ = std::move(o.entries_);
    o.base_ = nullptr;
    o.file_size_ = 0;
  }
  return *this;
}

void PackedReader::close() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), file_size_);
  base_ = nullptr;
  file_size_ = 0;
  classes_.clear();
  entries_.clear();
}

const PackedEntry& PackedReader::entry(size_t i) const {
  if (i >= entries_.size())
    throw Error(fmt::format("{}: sample {} out of range (file has {})", path_, i, entries_.size()));
  return entries_[i];
}

std::vector<int32_t> PackedReader::labels() const {
  std::vector<int32_t> out(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) out[i] = entries_[i].label;
  return out;
}

void PackedReader::open(const std::string& path) {
  close();
  path_ = path;
  auto fail = [&](const std::string& why) -> Error {
    return Error(fmt::format("{}: not a valid packed image file: {}", path, why));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("{}: cannot open packed file: {}", path, std::strerror(errno)));
  struct stat sb;
  if (::fstat(fd, &sb) != 0) {
    ::close(fd);
    throw Error(fmt::format("{}: cannot stat packed file: {}", path, std::strerror(errno)));
  }
  const uint64_t size = uint64_t(sb.st_size);
  if (size < kHeaderBytes) {
    ::close(fd);
    throw fail(fmt::format("{} bytes, shorter than the {}-byte header", size, kHeaderBytes));
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw Error(fmt::format("{}: mmap failed: {}", path, std::strerror(errno)));
  note_mapped_file(path);  // named if the file is truncated under us (SIGBUS)
  base_ = static_cast<const uint8_t*>(m);
  file_size_ = size;
  try {
    const uint8_t* h = base_;
    if (std::memcmp(h, kMagic, 8) != 0) throw fail("bad magic (expected VITPACK1)");
    const uint32_t version = get_u32(h + 8);
    if (version != kVersion) throw fail(fmt::format("unsupported version {}", version));
    format_ = get_u32(h + 12);
    if (format_ > 1) throw fail(fmt::format("unknown format flag {}", format_));
    const uint64_t count = get_u64(h + 16);
    const uint32_t num_classes = get_u32(h + 24);
    max_side_ = get_u32(h + 28);
    const uint64_t names_bytes = get_u64(h + 32);
    data_offset_ = get_u64(h + 40);
    const uint64_t index_offset = get_u64(h + 48);
    if (num_classes == 0 || num_classes > kMaxClasses)
      throw fail(fmt::format("bad class count {}", num_classes));
    if (names_bytes > size - kHeaderBytes) throw fail("class-name section runs past the end");
    // Each name takes at least its 4-byte length: checked before reserving num_classes strings.
    if (uint64_t(num_classes) * 4 > names_bytes)
      throw fail(fmt::format("{} classes need at least {} bytes of names, the section has {}",
                             num_classes, uint64_t(num_classes) * 4, names_bytes));
    if (data_offset_ < kHeaderBytes + names_bytes || data_offset_ > index_offset ||
        index_offset > size)
      throw fail("section offsets out of order or past the end (truncated?)");
    if (count > (size - index_offset) / kEntryBytes || index_offset + count * kEntryBytes != size)
      throw fail(
          fmt::format("{} samples need {} index bytes at offset {} but the file is {} bytes "
                      "(truncated?)",
                      count, count * kEntryBytes, index_offset, size));
    // Class names.
    const uint8_t* p = h + kHeaderBytes;
    const uint8_t* pend = p + names_bytes;
    classes_.reserve(num_classes);
    for (uint32_t k = 0; k < num_classes; ++k) {
      if (pend - p < 4) throw fail("class-name section too short");
      const uint32_t len = get_u32(p);
      p += 4;
      if (uint64_t(pend - p) < len) throw fail("class name runs past its section");
      classes_.emplace_back(reinterpret_cast<const char*>(p), len);
      p += len;
    }
    if (p != pend) throw fail("class-name section has trailing bytes");
    // Index entries.
    const uint64_t blob = index_offset - data_offset_;
    entries_.resize(count);
    const uint8_t* e = base_ + index_offset;
    for (uint64_t i = 0; i < count; ++i, e += kEntryBytes) {
      PackedEntry& x = entries_[i];
      x.offset = get_u64(e);
      x.size = get_u32(e + 8);
      x.label = int32_t(get_u32(e + 12));
      x.h = get_u16(e + 16);
      x.w = get_u16(e + 18);
      x.c = e[20];
      x.mode = e[21];
      if (x.offset > blob || x.size > blob - x.offset)
        throw fail(fmt::format("sample {} data [{}, +{}) outside the {}-byte data blob", i,
                               x.offset, x.size, blob));
      if (x.label < 0 || uint32_t(x.label) >= num_classes)
        throw fail(fmt::format("sample {} label {} outside 0..{}", i, x.label, num_classes - 1));
      if (x.h == 0 || x.w == 0 || (x.c != 1 && x.c != 3) || x.mode > 1)
        throw fail(fmt::format("sample {} has bad shape/mode ({}x{}x{}, mode {})", i, x.h, x.w, x.c,
                               x.mode));
      if (x.mode == 0 && uint64_t(x.size) != uint64_t(x.h) * x.w * x.c)
        throw fail(fmt::format("sample {} raw size {} != {}x{}x{}", i, x.size, x.h, x.w, x.c));
      if (x.mode == 1 && x.size < 4) throw fail(fmt::format("sample {} JPEG is empty", i));
    }
  } catch (...) {
    close();
    throw;
  }
}

Image PackedReader::decode(size_t i, int min_side_hint) const {
  return decode_region(i, min_side_hint, nullptr);
}

Image PackedReader::decode_region(size_t i, int min_side_hint, const RegionPicker& pick) const {
  StageScope clock(Stage::Decode);  // memory-mapped: the page reads happen in here too
  const PackedEntry& e = entry(i);
  const uint8_t* src = data(i);
  if (e.mode == 0) {  // raw: only the region's rows and columns are read from the mapping
    const Rect r = pick ? pick(e.h, e.w) : Rect{0, 0, e.h, e.w};
    VIT_CHECK(region_inside(r, e.h, e.w),
              fmt::format("{}: sample {}: {}", path_, i, region_error(r, e.h, e.w)));
    Image img(r.height, r.width, 3);
    for (int y = 0; y < r.height; ++y) {
      const uint8_t* row = src + (size_t(r.top + y) * e.w + r.left) * e.c;
      uint8_t* out = img.at(y, 0);
      if (e.c == 3) {
        std::memcpy(out, row, size_t(r.width) * 3);
      } else {
        for (int x = 0; x < r.width; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = row[x];
      }
    }
    return img;
  }
  try {
    return decode_image_region(src, e.size, min_side_hint, pick);
  } catch (const Error& err) {
    throw Error(fmt::format("{}: sample {}: {}", path_, i, err.what()));
  }
}

}  // namespace vit::data
