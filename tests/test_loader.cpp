// The data loader and the sources behind it: batches independent of the worker count, configs
// changed mid-run, unreadable images skipped and counted with correct labels, packed == folder,
// and load_data_dir's format detection.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/rng.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/decode.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/packed.h"
#include "data/source.h"
#include "data/source_batch.h"
#include "data/stage_clock.h"
#include "temp_dir.h"

using namespace vit;
using namespace vit::data;
namespace fs = std::filesystem;

using vit::testing::TempDir;

namespace {

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Class k's images are dominated by channel k, so a sample's label can be read off its pixels.
Image class_image(int h, int w, int k, uint64_t seed) {
  Image img(h, w, 3);
  Rng rng(seed);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) img.at(y, x)[c] = uint8_t((c == k ? 190 : 20) + rng.below(50));
  return img;
}

// root/{train,val}/c<k>/<i>.{png,jpg}: 30x40 images, PNG and JPEG alternating.
void write_folder(const fs::path& root, int classes, int n_train, int n_val) {
  for (auto [split, n] : {std::pair{"train", n_train}, std::pair{"val", n_val}})
    for (int k = 0; k < classes; ++k)
      for (int i = 0; i < n; ++i) {
        const Image img = class_image(30, 40, k, uint64_t(1000 * k + i + (split[0] == 'v') * 77));
        const bool jpg = i % 2 == 1;
        write_bytes(
            root / split / fmt::format("c{}", k) / fmt::format("{}.{}", i, jpg ? "jpg" : "png"),
            jpg ? encode_jpeg(img, 92) : encode_png(img));
      }
}

BatchConfig train_cfg(int S) {
  BatchConfig c;
  c.img_size = S;
  c.hflip = 0.5;
  c.smoothing = 0.1;
  c.mean = kImageNetMean;
  c.std = kImageNetStd;
  c.rrc = true;
  c.interpolation = "random";
  c.auto_augment = "rand-m9-mstd0.5-inc1";
  c.reprob = 0.25;
  return c;
}

// RandomResizedCrop + flip only: keeps every image's dominant colour (no invert, no erasing).
BatchConfig plain_train_cfg(int S) {
  BatchConfig c = train_cfg(S);
  c.auto_augment.clear();
  c.reprob = 0;
  return c;
}

BatchConfig eval_cfg(int S) {
  BatchConfig c;
  c.img_size = S;
  c.mean = kImageNetMean;
  c.std = kImageNetStd;
  c.eval_crop_pct = 0.875;
  return c;
}

struct Batch {
  std::vector<float> images, targets;
  std::vector<int32_t> labels;
  bool operator==(const Batch&) const = default;
};

Batch load(Loader& l, const Source& src, uint64_t epoch, Index k, const BatchConfig& cfg) {
  const Index b = l.batch_samples(k), S = cfg.img_size;
  Batch out;
  out.images.assign(size_t(b * src.channels() * S * S), -1.0f);
  out.targets.assign(size_t(b * src.num_classes()), -1.0f);
  out.labels.assign(size_t(b), -1);
  l.load(epoch, k, cfg, out.images.data(), out.targets.data(), out.labels.data());
  return out;
}

// The batch built directly (no loader) from the epoch order.
Batch direct(const Source& src, Index B, uint64_t seed, uint64_t epoch, Index k,
             const BatchConfig& cfg) {
  const std::vector<Index> order = epoch_order(src.size(), seed, epoch);
  const Index S = cfg.img_size;
  Batch out;
  out.images.resize(size_t(B * src.channels() * S * S));
  out.targets.resize(size_t(B * src.num_classes()));
  out.labels.resize(size_t(B));
  make_source_batch(src, order.data() + k * B, B, cfg, true, seed, epoch, out.images.data(),
                    out.targets.data(), out.labels.data());
  return out;
}

