// Where samples come from: an in-memory data set (IDX, CIFAR), an ImageFolder split decoded on
// demand, or a packed file (data/packed.h). Training and evaluation see one interface; only the
// in-memory kind keeps its fixed-size fast path in make_batch.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/common.h"
#include "data/dataset.h"
#include "data/image_folder.h"
#include "data/packed.h"

namespace vit::data {

// A decoded sample in the augmentation layout: planar (c, h, w) uint8.
struct Planar {
  Index c = 0, h = 0, w = 0;
  std::vector<uint8_t> px;  // (c, h, w)
};

class Source {
 public:
  virtual ~Source() = default;
  virtual Index size() const = 0;
  virtual Index channels() const = 0;
  virtual int32_t label(Index i) const = 0;
  const std::vector<std::string>& class_names() const { return classes_; }
  int num_classes() const { return int(classes_.size()); }

  // Sample i as (c, h, w). min_side: the shorter side the caller needs at least; JPEG decoding
  // may then use DCT-domain downscaling (data/decode.h). Thread-safe. Throws vit::Error naming
  // the file when the sample cannot be read or decoded.
  virtual void read(Index i, int min_side, Planar& out) const = 0;
  // Sample i cropped to the region `pick` chooses from its decoded size (h, w), as (c, region
  // h, region w): the same pixels as read() and a crop. JPEG samples decode only the region
  // (data/decode.h), raw packed ones copy only its pixels; the others read the whole sample.
  // pick is called once, before the region's pixels are decoded. Errors as read()'s.
  virtual void read_region(Index i, int min_side, const RegionPicker& pick, Planar& out) const;

  // The whole set when it lives in memory (IDX, CIFAR), else null.
  virtual const ImageDataset* memory() const { return nullptr; }

  // Unreadable samples (thread-safe). The first report of a sample prints one warning line on
  // stderr and counts it; later reports of the same sample are silent.
  void report_unreadable(Index i, const std::string& why) const;
  bool known_unreadable(Index i) const;
  size_t unreadable_count() const;

 protected:
  std::vector<std::string> classes_;  // class index -> name

 private:
  mutable std::mutex bad_mutex_;
  mutable std::set<Index> bad_;
};

class MemorySource : public Source {
 public:
  explicit MemorySource(ImageDataset d);
  Index size() const override { return d_.n; }
  Index channels() const override { return d_.channels; }
  int32_t label(Index i) const override { return d_.labels[size_t(i)]; }
  void read(Index i, int min_side, Planar& out) const override;
  const ImageDataset* memory() const override { return &d_; }

 private:
  ImageDataset d_;
};

// An ImageFolder split: every read decodes the file (RGB, so 3 channels).
class FolderSource : public Source {
 public:
  explicit FolderSource(FolderIndex idx);
  Index size() const override { return Index(idx_.files.size()); }
  Index channels() const override { return 3; }
  int32_t label(Index i) const override { return idx_.labels[size_t(i)]; }
  void read(Index i, int min_side, Planar& out) const override;
  void read_region(Index i, int min_side, const RegionPicker& pick, Planar& out) const override;
  const std::string& file(Index i) const { return idx_.files[size_t(i)]; }

 private:
  FolderIndex idx_;
};

// A packed file (raw or JPEG entries; RGB, so 3 channels).
class PackedSource : public Source {
 public:
  explicit PackedSource(const std::string& path);
  Index size() const override { return Index(reader_.size()); }
  Index channels() const override { return 3; }
  int32_t label(Index i) const override { return reader_.label(size_t(i)); }
  void read(Index i, int min_side, Planar& out) const override;
  void read_region(Index i, int min_side, const RegionPicker& pick, Planar& out) const override;

 private:
  PackedReader reader_;
};

// Interleaved (h, w, c) -> planar (c, h, w).
void to_planar(const Image& img, Planar& out);

}  // namespace vit::data
