#include "data/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "data/cifar.h"
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

}  // namespace

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

DataSplits load_data_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(fmt::format("data directory '{}' does not exist", dir));
  DataSplits s;
  // CIFAR-10/100 binary layout: the reader brings its own class names and label range.
  if (detect_cifar(dir).kind != CifarKind::None) {
    s.train = load_cifar(dir, true);
    s.val = load_cifar(dir, false);
    s.format = s.train.num_classes == 100 ? "cifar100" : "cifar10";
    channel_stats(s.train, s.mean, s.std);
    return s;
  }
  const std::string tri = find_file(dir, "train-images-idx3-ubyte");
  const std::string trl = find_file(dir, "train-labels-idx1-ubyte");
  const std::string tei = find_file(dir, "t10k-images-idx3-ubyte");
  const std::string tel = find_file(dir, "t10k-labels-idx1-ubyte");
  if (tri.empty() || trl.empty() || tei.empty() || tel.empty())
    throw Error(fmt::format(
        "no supported data set in '{}': expected the IDX files train-images-idx3-ubyte[.gz], "
        "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz], "
        "or CIFAR binary files (data_batch_1..5.bin + test_batch.bin, or train.bin + test.bin)",
        dir));
  s.format = "idx";
  s.train = load_idx_split(tri, trl);
  s.val = load_idx_split(tei, tel);
  VIT_CHECK(s.train.height == s.val.height && s.train.width == s.val.width,
            fmt::format("train and test images in '{}' have different sizes", dir));
  int max_label = 0;
  for (int32_t l : s.train.labels) max_label = std::max(max_label, int(l));
  for (int32_t l : s.val.labels) max_label = std::max(max_label, int(l));
  const int K = max_label + 1;
  std::vector<std::string> names;
  if (K == 10 && dir.find("fashion") != std::string::npos)
    names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
             "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  else
    for (int k = 0; k < K; ++k) names.push_back(std::to_string(k));
  for (ImageDataset* d : {&s.train, &s.val}) {
    d->num_classes = K;
    d->class_names = names;
  }
  channel_stats(s.train, s.mean, s.std);
  return s;
}

}  // namespace vit::data
