#include "io/idx.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace vit::io {

namespace {

constexpr uint64_t kMaxBytes = uint64_t(1) << 34;  // 16 GiB: far above any IDX data set

// A file read through zlib, which gunzips .gz data and passes plain files through unchanged.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    f_ = gzopen(path.c_str(), "rb");
    if (!f_)
      throw Error(fmt::format("cannot read '{}': {}", path,
                              errno ? std::strerror(errno) : "out of memory"));
  }
  ~GzReader() {
    if (f_) gzclose(f_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes; fewer only at the end of the data. Throws on corrupt gzip data.
  size_t read(uint8_t* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = unsigned(std::min<size_t>(n - done, INT_MAX / 2));
      const int got = gzread(f_, dst + done, chunk);
      if (got < 0) throw corrupt();
      if (got == 0) break;
      done += size_t(got);
    }
    return done;
  }

  // Closes the stream; a gzip stream cut short (missing data or trailer) is reported here.
  void finish() {
    const int rc = gzclose(f_);
    f_ = nullptr;
    if (rc != Z_OK)
      throw Error(fmt::format("'{}' is truncated or corrupt (bad gzip stream)", path_));
  }

 private:
  Error corrupt() const {
    int err = 0;
    const char* msg = gzerror(f_, &err);
    return Error(fmt::format(
        "cannot read '{}': {}", path_,
        err == Z_ERRNO ? std::strerror(errno) : fmt::format("corrupt gzip data ({})", msg)));
  }
  std::string path_;
  gzFile f_ = nullptr;
};

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzReader in(path);
  uint8_t magic[4];
  if (in.read(magic, 4) < 4 || magic[0] != 0 || magic[1] != 0)
    throw Error(
        fmt::format("'{}' is not an IDX file (bad magic: it must start with 0x00 0x00)", path));
  if (magic[2] != 0x08)
    throw Error(
        fmt::format("'{}': IDX data type 0x{:02x} is not supported (only 0x08, unsigned bytes)",
                    path, magic[2]));
  const int ndims = magic[3];
  if (ndims < 1 || ndims > 4)
    throw Error(fmt::format("'{}': IDX with {} dimensions is not supported (1 to 4)", path, ndims));

  uint8_t raw[16];
  if (in.read(raw, size_t(4 * ndims)) < size_t(4 * ndims))
    throw Error(fmt::format("'{}' is truncated (inside the dimension header)", path));
  IdxArray a;
  bool has_zero = false;
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* p = raw + 4 * i;
    const uint64_t d =
        (uint64_t(p[0]) << 24) | (uint64_t(p[1]) << 16) | (uint64_t(p[2]) << 8) | uint64_t(p[3]);
    has_zero |= d == 0;
    a.dims.push_back(Index(d));
  }
  // The size check happens before any allocation, and without overflow (each dim < 2^32).
  uint64_t total = has_zero ? 0 : 1;
  for (Index d : a.dims) {
    if (!has_zero && total > kMaxBytes / uint64_t(d))
      throw Error(fmt::format("'{}': IDX dimensions are too large (over 16 GiB of data)", path));
    total *= uint64_t(d);
  }

  // Grow with the data actually present, so a lying header cannot force a huge allocation:
  // chunks start at 64 KiB and double up to 16 MiB (a tiny file costs no 16 MiB buffer).
  constexpr size_t kFirstChunk = size_t(1) << 16, kMaxChunk = size_t(1) << 24;
  size_t have = 0;
  while (have < total) {
    const size_t chunk = std::min(kMaxChunk, std::max(kFirstChunk, have));
    const size_t want = std::min<uint64_t>(chunk, total - have);
    a.data.resize(have + want);
    const size_t got = in.read(a.data.data() + have, want);
    have += got;
    if (got < want)
      throw Error(fmt::format("'{}' is truncated: {} data bytes, the header promises {}", path,
                              have, total));
  }
  uint8_t extra[1];
  if (in.read(extra, 1) != 0)
    throw Error(fmt::format("'{}' has extra bytes after its {} data bytes", path, total));
  in.finish();
  return a;
}

IdxDataset read_idx_pair(const std::string& images_path, const std::string& labels_path) {
  IdxArray im = read_idx(images_path);
  IdxArray lb = read_idx(labels_path);
  if (im.dims.size() != 3)
    throw Error(fmt::format("'{}': expected images of shape (n, rows, cols), got {} dimensions",
                            images_path, im.dims.size()));
  if (lb.dims.size() != 1)
    throw Error(fmt::format("'{}': expected labels of shape (n), got {} dimensions", labels_path,
                            lb.dims.size()));
  if (im.dims[0] != lb.dims[0])
    throw Error(fmt::format("count mismatch: '{}' has {} images but '{}' has {} labels",
                            images_path, im.dims[0], labels_path, lb.dims[0]));
  IdxDataset d;
  d.n = im.dims[0];
  d.rows = im.dims[1];
  d.cols = im.dims[2];
  d.images = std::move(im.data);
  d.labels = std::move(lb.data);
  return d;
}

}  // namespace vit::io
