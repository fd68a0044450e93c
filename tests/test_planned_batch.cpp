// Planned batches (data/planned_batch.h) expanded by the batched resize ops
// (ops/cpu/resize_batch.h) give timm_sample's images: the uint8 image bit for bit equal to
// resize_pil + hflip with the same random draws, the floats equal to timm_sample's up to the
// rounding of one multiply-subtract. Random-noise images (every tap matters), up- and
// down-scaling, unchanged axes (PIL's skipped pass), extreme aspect ratios, 1 and 3 channels,
// training (RandomResizedCrop, fixed or random interpolation, flips, RandAugment and colour
// jitter as pixel steps) and evaluation (plain resize, centre crop).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/erase_plan.h"
#include "core/rng.h"
#include "data/augment.h"
#include "data/batch.h"
#include "data/decode.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/packed.h"
#include "data/planned_batch.h"
#include "data/randaugment.h"
#include "data/source.h"
#include "data/source_batch.h"
#include "ops/cpu/pixel_steps.h"
#include "ops/cpu/resize_batch.h"

using namespace vit;
using namespace vit::data;

namespace {

struct NoiseImage {
  Index c, h, w;
  std::vector<uint8_t> px;  // (c, h, w)
};

NoiseImage noise(Index c, Index h, Index w, uint64_t seed) {
  NoiseImage im{c, h, w, std::vector<uint8_t>(size_t(c * h * w))};
  Rng rng(seed);
  for (auto& p : im.px) p = uint8_t(rng.below(256));
  return im;
}

BatchConfig base_config(Index S) {
  BatchConfig c;
  c.img_size = int(S);
  c.mean = {0.485f, 0.456f, 0.406f};
  c.std = {0.229f, 0.224f, 0.225f};
  return c;
}

struct Case {
  std::string name;
  bool train;
  BatchConfig cfg;
};

std::vector<Case> cases(Index S) {
  std::vector<Case> out;
  BatchConfig c = base_config(S);
  c.rrc = true;
  c.hflip = 0.5;
  c.interpolation = "bicubic";
  out.push_back({"train_rrc_bicubic", true, c});
  c.interpolation = "random";
  c.scale_lo = 0.35;
  out.push_back({"train_rrc_random", true, c});
  c.reprob = 0.75;  // random erasing: the same box and noise
  out.push_back({"train_rrc_erase", true, c});
  c.reprob = 0.25;
  c.auto_augment = "rand-m9-mstd0.5-inc1";  // DeiT's RandAugment: the same draws, as steps
  out.push_back({"train_randaugment", true, c});
  c.auto_augment = "rand-n3-m10-p1.0-mstd101";  // every op always, the other op set
  out.push_back({"train_randaugment_n3", true, c});
  c.auto_augment.clear();
  c.color_jitter = 0.4;
  out.push_back({"train_colour_jitter", true, c});
  c.color_jitter = 0;
  c.reprob = 0;
  c = base_config(S);
  c.hflip = 1.0;
  c.interpolation = "bilinear";
  out.push_back({"train_resize_flip", true, c});  // no RRC: the whole image
  c = base_config(S);
  c.eval_crop_pct = 0.875;
  out.push_back({"eval_center_crop", false, c});
  c.eval_interpolation = "bilinear";
  c.eval_crop_pct = 0.0;
  out.push_back({"eval_resize", false, c});
  return out;
}

// The reference uint8 image: timm_sample's geometry and uint8 ops with the same draws, through
// resize_pil, hflip and RandAugment::apply / color_jitter.
std::vector<uint8_t> reference_u8(const NoiseImage& im, const Case& k, uint64_t seed) {
  const Index S = k.cfg.img_size;
  std::vector<uint8_t> out(size_t(im.c * S * S));  // (c, S, S)
  Rng rng(seed);
  if (!k.train) {
    const Interp f = parse_interp(k.cfg.eval_interpolation);
    if (k.cfg.eval_crop_pct > 0)
      eval_resize_crop(im.px.data(), im.c, im.h, im.w, out.data(), S, k.cfg.eval_crop_pct, f);
    else
      resize_pil(im.px.data(), im.c, im.h, im.w, {0, 0, im.h, im.w}, out.data(), S, S, f);
    return out;
  }
  CropBox box{0, 0, im.h, im.w};
  if (k.cfg.rrc)
    box =
        sample_rrc(rng, im.h, im.w, k.cfg.scale_lo, k.cfg.scale_hi, k.cfg.ratio_lo, k.cfg.ratio_hi);
  Interp f = Interp::Bicubic;
  if (k.cfg.interpolation == "random")
    f = rng.uniform() < 0.5 ? Interp::Bilinear : Interp::Bicubic;
  else
    f = parse_interp(k.cfg.interpolation);
  resize_pil(im.px.data(), im.c, im.h, im.w, box, out.data(), S, S, f);
  if (k.cfg.hflip > 0 && rng.uniform() < k.cfg.hflip) hflip(out.data(), im.c, S, S);
  if (const auto ra = make_rand_augment(k.cfg, true))
    ra->apply(rng, out.data(), im.c, S, S);
  else if (k.cfg.color_jitter > 0)
    color_jitter(rng, out.data(), im.c, S, S, k.cfg.color_jitter);
  return out;
}

struct Expanded {
  std::vector<uint8_t> u8;  // (B, C, S, S)
  std::vector<float> f32;   // (B, C, S, S)
};

Expanded expand(const PlannedBatch& batch, const std::vector<float>& lut) {
  const Index B = batch.size(), C = batch.C, S = batch.S;
  std::vector<uint8_t> rows(size_t(batch.scratch_bytes), 0xab);  // (per sample (C, bh, S))
  Expanded e{std::vector<uint8_t>(size_t(B * C * S * S), 0xcd),
             std::vector<float>(size_t(B * C * S * S), NAN)};
  cpu::resize_rows(batch.pixels.data(), batch.tables.data(), batch.samples.data(), B, C, S,
                   rows.data());
  cpu::resize_cols(rows.data(), batch.tables.data(), batch.samples.data(), B, C, S, e.u8.data());
  cpu::apply_pixel_steps(e.u8.data(), batch.steps.data(), batch.step_slots, B, C, S, batch.fill);
  cpu::normalize_u8(e.u8.data(), lut.data(), erase_noise_table().data(), batch.samples.data(),
                    batch.mix, B, C, S, e.f32.data());
  return e;
}

// |a - b| <= 2 ulp, at least 1e-6: the lookup table and timm_sample's loop may round the
// multiply-subtract differently (a fused multiply-add in one of them), an error of the order of
// an ulp of the product (|v * scale| <= 4.4) even where the difference is near 0.
void expect_float_close(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, exact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    exact += got[i] == want[i];
    const float lim = 2.0f * (std::nextafter(std::fabs(want[i]), INFINITY) - std::fabs(want[i]));
    if (!(std::fabs(got[i] - want[i]) <= std::max(lim, 1e-6f))) ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " values differ";
  std::printf("%s: %zu of %zu floats bitwise equal\n", what.c_str(), exact, got.size());
}

// RandomResizedCrop + flip at S px with label smoothing: the training config of the batch tests.
BatchConfig rrc_config(Index S) {
  BatchConfig cfg = base_config(S);
  cfg.rrc = true;
  cfg.hflip = 0.5;
  cfg.smoothing = 0.1;
  return cfg;
}

// n noise images (3, h, w), labels i % K, class names "0".."K-1".
ImageDataset noise_dataset(Index n, Index h, Index w, int K, uint64_t seed) {
  ImageDataset d;
  d.n = n;
  d.channels = 3;
  d.height = h;
  d.width = w;
  d.num_classes = K;
  d.pixels = noise(1, n * 3 * h, w, seed).px;  // (n, 3, h, w)
  for (Index i = 0; i < n; ++i) d.labels.push_back(int32_t(i % K));
  for (int k = 0; k < K; ++k) d.class_names.push_back(std::to_string(k));
  return d;
}

const NoiseImage& image_of(int i) {
  // (c, h, w): up-scaling, down-scaling, one axis already at S = 32, extreme aspect ratios
  static const std::vector<NoiseImage> images = {noise(3, 17, 23, 1),  noise(3, 120, 90, 2),
                                                 noise(3, 32, 77, 3),  noise(1, 45, 32, 4),
                                                 noise(3, 24, 300, 5), noise(1, 400, 36, 6)};
  return images[size_t(i)];
}
constexpr int kImages = 6;

}  // namespace

