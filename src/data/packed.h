// Packed image file ("prep" output, FFCV-like): every image decoded once, downscaled so its
// longer side is <= max_side, stored raw (HWC uint8) or re-encoded as JPEG, in one mmap-able file.
//
// File layout, all integers little-endian:
//   offset 0   char[8]  magic "VITPACK1"
//          8   u32      version (1)
//         12   u32      format: 0 = raw, 1 = jpeg (what the writer chose; each entry has a mode)
//         16   u64      count (stored samples)
//         24   u32      num_classes
//         28   u32      max_side (0 = images kept at their size)
//         32   u64      names_bytes: size of the class-name section starting at offset 64
//         40   u64      data_offset: start of the data blob (4096-aligned)
//         48   u64      index_offset: start of the index table (= data_offset + blob size)
//         56   u32      jpeg quality (0 for raw)
//         60   u32      reserved (0)
//   64: class names, num_classes x {u32 length, bytes}      (names_bytes in all)
//   zero padding up to data_offset
//   data blob: the samples back to back
//   index table at index_offset: count x 24-byte entries
//          {u64 offset (from data_offset), u32 size, i32 label, u16 h, u16 w, u8 c,
//           u8 mode (0 raw, 1 jpeg), u8[2] reserved}
//   end of file == index_offset + 24 * count exactly.
// The reader checks every field and every entry against the file size, so a truncated or
// garbage file is a vit::Error, never an out-of-bounds read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/decode.h"
#include "data/image.h"
#include "data/image_folder.h"

namespace vit::data {

struct PackStats {
  size_t written = 0;  // samples stored
  size_t skipped = 0;  // undecodable source images (each reported on stderr)
  uint64_t bytes = 0;  // final file size
};

// Builds the packed file from an ImageFolder index. max_side <= 0 keeps the original sizes
// (each side must then fit in 65535). jpeg: store JPEG at `quality` (1..100), else raw pixels.
// threads <= 0 = hardware concurrency. Written to "<out_path>.tmp.<pid>", fsync'ed, then
// renamed over out_path (the temp file is removed on failure). Corrupt/undecodable sources are
// skipped with a "warning: skipping undecodable image <file>: <why>" line on stderr and counted;
// a summary line with the counts is printed to stderr too. Throws vit::Error if nothing could be
// stored.
PackStats write_packed(const std::string& out_path, const FolderIndex& idx, int max_side, bool jpeg,
                       int quality, int threads);

struct PackedEntry {
  uint64_t offset;  // from the data blob start
  uint32_t size;
  int32_t label;
  uint16_t h, w;
  uint8_t c, mode;
};

// Read-only view of a packed file through mmap. decode() is const and thread-safe.
class PackedReader {
 public:
  PackedReader() = default;
  explicit PackedReader(const std::string& path) { open(path); }
  ~PackedReader();
  PackedReader(const PackedReader&) = delete;
  PackedReader& operator=(const PackedReader&) = delete;
  PackedReader(PackedReader&& o) noexcept;
  PackedReader& operator=(PackedReader&& o) noexcept;

  // Maps and validates the file; throws vit::Error naming it on any inconsistency.
  void open(const std::string& path);
  void close();
  bool is_open() const { return base_ != nullptr; }

  size_t size() const { return entries_.size(); }
  int32_t label(size_t i) const { return entry(i).label; }
  std::vector<int32_t> labels() const;
  const std::vector<std::string>& classes() const { return classes_; }
  int num_classes() const { return int(classes_.size()); }
  bool is_jpeg() const { return format_ == 1; }
  int max_side() const { return int(max_side_); }
  const std::string& path() const { return path_; }
  const PackedEntry& entry(size_t i) const;

  // The stored bytes of sample i (raw pixels or JPEG).
  const uint8_t* data(size_t i) const { return base_ + data_offset_ + entry(i).offset; }

  // Decodes sample i to RGB (H, W, 3). For JPEG entries min_side_hint enables DCT-domain
  // downscaling (see decode_image); raw entries are returned at their stored size.
  Image decode(size_t i, int min_side_hint = 0) const;
  // decode, keeping only the region `pick` chooses from the decoded size (decode_image_region;
  // raw entries copy just the region's pixels).
  Image decode_region(size_t i, int min_side_hint, const RegionPicker& pick) const;

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  uint32_t format_ = 0, max_side_ = 0;
  std::vector<std::string> classes_;
  std::vector<PackedEntry> entries_;
};

}  // namespace vit::data
