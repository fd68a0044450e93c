#include "io/idx.h"

#include <fmt/format.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

namespace vit::io {

namespace {

// Whole file, gunzipped when it is gzip data (zlib reads plain files transparently too).
std::vector<uint8_t> read_maybe_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw Error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  constexpr size_t kMax = size_t(1) << 34;
  while (true) {
    const int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      throw Error(fmt::format("'{}' is corrupt: {}", path, msg));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (out.size() > kMax) {
      gzclose(f);
      throw Error(fmt::format("'{}' is larger than 16 GiB", path));
    }
  }
  // gzread returns 0 at a truncated gzip stream too; gzclose_r reports it as Z_BUF_ERROR.
  const int rc = gzclose(f);
  if (rc != Z_OK) throw Error(fmt::format("'{}' is truncated or corrupt (gzip stream)", path));
  return out;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  const std::vector<uint8_t> b = read_maybe_gz(path);
  if (b.size() < 4 || b[0] != 0 || b[1] != 0)
    throw Error(fmt::format("'{}' is not an IDX file (bad magic)", path));
  if (b[2] != 0x08)
    throw Error(fmt::format("'{}': IDX data type 0x{:02x} is not supported (only unsigned bytes)",
                            path, b[2]));
  const int ndims = b[3];
  if (ndims < 1 || ndims > 4)
    throw Error(fmt::format("'{}': IDX with {} dimensions is not supported", path, ndims));
  if (b.size() < size_t(4 + 4 * ndims))
    throw Error(fmt::format("'{}' is truncated (header)", path));
  IdxArray a;
  uint64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* p = b.data() + 4 + 4 * i;
    const uint64_t d = (uint64_t(p[0]) << 24) | (uint64_t(p[1]) << 16) | (uint64_t(p[2]) << 8) | p[3];
    total *= d;
    if (total > (uint64_t(1) << 34)) throw Error(fmt::format("'{}': dimensions too large", path));
    a.dims.push_back(Index(d));
  }
  const size_t payload = b.size() - 4 - 4 * ndims;
  if (payload < total)
    throw Error(fmt::format("'{}' is truncated: {} data bytes, the header promises {}", path,
                            payload, total));
  if (payload > total)
    throw Error(fmt::format("'{}' has {} bytes after its data", path, payload - total));
  a.data.assign(b.begin() + 4 + 4 * ndims, b.end());
  return a;
}

IdxDataset read_idx_pair(const std::string& images_path, const std::string& labels_path) {
  IdxArray im = read_idx(images_path);
  IdxArray lb = read_idx(labels_path);
  if (im.dims.size() != 3)
    throw Error(fmt::format("'{}': expected images of shape (n, rows, cols)", images_path));
  if (lb.dims.size() != 1)
    throw Error(fmt::format("'{}': expected labels of shape (n)", labels_path));
  if (im.dims[0] != lb.dims[0])
    throw Error(fmt::format("'{}' has {} images but '{}' has {} labels", images_path, im.dims[0],
                            labels_path, lb.dims[0]));
  IdxDataset d;
  d.n = im.dims[0];
  d.rows = im.dims[1];
  d.cols = im.dims[2];
  d.images = std::move(im.data);
  d.labels = std::move(lb.data);
  return d;
}

}  // namespace vit::io