TEST(PlannedBatch, ExpandsToTimmSample) {
  const Index S = 32;
  for (const Case& k : cases(S)) {
    const auto ra = make_rand_augment(k.cfg, k.train);
    for (Index C : {Index(1), Index(3)}) {
      PlannedBatch batch;
      batch.clear(C, S);
      std::vector<uint8_t> want_u8;
      std::vector<float> want_f32;
      for (int i = 0; i < kImages; ++i) {
        const NoiseImage& im = image_of(i);
        if (im.c != C) continue;
        for (uint64_t rep = 0; rep < 4; ++rep) {  // four draws of the randomness per image
          const uint64_t seed = 1000 * uint64_t(i) + rep;
          Rng rng(seed);
          plan_sample(im.px.data(), C, im.h, im.w, k.cfg, ra.get(), k.train, rng, batch);
          const std::vector<uint8_t> u8 = reference_u8(im, k, seed);
          want_u8.insert(want_u8.end(), u8.begin(), u8.end());
          std::vector<float> f(size_t(C * S * S));
          Rng rng2(seed);
          timm_sample(im.px.data(), C, im.h, im.w, k.cfg, ra.get(), k.train, rng2, f.data());
          want_f32.insert(want_f32.end(), f.begin(), f.end());
        }
      }
      ASSERT_GT(batch.size(), 0);
      const Expanded got = expand(batch, normalize_lut(k.cfg, C));
      const std::string what = k.name + " C=" + std::to_string(C);
      EXPECT_TRUE(got.u8 == want_u8)
          << what << ": uint8 images differ from resize_pil + hflip (+ uint8 ops)";
      expect_float_close(got.f32, want_f32, what);
    }
  }
}

