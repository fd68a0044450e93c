#include "data/source.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/warning.h"
#include "data/decode.h"
#include "data/stage_clock.h"

namespace vit::data {

void Source::report_unreadable(Index i, const std::string& why) const {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  if (!bad_.insert(i).second) return;
  warn(fmt::format("skipping unreadable image {}", why));
}

bool Source::known_unreadable(Index i) const {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  return bad_.count(i) > 0;
}

size_t Source::unreadable_count() const {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  return bad_.size();
}

void to_planar(const Image& img, Planar& out) {
  StageScope clock(Stage::Layout);
  out.c = img.c;
  out.h = img.h;
  out.w = img.w;
  out.px.resize(size_t(img.c) * img.h * img.w);
  const size_t plane = size_t(img.h) * img.w;
  if (img.c == 3) {  // the common case, written out so the de-interleave vectorises
    uint8_t *r = out.px.data(), *g = r + plane, *b = g + plane;
    const uint8_t* s = img.px.data();
    for (size_t i = 0; i < plane; ++i) {
      r[i] = s[3 * i];
      g[i] = s[3 * i + 1];
      b[i] = s[3 * i + 2];
    }
    return;
  }
  for (int c = 0; c < img.c; ++c) {
    uint8_t* dst = out.px.data() + c * plane;
    const uint8_t* src = img.px.data() + c;
    for (size_t i = 0; i < plane; ++i) dst[i] = src[i * img.c];
  }
}

void Source::read_region(Index i, int min_side, const RegionPicker& pick, Planar& out) const {
  Planar whole;
  read(i, min_side, whole);
  const Rect r = pick(int(whole.h), int(whole.w));
  VIT_CHECK(region_inside(r, int(whole.h), int(whole.w)),
            fmt::format("sample {}: {}", i, region_error(r, int(whole.h), int(whole.w))));
  out.c = whole.c;
  out.h = r.height;
  out.w = r.width;
  out.px.resize(size_t(out.c * out.h * out.w));
  for (Index c = 0; c < out.c; ++c)
    for (Index y = 0; y < out.h; ++y)
      std::copy_n(whole.px.data() + (c * whole.h + r.top + y) * whole.w + r.left, out.w,
                  out.px.data() + (c * out.h + y) * out.w);
}

// ---------------------------------------------------------------------------------------------

MemorySource::MemorySource(ImageDataset d) : d_(std::move(d)) {
  classes_ = d_.class_names;
  // The class count is the data set's (make_batch's target width), named or not.
  if (Index(classes_.size()) != d_.num_classes) {
    classes_.clear();
    for (int k = 0; k < d_.num_classes; ++k) classes_.push_back(std::to_string(k));
  }
}

void MemorySource::read(Index i, int, Planar& out) const {
  VIT_CHECK(i >= 0 && i < d_.n, fmt::format("sample {} out of range ({} samples)", i, d_.n));
  out.c = d_.channels;
  out.h = d_.height;
  out.w = d_.width;
  const size_t n = size_t(out.c * out.h * out.w);
  out.px.assign(d_.pixels.begin() + i * n, d_.pixels.begin() + (i + 1) * n);
}

FolderSource::FolderSource(FolderIndex idx) : idx_(std::move(idx)) {
  classes_ = idx_.classes;
}

void FolderSource::read(Index i, int min_side, Planar& out) const {
  to_planar(decode_image_file(idx_.files[size_t(i)], min_side), out);
}

void FolderSource::read_region(Index i, int min_side, const RegionPicker& pick, Planar& out) const {
  to_planar(decode_image_file_region(idx_.files[size_t(i)], min_side, pick), out);
}

PackedSource::PackedSource(const std::string& path) : reader_(path) {
  classes_ = reader_.classes();
}

void PackedSource::read(Index i, int min_side, Planar& out) const {
  to_planar(reader_.decode(size_t(i), min_side), out);
}

void PackedSource::read_region(Index i, int min_side, const RegionPicker& pick, Planar& out) const {
  to_planar(reader_.decode_region(size_t(i), min_side, pick), out);
}

}  // namespace vit::data