// The channel with the largest mean (de-normalised) for every sample of a batch.
std::vector<int> dominant_channels(const Batch& b, Index S) {
  std::vector<int> out;
  const Index n = Index(b.labels.size());
  for (Index i = 0; i < n; ++i) {
    double best = -1e9;
    int arg = -1;
    for (int c = 0; c < 3; ++c) {
      double s = 0;
      for (Index j = 0; j < S * S; ++j)
        s += b.images[size_t((i * 3 + c) * S * S + j)] * kImageNetStd[c] + kImageNetMean[c];
      if (s > best) best = s, arg = c;
    }
    out.push_back(arg);
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Loader, BatchesDoNotDependOnTheWorkerCount) {
  TempDir t;
  write_folder(t.path, 3, 8, 3);
  const FolderSource src(index_image_folder((t.path / "train").string()));
  const Index B = 5;  // 24 images: 4 batches, 4 left over
  const BatchConfig cfg = train_cfg(16);
  std::vector<Batch> ref;
  for (uint64_t e = 0; e < 2; ++e)
    for (Index k = 0; k < 4; ++k) ref.push_back(direct(src, B, 9, e, k, cfg));
  EXPECT_NE(ref[0].images, ref[4].images);  // another epoch, another order and augmentation
  for (int workers : {1, 2, 4}) {
    Loader l(src, B, true, 9, {workers});
    EXPECT_EQ(l.workers(), workers);
    EXPECT_EQ(l.batches_per_epoch(), 4);
    size_t i = 0;
    for (uint64_t e = 0; e < 2; ++e)
      for (Index k = 0; k < 4; ++k, ++i)
        EXPECT_TRUE(load(l, src, e, k, cfg) == ref[i]) << workers << " workers, batch " << i;
  }
  // Eval: sequential, the last batch short, same with 1 and 3 workers.
  const FolderSource val(index_image_folder((t.path / "val").string(), src.class_names()));
  Loader l1(val, 4, false, 0, {1}), l3(val, 4, false, 0, {3});
  ASSERT_EQ(l1.batches_per_epoch(), 3);
  EXPECT_EQ(l1.batch_samples(2), 1);
  for (Index k = 0; k < 3; ++k) {
    const Batch a = load(l1, val, 0, k, eval_cfg(16)), b = load(l3, val, 0, k, eval_cfg(16));
    EXPECT_TRUE(a == b) << k;
    for (size_t j = 0; j < a.labels.size(); ++j)
      EXPECT_EQ(a.labels[j], val.label(k * 4 + Index(j)));
  }
}

// Data parallel: each of W train shards holds its rank's slice of the global batch, and an eval
// loader striding over batches (rank r asks for r, r + W, ...) gives the sequential batches.
TEST(Loader, ShardsPartitionTheGlobalBatchAndEvalStridesKeepBatches) {
  TempDir t;
  write_folder(t.path, 3, 8, 3);
  const FolderSource src(index_image_folder((t.path / "train").string()));
  const BatchConfig cfg = train_cfg(16);
  const Batch global = direct(src, 6, 9, 1, 1, cfg);  // batch 1 of epoch 1, 6 samples
  const Index per = Index(global.images.size()) / 6;
  for (int rank = 0; rank < 3; ++rank) {
    LoaderOptions o;
    o.workers = 2;
    o.shard_rank = rank;
    o.shard_count = 3;
    Loader l(src, 2, true, 9, o);
    EXPECT_EQ(l.batches_per_epoch(), 4);  // 24 / 6
    const Batch b = load(l, src, 1, 1, cfg);
    const std::vector<float> want(global.images.begin() + rank * 2 * per,
                                  global.images.begin() + (rank + 1) * 2 * per);
    EXPECT_EQ(b.images, want) << "rank " << rank;
  }
  const FolderSource val(index_image_folder((t.path / "val").string(), src.class_names()));
  Loader seq(val, 2, false, 0, {1});
  LoaderOptions o;
  o.workers = 3;
  o.stride = 2;
  Loader strided(val, 2, false, 0, o);
  for (Index k = 1; k < seq.batches_per_epoch(); k += 2)
    EXPECT_TRUE(load(strided, val, 0, k, eval_cfg(16)) == load(seq, val, 0, k, eval_cfg(16))) << k;
}

TEST(Loader, InMemoryBatchesAreMakeBatchBitwise) {
  ImageDataset d;
  d.n = 20;
  d.channels = 1;
  d.height = d.width = 8;
  d.num_classes = 3;
  d.class_names = {"a", "b", "c"};
  Rng rng(4);
  for (Index i = 0; i < d.n * 64; ++i) d.pixels.push_back(uint8_t(rng.below(256)));
  for (Index i = 0; i < d.n; ++i) d.labels.push_back(int32_t(i % 3));
  const ImageDataset copy = d;
  const MemorySource src(std::move(d));
  BatchConfig cfg;  // the pad-crop path
  cfg.img_size = 8;
  cfg.crop_padding = 2;
  cfg.hflip = 0.5;
  cfg.smoothing = 0.1;
  cfg.mean = {0.5f};
  cfg.std = {0.25f};
  for (bool threads : {false, true}) {
    Loader l(src, 6, true, 3, {2, 0, 0, threads});
    EXPECT_EQ(l.workers(), threads ? 2 : 0);
    for (Index k = 0; k < 3; ++k) {
      const std::vector<Index> order = epoch_order(20, 3, 1);
      std::vector<float> img(6 * 64), tgt(6 * 3);
      make_batch(copy, order.data() + k * 6, 6, cfg, true, 3, 1, img.data(), tgt.data());
      const Batch b = load(l, src, 1, k, cfg);
      EXPECT_EQ(b.images, img) << k;
      EXPECT_EQ(b.targets, tgt) << k;
    }
  }
}

TEST(Loader, ConfigChangeMidRunRebuildsPrefetchedBatches) {
  TempDir t;
  write_folder(t.path, 2, 10, 1);
  const FolderSource src(index_image_folder((t.path / "train").string()));
  Loader l(src, 4, true, 5, {2, 4});
  BatchConfig a = train_cfg(16);
  EXPECT_TRUE(load(l, src, 0, 0, a) == direct(src, 4, 5, 0, 0, a));
  // Batches 1.. are being prefetched with `a`; the curriculum now asks for another size.
  BatchConfig b = a;
  b.img_size = 24;
  EXPECT_TRUE(load(l, src, 0, 1, b) == direct(src, 4, 5, 0, 1, b));
  // ET++ changes the RandAugment magnitude.
  BatchConfig c = b;
  c.magnitude_override = 3;
  const Batch got = load(l, src, 0, 2, c);
  EXPECT_TRUE(got == direct(src, 4, 5, 0, 2, c));
  EXPECT_FALSE(got == direct(src, 4, 5, 0, 2, b));
  // Skipping ahead (a resume) and wrapping into the next epoch.
  EXPECT_TRUE(load(l, src, 0, 4, c) == direct(src, 4, 5, 0, 4, c));
  EXPECT_TRUE(load(l, src, 1, 0, c) == direct(src, 4, 5, 1, 0, c));
  EXPECT_TRUE(load(l, src, 0, 3, a) == direct(src, 4, 5, 0, 3, a));  // back to an old config
}

TEST(Loader, UnreadableImagesAreSkippedOnceCountedAndNeverMislabelled) {
  TempDir t;
  write_folder(t.path, 3, 6, 2);
  const fs::path tr = t.path / "train";
  // A corrupt JPEG, a truncated JPEG, a truncated PNG and an empty file.
  std::vector<uint8_t> junk = {0xFF, 0xD8, 0xFF, 0xE0};
  for (int i = 0; i < 300; ++i) junk.push_back(uint8_t(i * 37));
  write_bytes(tr / "c0" / "junk.jpg", junk);
  const std::vector<uint8_t> jpg = slurp(tr / "c1" / "1.jpg");
  write_bytes(tr / "c1" / "cut.jpg",
              std::vector<uint8_t>(jpg.begin(), jpg.begin() + jpg.size() / 2));
  const std::vector<uint8_t> png = slurp(tr / "c2" / "0.png");
  write_bytes(tr / "c2" / "cut.png",
              std::vector<uint8_t>(png.begin(), png.begin() + png.size() * 3 / 5));
  write_bytes(tr / "c2" / "empty.png", {});
  const FolderSource src(index_image_folder(tr.string()));
  ASSERT_EQ(src.size(), 22);

  ::testing::internal::CaptureStderr();
  Loader l(src, 5, true, 1, {2});
  for (uint64_t e = 0; e < 2; ++e)
    for (Index k = 0; k < l.batches_per_epoch(); ++k) {
      const Batch b = load(l, src, e, k, plain_train_cfg(16));
      const std::vector<int> dom = dominant_channels(b, 16);
      for (size_t j = 0; j < b.labels.size(); ++j) {
        EXPECT_EQ(dom[j], b.labels[j]) << "epoch " << e << " batch " << k << " sample " << j;
        EXPECT_FLOAT_EQ(b.targets[j * 3 + size_t(b.labels[j])], 0.9f + 0.1f / 3);
      }
    }
  // The same batch again from a fresh loader: a replaced sample is rebuilt identically.
  Loader l2(src, 5, true, 1, {1});
  EXPECT_TRUE(load(l2, src, 1, 2, train_cfg(16)) == direct(src, 5, 1, 1, 2, train_cfg(16)));
  // Eval over the same split (every file is visited): every label still matches its pixels.
  Loader ev(src, 8, false, 0, {2});
  for (Index k = 0; k < ev.batches_per_epoch(); ++k) {
    const Batch b = load(ev, src, 0, k, eval_cfg(16));
    const std::vector<int> dom = dominant_channels(b, 16);
    for (size_t j = 0; j < b.labels.size(); ++j) EXPECT_EQ(dom[j], b.labels[j]);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(src.unreadable_count(), 4u);
  size_t lines = 0;  // one warning per file, however often it was drawn
  for (size_t p = 0; (p = err.find("warning: skipping unreadable image", p)) != std::string::npos;
       ++p)
    ++lines;
  EXPECT_EQ(lines, 4u) << err;
  for (const char* f : {"junk.jpg", "cut.jpg", "cut.png", "empty.png"})
    EXPECT_NE(err.find(f), std::string::npos) << f;
}

TEST(Loader, NothingReadableIsAClearError) {
  TempDir t;
  write_bytes(t.path / "train" / "a" / "x.jpg", {0xFF, 0xD8, 0xFF, 0x00});
  write_bytes(t.path / "train" / "b" / "y.png", {1, 2, 3});
  const FolderSource src(index_image_folder((t.path / "train").string()));
  ::testing::internal::CaptureStderr();
  Loader l(src, 2, true, 1, {1});
  const std::string m = error_of([&] { load(l, src, 0, 0, train_cfg(8)); });
  ::testing::internal::GetCapturedStderr();
  EXPECT_NE(m.find("none of the 2 images"), std::string::npos) << m;
}

TEST(Loader, JpegDecodesWithDctScalingOnlyWhenTheTargetIsAtMostHalf) {
  TempDir t;
  write_folder(t.path, 1, 2, 1);
  const FolderSource src(index_image_folder((t.path / "train").string()));
  ASSERT_TRUE(src.file(1).ends_with(".jpg"));
  Planar p;
  src.read(1, 16, p);  // short side 30 < 2 x 16: full size
  EXPECT_EQ(p.h, 30);
  EXPECT_EQ(p.w, 40);
  src.read(1, 15, p);  // 30 >= 2 x 15: DCT scale 1/2
  EXPECT_EQ(p.h, 15);
  EXPECT_EQ(p.w, 20);
  EXPECT_EQ(decode_min_side(train_cfg(16), true), 16);
  EXPECT_EQ(decode_min_side(eval_cfg(224), false), 256);
}

TEST(Loader, PackedRawFileGivesTheFolderBatches) {
  TempDir t;
  write_folder(t.path, 2, 7, 3);
  const FolderIndex idx = index_image_folder((t.path / "train").string());
  ::testing::internal::CaptureStderr();
  write_packed((t.path / "train.vitpack").string(), idx, 0, false, 0, 2);
  ::testing::internal::GetCapturedStderr();
  const FolderSource folder(idx);
  const PackedSource packed((t.path / "train.vitpack").string());
  ASSERT_EQ(packed.size(), folder.size());
  EXPECT_EQ(packed.class_names(), folder.class_names());
  Loader lf(folder, 4, true, 2, {2}), lp(packed, 4, true, 2, {3});
  for (Index k = 0; k < 3; ++k)
    EXPECT_TRUE(load(lf, folder, 1, k, train_cfg(16)) == load(lp, packed, 1, k, train_cfg(16)))
        << k;
  Loader ef(folder, 5, false, 0, {1}), ep(packed, 5, false, 0, {2});
  for (Index k = 0; k < 3; ++k)
    EXPECT_TRUE(load(ef, folder, 0, k, eval_cfg(16)) == load(ep, packed, 0, k, eval_cfg(16))) << k;
}

TEST(DataDir, DetectsEveryFormat) {
  TempDir t;
  // IDX (uncompressed), 4 images 8x8.
  const fs::path idx = t.path / "idx";
  for (const char* p : {"train", "t10k"}) {
    std::vector<uint8_t> img = {0, 0, 8, 3, 0, 0, 0, 4, 0, 0, 0, 8, 0, 0, 0, 8};
    img.resize(16 + 4 * 64, 7);
    write_bytes(idx / (std::string(p) + "-images-idx3-ubyte"), img);
    write_bytes(idx / (std::string(p) + "-labels-idx1-ubyte"),
                {0, 0, 8, 1, 0, 0, 0, 4, 0, 1, 2, 1});
  }
  DataSplits s = load_data_dir(idx.string());
  EXPECT_EQ(s.format, "idx");
  EXPECT_FALSE(s.streamed());
  ASSERT_NE(s.train->memory(), nullptr);
  EXPECT_EQ(s.train->size(), 4);
  EXPECT_EQ(s.train->num_classes(), 3);

  // ImageFolder with timm's split synonyms.
  const fs::path folder = t.path / "folder";
  write_folder(folder, 2, 3, 2);
  fs::rename(folder / "train", folder / "training");
  fs::rename(folder / "val", folder / "validation");
  s = load_data_dir(folder.string());
  EXPECT_EQ(s.format, "folder");
  EXPECT_TRUE(s.streamed());
  EXPECT_EQ(s.train->memory(), nullptr);
  EXPECT_EQ(s.train->size(), 6);
  EXPECT_EQ(s.val->size(), 4);
  EXPECT_EQ(s.train->channels(), 3);
  EXPECT_EQ(s.train->class_names(), (std::vector<std::string>{"c0", "c1"}));
  EXPECT_EQ(s.mean, kImageNetMean);
  EXPECT_EQ(s.std, kImageNetStd);
  // A class map pins the order (and the val split follows it).
  s = load_data_dir(folder.string(), {"c1", "c0"});
  EXPECT_EQ(s.train->class_names(), (std::vector<std::string>{"c1", "c0"}));
  EXPECT_EQ(s.train->label(0), 0);
  EXPECT_EQ(s.val->label(0), 0);
  EXPECT_EQ(s.val->label(3), 1);
  EXPECT_NE(error_of([&] { load_data_dir(folder.string(), {"c0"}); }).find("not in the class map"),
            std::string::npos);

  // Packed: train.vitpack + val.vitpack.
  const fs::path packed = t.path / "packed";
  fs::create_directories(packed);
  ::testing::internal::CaptureStderr();
  write_packed((packed / "train.vitpack").string(),
               index_image_folder((folder / "training").string()), 32, true, 90, 1);
  EXPECT_NE(error_of([&] { load_data_dir(packed.string()); }).find("val.vitpack"),
            std::string::npos);
  write_packed((packed / "val.vitpack").string(),
               index_image_folder((folder / "validation").string()), 32, true, 90, 1);
  ::testing::internal::GetCapturedStderr();
  s = load_data_dir(packed.string());
  EXPECT_EQ(s.format, "packed");
  EXPECT_TRUE(s.streamed());
  EXPECT_EQ(s.train->size(), 6);
  EXPECT_EQ(s.val->size(), 4);
  EXPECT_EQ(s.train->class_names(), (std::vector<std::string>{"c0", "c1"}));
  Planar p;
  s.train->read(0, 0, p);
  EXPECT_EQ(p.w, 32);  // the longer side, downscaled by prepare
  EXPECT_NE(error_of([&] {
              load_data_dir(packed.string(), {"c1", "c0"});
            }).find("class map"),
            std::string::npos);

  // Nothing recognisable: the message names the layouts.
  const fs::path empty = t.path / "empty";
  fs::create_directories(empty / "stuff");
  const std::string m = error_of([&] { load_data_dir(empty.string()); });
  EXPECT_NE(m.find("train.vitpack"), std::string::npos) << m;
  EXPECT_NE(m.find("ImageFolder"), std::string::npos) << m;
  EXPECT_NE(error_of([&] { load_data_dir((t.path / "nope").string()); }).find("does not exist"),
            std::string::npos);
}

TEST(Loader, WidenTargetsPadsExtraClassesWithZeros) {
  std::vector<float> t = {1, 2, 3, 4, 5, 6, -1, -1, -1, -1};  // (2, 3) in a (2, 5) buffer
  widen_targets(t.data(), 2, 3, 5);
  EXPECT_EQ(t, (std::vector<float>{1, 2, 3, 0, 0, 4, 5, 6, 0, 0}));
}

// Repeated augmentation: an epoch keeps its length, holds each chosen sample `repeats` times in a
// row with its own label and a different augmentation, and repeats = 1 is the plain order.
TEST(Loader, RepeatedAugmentationRepeatsSamplesWithFreshAugmentation) {
  EXPECT_EQ(epoch_order_repeated(24, 9, 1, 1), epoch_order(24, 9, 1));
  const std::vector<Index> plain = epoch_order(24, 9, 1), rep = epoch_order_repeated(24, 9, 1, 3);
  ASSERT_EQ(rep.size(), 24u);
  for (size_t j = 0; j < rep.size(); ++j) {
    EXPECT_EQ(rep[j] % 24, plain[j / 3]) << j;  // sample j / 3 of the permutation
    EXPECT_EQ(rep[j] / 24, Index(j % 3)) << j;  // its repeat number
  }
  EXPECT_THROW(epoch_order_repeated(24, 9, 1, 0), vit::Error);

  TempDir t;
  write_folder(t.path, 3, 8, 3);
  const FolderSource src(index_image_folder((t.path / "train").string()));
  const Index B = 6, S = 16, per_img = 3 * S * S;
  Loader l(src, B, true, 9, {2, 0, 0, false, 3});
  const Batch b = load(l, src, 1, 0, train_cfg(S));
  for (Index j = 0; j < B; ++j) {
    const Index first = j - j % 3;  // the first repeat of this sample
    EXPECT_EQ(b.labels[size_t(j)], src.label(rep[size_t(j)] % 24)) << j;
    EXPECT_EQ(b.labels[size_t(j)], b.labels[size_t(first)]) << j;
    if (j != first) {
      EXPECT_FALSE(std::equal(b.images.begin() + j * per_img, b.images.begin() + (j + 1) * per_img,
                              b.images.begin() + first * per_img))
          << "repeat " << j << " has the same augmentation as its first copy";
    }
  }
  // The first repeat is the sample the plain order would build with the same seed.
  Loader plain_loader(src, B, true, 9, {1});
  const Batch p = load(plain_loader, src, 1, 0, train_cfg(S));
  EXPECT_TRUE(std::equal(b.images.begin(), b.images.begin() + per_img, p.images.begin()));
}

// bench-data's stage clock: with it on, every sample of a streamed batch is read, decoded,
// laid out and augmented once (one call each), the batch copied once to the caller; packed data
// has no separate read (memory-mapped); with it off nothing is counted.
TEST(StageClock, CountsEveryStageOfAStreamedBatch) {
  TempDir t;
  write_folder(t.path, 2, 6, 1);
  const FolderIndex idx = index_image_folder((t.path / "train").string());
  ::testing::internal::CaptureStderr();
  write_packed((t.path / "train.vitpack").string(), idx, 0, true, 90, 1);
  ::testing::internal::GetCapturedStderr();
  const FolderSource folder(idx);
  const PackedSource packed((t.path / "train.vitpack").string());
  const Index B = 5;
  auto calls = [](Stage s) { return stage_clock_totals().calls[int(s)]; };

  stage_clock_enable(false);
  stage_clock_reset();
  direct(folder, B, 1, 0, 0, train_cfg(16));
  EXPECT_EQ(calls(Stage::Decode), 0) << "off: nothing counted";

  stage_clock_enable(true);
  stage_clock_reset();
  direct(folder, B, 1, 0, 0, train_cfg(16));
  for (Stage s : {Stage::Read, Stage::Decode, Stage::Layout, Stage::Augment})
    EXPECT_EQ(calls(s), B) << stage_name(s);
  EXPECT_GT(stage_clock_totals().seconds[int(Stage::Decode)], 0.0);

  stage_clock_reset();
  direct(packed, B, 1, 0, 0, train_cfg(16));
  EXPECT_EQ(calls(Stage::Read), 0) << "packed sets are memory-mapped";
  EXPECT_EQ(calls(Stage::Decode), B);

  stage_clock_reset();
  {
    Loader l(folder, B, true, 1, {2});
    load(l, folder, 0, 0, train_cfg(16));
    EXPECT_EQ(calls(Stage::Copy), 1) << "the batch to the caller";
    EXPECT_GE(calls(Stage::Augment), B) << "worker threads count too (and may prefetch more)";
  }
  stage_clock_enable(false);
}