TEST(PlannedBatch, ShipsOnlyThePixelsTheResamplingReads) {
  // A centre crop of a 3 x 400 x 36 image to 32 px: the plan keeps the middle rows only.
  const NoiseImage& im = image_of(5);
  BatchConfig cfg = base_config(32);
  cfg.eval_crop_pct = 0.875;
  PlannedBatch batch;
  batch.clear(1, 32);
  Rng rng(1);
  plan_sample(im.px.data(), 1, im.h, im.w, cfg, nullptr, false, rng, batch);
  ASSERT_EQ(batch.size(), 1);
  const ResizeSample& s = batch.samples[0];
  EXPECT_LT(s.bh, im.h);  // rows outside the crop window are not shipped
  EXPECT_LE(s.bw, im.w);
  EXPECT_EQ(Index(batch.pixels.size()), Index(s.bh) * s.bw);
  EXPECT_EQ(batch.scratch_bytes, Index(s.bh) * 32);
}

TEST(PlannedBatch, PlansRandAugmentAndColourJitterAsSteps) {
  // A step per RandAugment op (n) or jitter factor (3) and sample, some of them real ops;
  // evaluation has none; the steps change the image (the equality with timm_sample above is not
  // two no-ops agreeing).
  const NoiseImage& im = image_of(1);
  for (const Case& k : cases(32)) {
    if (k.cfg.auto_augment.empty() && k.cfg.color_jitter <= 0) continue;
    const auto ra = make_rand_augment(k.cfg, true);
    const int32_t want_slots = ra ? ra->num_ops() : 3;
    PlannedBatch batch, bare;
    batch.clear(3, 32);
    bare.clear(3, 32);
    BatchConfig plain = k.cfg;
    plain.auto_augment.clear();
    plain.color_jitter = 0;
    for (uint64_t seed = 0; seed < 8; ++seed) {
      Rng rng(seed), rng2(seed);
      plan_sample(im.px.data(), 3, im.h, im.w, k.cfg, ra.get(), true, rng, batch);
      plan_sample(im.px.data(), 3, im.h, im.w, plain, nullptr, true, rng2, bare);
    }
    EXPECT_EQ(batch.step_slots, want_slots) << k.name;
    ASSERT_EQ(batch.steps.size(), size_t(8 * want_slots)) << k.name;
    size_t ops = 0;
    for (const PixelStep& s : batch.steps) ops += s.op != PixelStep::kNone;
    EXPECT_GE(ops, size_t(8)) << k.name;
    EXPECT_FALSE(expand(batch, normalize_lut(k.cfg, 3)).u8 ==
                 expand(bare, normalize_lut(plain, 3)).u8)
        << k.name << ": the steps left every image as it was";
    PlannedBatch eval;
    eval.clear(3, 32);
    Rng rng(1);
    plan_sample(im.px.data(), 3, im.h, im.w, k.cfg, nullptr, false, rng, eval);
    EXPECT_EQ(eval.step_slots, 0) << k.name;
    EXPECT_TRUE(eval.steps.empty()) << k.name;
  }
}

