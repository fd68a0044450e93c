#include "data/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "data/cifar.h"
#include "data/image_folder.h"
#include "data/source.h"
#include "io/idx.h"

namespace vit::data {

namespace fs = std::filesystem;

namespace {

// "<dir>/<stem>" or "<dir>/<stem>.gz", whichever exists; empty if neither.
std::string find_file(const std::string& dir, const std::string& stem) {
  for (const std::string& p : {dir + "/" + stem, dir + "/" + stem + ".gz"})
    if (fs::is_regular_file(p)) return p;
  return "";
}

ImageDataset load_idx_split(const std::string& images, const std::string& labels) {
  io::IdxDataset raw = io::read_idx_pair(images, labels);
  ImageDataset d;
  d.n = raw.n;
  d.channels = 1;
  d.height = raw.rows;
  d.width = raw.cols;
  d.pixels = std::move(raw.images);
  d.labels.assign(raw.labels.begin(), raw.labels.end());
  return d;
}

constexpr const char* kLayouts =
    "expected one of: CIFAR binary files (data_batch_1..5.bin + test_batch.bin, or train.bin + "
    "test.bin); the IDX files train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
    "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]; train.vitpack + val.vitpack "
    "(vitrain prepare); or an ImageFolder root with train/<class>/*.jpg and val/<class>/*.jpg";

DataSplits load_packed(const std::string& dir, const std::vector<std::string>& class_map) {
  const std::string tr = dir + "/train.vitpack", va = dir + "/val.vitpack";
  VIT_CHECK(fs::is_regular_file(va),
            fmt::format("{}: has train.vitpack but no val.vitpack (run vitrain prepare on a data "
                        "folder with a validation split)",
                        dir));
  DataSplits s;
  s.format = "packed";
  s.train = std::make_shared<PackedSource>(tr);
  s.val = std::make_shared<PackedSource>(va);
  VIT_CHECK(s.train->class_names() == s.val->class_names(),
            fmt::format("{}: train.vitpack and val.vitpack have different class lists", dir));
  if (!class_map.empty() && class_map != s.train->class_names())
    throw Error(
        fmt::format("{}: the class map ({} classes) differs from the classes stored in "
                    "train.vitpack ({}); re-run vitrain prepare with --class-map",
                    dir, class_map.size(), s.train->num_classes()));
  return s;
}

DataSplits load_folder(const std::string& dir, const std::vector<std::string>& class_map) {
  DataSplits s;
  s.format = "folder";
  FolderIndex tr = index_image_folder(find_split(dir, true), class_map);
  // The eval split is indexed with the training classes, so class indices agree.
  const std::vector<std::string> classes = tr.classes;
  s.train = std::make_shared<FolderSource>(std::move(tr));
  s.val = std::make_shared<FolderSource>(index_image_folder(find_split(dir, false), classes));
  return s;
}

}  // namespace

const std::vector<float> kImageNetMean = {0.485f, 0.456f, 0.406f};
const std::vector<float> kImageNetStd = {0.229f, 0.224f, 0.225f};

void channel_stats(const ImageDataset& d, std::vector<float>& mean, std::vector<float>& std) {
  mean.assign(d.channels, 0.0f);
  std.assign(d.channels, 1.0f);
  const Index plane = d.height * d.width;
  for (Index c = 0; c < d.channels; ++c) {
    double s = 0, s2 = 0;
    for (Index i = 0; i < d.n; ++i) {
      const uint8_t* p = d.pixels.data() + (i * d.channels + c) * plane;
      for (Index j = 0; j < plane; ++j) {
        const double v = p[j] / 255.0;
        s += v;
        s2 += v * v;
      }
    }
    const double cnt = double(d.n) * plane;
    const double mu = cnt > 0 ? s / cnt : 0.0;
    const double var = cnt > 0 ? std::max(s2 / cnt - mu * mu, 0.0) : 1.0;
    mean[c] = float(mu);
    std[c] = float(var > 1e-12 ? std::sqrt(var) : 1.0);
  }
}

DataSplits load_data_dir(const std::string& dir, const std::vector<std::string>& class_map) {
  if (!fs::is_directory(dir)) throw Error(fmt::format("data directory '{}' does not exist", dir));
  DataSplits s;
  // CIFAR-10/100 binary layout: the reader brings its own class names and label range.
  if (detect_cifar(dir).kind != CifarKind::None) {
    ImageDataset train = load_cifar(dir, true);
    s.format = train.num_classes == 100 ? "cifar100" : "cifar10";
    channel_stats(train, s.mean, s.std);
    s.train = std::make_shared<MemorySource>(std::move(train));
    s.val = std::make_shared<MemorySource>(load_cifar(dir, false));
    return s;
  }
  const std::string tri = find_file(dir, "train-images-idx3-ubyte");
  const std::string trl = find_file(dir, "train-labels-idx1-ubyte");
  const std::string tei = find_file(dir, "t10k-images-idx3-ubyte");
  const std::string tel = find_file(dir, "t10k-labels-idx1-ubyte");
  if (tri.empty() || trl.empty() || tei.empty() || tel.empty()) {
    if (fs::is_regular_file(dir + "/train.vitpack"))
      s = load_packed(dir, class_map);
    else if (fs::is_directory(dir + "/train") || fs::is_directory(dir + "/training"))
      s = load_folder(dir, class_map);
    else
      throw Error(fmt::format("no supported data set in '{}': {}", dir, kLayouts));
    s.mean = kImageNetMean;
    s.std = kImageNetStd;
    return s;
  }
  s.format = "idx";
  ImageDataset train = load_idx_split(tri, trl), val = load_idx_split(tei, tel);
  VIT_CHECK(train.height == val.height && train.width == val.width,
            fmt::format("train and test images in '{}' have different sizes", dir));
  int max_label = 0;
  for (int32_t l : train.labels) max_label = std::max(max_label, int(l));
  for (int32_t l : val.labels) max_label = std::max(max_label, int(l));
  const int K = max_label + 1;
  std::vector<std::string> names;
  if (K == 10 && dir.find("fashion") != std::string::npos)
    names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
             "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  else
    for (int k = 0; k < K; ++k) names.push_back(std::to_string(k));
  for (ImageDataset* d : {&train, &val}) {
    d->num_classes = K;
    d->class_names = names;
  }
  channel_stats(train, s.mean, s.std);
  s.train = std::make_shared<MemorySource>(std::move(train));
  s.val = std::make_shared<MemorySource>(std::move(val));
  return s;
}

}  // namespace vit::data