TEST(PlannedBatch, MakePlannedBatchMatchesMakeSourceBatch) {
  // An in-memory set under the timm pipeline: same targets and labels, same images.
  const MemorySource src(noise_dataset(10, 40, 52, 4, 9));
  BatchConfig cfg = rrc_config(24);
  const std::vector<Index> idx = {3, 7, 0, 9, 3};
  const Index B = Index(idx.size()), K = 4, S = 24;
  std::vector<float> images(size_t(B * 3 * S * S)), targets(size_t(B * K)), ptargets(targets);
  std::vector<int32_t> labels(static_cast<size_t>(B)), plabels(labels);
  make_source_batch(src, idx.data(), B, cfg, true, 5, 2, images.data(), targets.data(),
                    labels.data());
  PlannedBatch batch;
  make_planned_batch(src, idx.data(), B, cfg, true, 5, 2, batch, ptargets.data(), plabels.data());
  EXPECT_EQ(targets, ptargets);
  EXPECT_EQ(labels, plabels);
  expect_float_close(expand(batch, normalize_lut(cfg, 3)).f32, images, "make_planned_batch");
  // Outside the timm pipeline an in-memory set's batches are not PIL resizes: refused.
  cfg.rrc = false;
  EXPECT_FALSE(plannable(src, cfg, true));
  EXPECT_THROW(make_planned_batch(src, idx.data(), B, cfg, true, 5, 2, batch, ptargets.data(),
                                  plabels.data()),
               Error);
}

// A folder of photograph-sized JPEGs (DCT-scaled at S = 64: some decode at 1/2 and 1/4), a PNG
// and a truncated JPEG (replaced by the next sample), and the packed sets `vitrain prepare`
// writes from it: make_source_batch and make_planned_batch decode only each crop's pixels
// (Source::read_region), and their batches must be those of whole decodes through timm_sample
// (make_source_batch's bit for bit). Training (random crops, flips, erasing, RandAugment) and
// evaluation (the centre crop).
TEST(PlannedBatch, RegionDecodedBatchesMatchWholeDecodedOnes) {
  const std::string root = ::testing::TempDir() + "/planned_region_" + std::to_string(::getpid());
  const int sizes[][2] = {{375, 500}, {333, 250}, {480, 640}, {96, 80}, {300, 300}, {257, 383}};
  for (int k = 0; k < 6; ++k) {
    const std::string dir = root + "/train/class" + std::to_string(k % 2);
    std::filesystem::create_directories(dir);
    const NoiseImage n = noise(3, sizes[k][0], sizes[k][1], uint64_t(40 + k));
    Image img(int(n.h), int(n.w), 3);  // interleaved, smoothed so the JPEG keeps detail
    for (int y = 0; y < img.h; ++y)
      for (int x = 0; x < img.w; ++x)
        for (int c = 0; c < 3; ++c)
          img.at(y, x)[c] = uint8_t((n.px[size_t((c * n.h + y) * n.w + x)] / 2 + x + 2 * y) % 256);
    const std::vector<uint8_t> bytes = k == 3 ? encode_png(img) : encode_jpeg(img, 90);
    std::ofstream(dir + "/img" + std::to_string(k) + (k == 3 ? ".png" : ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    if (k == 5) {  // a truncated copy
      std::ofstream(dir + "/img_truncated.jpg", std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size() / 2));
    }
  }
  const FolderIndex idx = index_image_folder(root + "/train");
  ::testing::internal::CaptureStderr();  // the packers and loaders warn about the truncated file
  write_packed(root + "/jpeg.vitpack", idx, 400, true, 90, 1);
  write_packed(root + "/raw.vitpack", idx, 160, false, 90, 1);
  // Each pipeline reads through a source of its own, so each finds the truncated file itself.
  auto sources = [&](const std::string& kind) -> std::unique_ptr<Source> {
    if (kind == "folder") return std::make_unique<FolderSource>(idx);
    return std::make_unique<PackedSource>(root + "/" + kind + ".vitpack");
  };
  const Index S = 64, K = 2;
  BatchConfig train_cfg = rrc_config(S);
  train_cfg.reprob = 0.5;
  train_cfg.auto_augment = "rand-m9-mstd0.5-inc1";
  BatchConfig eval_cfg = base_config(S);
  eval_cfg.eval_crop_pct = 0.875;
  for (const std::string kind : {"folder", "jpeg", "raw"})
    for (bool train : {true, false}) {
      const std::unique_ptr<Source> ref_src = sources(kind), cpu_src = sources(kind),
                                    planned_src = sources(kind);
      const Source* src = ref_src.get();
      const BatchConfig& cfg = train ? train_cfg : eval_cfg;
      std::vector<Index> order;
      for (Index i = 0; i < src->size(); ++i) order.push_back(i);
      order.push_back(0);  // the same sample twice: its own draws each time
      const Index B = Index(order.size());
      // The reference: every sample decoded whole (read_or_replace), then timm_sample.
      std::vector<float> images(size_t(B * 3 * S * S));
      const std::unique_ptr<RandAugment> ra = make_rand_augment(cfg, train);
      for (Index b = 0; b < B; ++b) {
        Planar px;
        read_or_replace(*src, order[size_t(b)], decode_min_side(cfg, train), px);
        Rng rng(mix_seed(8, 1, uint64_t(order[size_t(b)])));
        timm_sample(px.px.data(), 3, px.h, px.w, cfg, ra.get(), train, rng,
                    images.data() + b * 3 * S * S);
      }
      std::vector<float> cpu(images.size()), targets(size_t(B * K)), pt(targets);
      std::vector<int32_t> labels(static_cast<size_t>(B)), pl(labels);
      make_source_batch(*cpu_src, order.data(), B, cfg, train, 8, 1, cpu.data(), targets.data(),
                        labels.data());
      PlannedBatch batch;
      make_planned_batch(*planned_src, order.data(), B, cfg, train, 8, 1, batch, pt.data(),
                         pl.data());
      const std::string what = kind + (train ? " train" : " eval");
      if (kind == "folder") {
        for (const Source* s : {ref_src.get(), cpu_src.get(), planned_src.get()})
          EXPECT_EQ(s->unreadable_count(), 1u) << what << ": the truncated file, found by each";
      }
      EXPECT_EQ(targets, pt) << what;
      EXPECT_EQ(labels, pl) << what;
      EXPECT_EQ(cpu, images) << what << ": make_source_batch";
      expect_float_close(expand(batch, normalize_lut(cfg, 3)).f32, images, what);
    }
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("img_truncated.jpg"), std::string::npos) << warnings;
  std::filesystem::remove_all(root);
}

TEST(PlannedBatch, MixesAsTheCpuPipeline) {
  // The normalisation op's mixup/cutmix (the batch's draw applied where the images are made)
  // gives bit for bit what the CPU pipeline's mix_images makes of the unmixed images, for odd
  // and even batches, both modes, and the targets as apply_mixup mixes them; erased boxes are
  // mixed as the CPU pipeline mixes them (erasing first).
  const MemorySource src(noise_dataset(12, 30, 34, 4, 21));
  BatchConfig cfg = rrc_config(16);
  cfg.reprob = 0.5;
  const MixupConfig mix{0.8, 1.0, 1.0, 0.5};
  const Index K = 4, S = 16, C = 3;
  const std::vector<float> lut = normalize_lut(cfg, C);
  int cutmix = 0, mixup = 0;
  for (Index B : {Index(5), Index(6)})
    for (uint64_t k = 0; k < 12; ++k) {
      std::vector<Index> idx;
      for (Index i = 0; i < B; ++i) idx.push_back((i * 5 + Index(k)) % 12);
      std::vector<float> targets(size_t(B * K)), want_targets;
      std::vector<int32_t> labels(static_cast<size_t>(B));
      PlannedBatch batch;
      make_planned_batch(src, idx.data(), B, cfg, true, 3, k, batch, targets.data(), labels.data());
      std::vector<float> want = expand(batch, lut).f32;  // unmixed
      want_targets = targets;
      const MixupResult r = apply_mixup(mix, want.data(), want_targets.data(), B, C, S, K, 7, 1, k);
      EXPECT_EQ(draw_mixup(mix, B, S, 7, 1, k).lam, r.lam);
      batch.mix = r.batch_mix();
      mix_targets(r, targets.data(), B, K);
      const std::vector<float> got = expand(batch, lut).f32;
      const std::string what = "B=" + std::to_string(B) + " batch " + std::to_string(k);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
      EXPECT_EQ(targets, want_targets) << what;
      if (r.lam != 1.0) (r.cutmix ? cutmix : mixup) += 1;
    }
  EXPECT_GT(cutmix, 2);  // both modes were drawn
  EXPECT_GT(mixup, 2);
}

TEST(PlannedBatch, LoaderPlansTheBatchesItLoads) {
  // Worker threads (forced for an in-memory set) build float and planned batches side by side:
  // each planned batch expands to the float batch of the same (epoch, k), same targets/labels,
  // with and without RandAugment.
  const MemorySource src(noise_dataset(24, 30, 26, 3, 11));
  BatchConfig cfg = base_config(20);
  cfg.rrc = true;
  cfg.hflip = 0.5;
  const Index B = 4, K = 3, S = 20;
  LoaderOptions opt;
  opt.workers = 2;
  opt.force_threads = true;
  Loader loader(src, B, true, 3, opt);
  const std::vector<float> lut = normalize_lut(cfg, 3);
  for (const char* aa : {"", "rand-m9-mstd0.5-inc1"}) {
    cfg.auto_augment = aa;
    for (uint64_t epoch = 0; epoch < 2; ++epoch)
      for (Index k = 0; k < loader.batches_per_epoch(); ++k) {
        std::vector<float> images(size_t(B * 3 * S * S)), targets(size_t(B * K)), ptargets(targets);
        std::vector<int32_t> labels(static_cast<size_t>(B)), plabels(labels);
        PlannedBatch plan;
        loader.load_planned(epoch, k, cfg, plan, ptargets.data(), plabels.data());
        loader.load(epoch, k, cfg, images.data(), targets.data(), labels.data());
        ASSERT_EQ(plan.size(), B);
        EXPECT_EQ(targets, ptargets);
        EXPECT_EQ(labels, plabels);
        expect_float_close(
            expand(plan, lut).f32, images,
            std::string(aa) + " epoch " + std::to_string(epoch) + " batch " + std::to_string(k));
      }
  }
  cfg.auto_augment.clear();
  cfg.rrc = false;  // an in-memory set's pad-and-crop path runs on the CPU: one clear error
  std::vector<float> targets(size_t(B * K));
  PlannedBatch plan;
  EXPECT_THROW(loader.load_planned(0, 0, cfg, plan, targets.data()), Error);
}
