// decode_image_region: decoding only the part of a JPEG a random crop needs (libjpeg-turbo's
// jpeg_crop_scanline and jpeg_skip_scanlines) must give exactly the pixels of the whole decode,
// cropped, for every chroma subsampling, baseline and progressive files, every DCT scale, and
// regions at every edge; errors (a truncated file, a bad region, a throwing picker) as clear as
// the whole decode's.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/rng.h"
#include "data/decode.h"
#include "jpeg_test_util.h"

namespace {

using vit::data::decode_image;
using vit::data::decode_image_region;
using vit::data::Image;
using vit::data::Rect;

// A photograph-like test image: smooth gradients, edges and noise, so every DCT coefficient
// and the chroma planes carry detail.
Image test_image(int h, int w, int c, uint64_t seed) {
  Image img(h, w, c);
  vit::Rng rng(seed);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k) {
        const int smooth = (x * (k + 1) * 255 / w + y * (3 - k) * 127 / h) % 256;
        const int edge = ((x / 13 + y / 7) % 2) * 60;
        img.at(y, x)[k] = uint8_t((smooth + edge + int(rng.below(40))) % 256);
      }
  return img;
}

using vit::test::JpegKind;

std::vector<uint8_t> encode(const Image& img, const JpegKind& k) {
  return vit::test::encode_jpeg_kind(img, k);
}

// channels: 1 (grayscale), 3 (YCbCr) or 4 (Adobe CMYK).
struct Kind {
  JpegKind jpeg;
  int channels;
};
const Kind kKinds[] = {
    {{"420"}, 3},
    {{"422", 2, 1}, 3},
    {{"440", 1, 2}, 3},
    {{"444", 1, 1}, 3},
    {{"gray", 1, 1}, 1},
    {{"420_progressive", 2, 2, true}, 3},
    {{"444_progressive", 1, 1, true}, 3},
    {{"420_restarts", 2, 2, false, 1}, 3},
    {{"cmyk", 1, 1}, 4},
};

// Regions of an (h, w) image: the whole, its corners and edges, bands, single pixels and
// rows, and random boxes of random-crop sizes.
std::vector<Rect> regions(int h, int w, uint64_t seed) {
  std::vector<Rect> r = {{0, 0, h, w},
                         {0, 0, 1, 1},
                         {h - 1, w - 1, 1, 1},
                         {0, 0, h, 1},
                         {0, w - 1, h, 1},
                         {0, 0, 1, w},
                         {h - 1, 0, 1, w},
                         {h / 3, 0, h / 3 + 1, w},
                         {0, w / 3, h, w / 3 + 1},
                         {1, 1, h - 2, w - 2},
                         {h / 2, w / 2, h - h / 2, w - w / 2}};
  vit::Rng rng(seed);
  for (int i = 0; i < 24; ++i) {
    Rect b;
    b.height = 1 + int(rng.below(uint64_t(h)));
    b.width = 1 + int(rng.below(uint64_t(w)));
    b.top = int(rng.below(uint64_t(h - b.height + 1)));
    b.left = int(rng.below(uint64_t(w - b.width + 1)));
    r.push_back(b);
  }
  return r;
}

// The region decode against the whole decode, cropped, bit for bit.
void expect_regions_match(const std::vector<uint8_t>& jpeg, int hint, const std::string& what) {
  const Image whole = decode_image(jpeg.data(), jpeg.size(), hint);
  for (const Rect& r : regions(whole.h, whole.w, uint64_t(hint) * 7 + jpeg.size())) {
    int fh = 0, fw = 0;
    const Image got = decode_image_region(jpeg.data(), jpeg.size(), hint, [&](int h, int w) {
      fh = h, fw = w;  // the size the picker sees is the whole decode's
      return r;
    });
    ASSERT_EQ(fh, whole.h) << what;
    ASSERT_EQ(fw, whole.w) << what;
    const Image want = vit::data::crop_image(whole, r);
    ASSERT_EQ(got.h, r.height);
    ASSERT_EQ(got.w, r.width);
    ASSERT_EQ(got.c, 3);
    EXPECT_EQ(std::memcmp(got.px.data(), want.px.data(), want.px.size()), 0)
        << what << ": region " << r.height << "x" << r.width << " at (" << r.top << ", " << r.left
        << ") of " << whole.h << "x" << whole.w;
  }
}

class DecodeRegion : public ::testing::TestWithParam<Kind> {};

TEST_P(DecodeRegion, IsTheWholeDecodeCroppedAtEveryScale) {
  const Kind& kind = GetParam();
  const JpegKind& k = kind.jpeg;
  // Odd sizes: partial iMCUs at the right and bottom edges.
  for (auto [h, w] : {std::pair{375, 500}, std::pair{203, 317}, std::pair{17, 9}}) {
    std::vector<uint8_t> jpeg = encode(test_image(h, w, kind.channels, uint64_t(h + w)), k);
    // As written (ending with EOI: the decode stops after the region), then with bytes after
    // EOI, as many cameras write (the rows below the region are decoded to find a truncation).
    for (const char* tail : {"", " + trailing bytes"}) {
      if (*tail) jpeg.insert(jpeg.end(), {0, 0});
      // Hints that pick the scales 1/8, 1/4, 1/2 and 1 of the 375 x 500 image, and none.
      for (int hint : {0, 40, 90, 180, 375})
        expect_regions_match(jpeg, hint,
                             std::string(k.name) + tail + " " + std::to_string(h) + "x" +
                                 std::to_string(w) + " hint " + std::to_string(hint));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, DecodeRegion, ::testing::ValuesIn(kKinds),
                         [](const auto& info) { return std::string(info.param.jpeg.name); });

TEST(DecodeRegionErrors, ATruncatedFileFailsWhateverTheRegion) {
  std::vector<uint8_t> jpeg = encode(test_image(240, 320, 3, 5), kKinds[0].jpeg);
  jpeg.resize(jpeg.size() * 2 / 3);  // the bottom third of the scan is gone
  EXPECT_THROW(decode_image(jpeg.data(), jpeg.size()), vit::Error);
  // Cropped regions, and full-width ones (no horizontal crop: the rows below are read too).
  for (const Rect& r : {Rect{0, 0, 16, 16}, Rect{0, 100, 40, 200}, Rect{220, 300, 20, 20},
                        Rect{0, 0, 16, 320}, Rect{0, 2, 16, 316}, Rect{40, 0, 1, 320}}) {
    EXPECT_THROW(decode_image_region(jpeg.data(), jpeg.size(), 0, [&](int, int) { return r; }),
                 vit::Error)
        << "region at (" << r.top << ", " << r.left << ")";
  }
}

// A progressive file cut at a scan boundary (its last scan missing) is accepted by a whole
// decode (libjpeg only warns), whose block smoothing then fills in the missing coefficients
// from neighbouring blocks: a region must still be that decode's pixels.
TEST(DecodeRegionErrors, AnIncompleteProgressiveFileDecodesAsAWholeDecodeDoes) {
  std::vector<uint8_t> jpeg =
      encode(test_image(203, 317, 3, 13), vit::test::JpegKind{"420_progressive", 2, 2, true});
  size_t last_sos = 0;
  for (size_t i = 0; i + 1 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xDA) last_sos = i;
  ASSERT_GT(last_sos, 0u);
  jpeg.resize(last_sos);
  ASSERT_NO_THROW(decode_image(jpeg.data(), jpeg.size()));
  for (int hint : {0, 90}) expect_regions_match(jpeg, hint, "progressive cut before its last scan");
}

TEST(DecodeRegionErrors, ABadRegionOrAThrowingPickerIsAClearError) {
  const Image img = test_image(40, 60, 3, 9);
  for (const std::vector<uint8_t>& bytes :
       {encode(img, kKinds[0].jpeg), vit::data::encode_png(img)}) {
    for (const Rect& bad :
         {Rect{0, 0, 41, 10}, Rect{-1, 0, 5, 5}, Rect{0, 55, 5, 6}, Rect{0, 0, 0, 5}})
      try {
        decode_image_region(bytes.data(), bytes.size(), 0, [&](int, int) { return bad; });
        ADD_FAILURE() << "no error for a region outside the image";
      } catch (const vit::Error& e) {
        EXPECT_NE(std::string(e.what()).find("outside"), std::string::npos) << e.what();
      }
    try {
      decode_image_region(bytes.data(), bytes.size(), 0,
                          [](int, int) -> Rect { throw vit::Error("the picker's own error"); });
      ADD_FAILURE() << "no error from a throwing picker";
    } catch (const vit::Error& e) {
      EXPECT_NE(std::string(e.what()).find("the picker's own error"), std::string::npos);
    }
    // Whatever the picker throws comes out as it is (not as a corrupt file).
    EXPECT_THROW(decode_image_region(bytes.data(), bytes.size(), 0,
                                     [](int, int) -> Rect { throw std::logic_error("a bug"); }),
                 std::logic_error);
  }
}

TEST(DecodeRegionErrors, APngRegionIsTheWholeDecodeCropped) {
  const Image img = test_image(37, 53, 3, 11);
  const std::vector<uint8_t> png = vit::data::encode_png(img);
  const Rect r{5, 7, 20, 30};
  int fh = 0, fw = 0;
  const Image got = decode_image_region(png.data(), png.size(), 0, [&](int h, int w) {
    fh = h, fw = w;
    return r;
  });
  EXPECT_EQ(fh, 37);
  EXPECT_EQ(fw, 53);
  const Image want = vit::data::crop_image(img, r);
  EXPECT_EQ(got.px, want.px);
}

// fuzz_jpeg's comparison with the whole decode found this 102-byte file: a sequential frame of
// three components, the third sampled 2x4 above the first, whose only scan holds the first
// component alone (so a multi-scan file), cut short. Cropped, libjpeg-turbo 2.1 left the right
// half of the window with whatever its buffers held (seen under ASan's malloc fill); such files
// are decoded uncropped. At the DCT scale 1/2 (hint 8) the image is 12x5893.
TEST(DecodeRegionErrors, AMultiScanFileWithASubsampledFirstComponentIsNotCropped) {
  const std::vector<uint8_t> jpg = {
      0xff, 0xd8, 0xff, 0xdb, 0x00, 0x43, 0x00, 0x5b, 0xf7, 0x04, 0x05, 0x06, 0x05, 0x04, 0x3e,
      0x06, 0x06, 0x07, 0x07, 0x06, 0x08, 0x0a, 0x0f, 0x0c, 0x10, 0x17, 0x14, 0x18, 0x18, 0x17,
      0x14, 0x16, 0x16, 0x23, 0x1d, 0x25, 0x89, 0x50, 0x47, 0xf2, 0x00, 0x13, 0x00, 0x00, 0x00,
      0x2c, 0x19, 0x27, 0x29, 0x26, 0x29, 0x2a, 0x23, 0x20, 0x2a, 0x0e, 0x41, 0x64, 0x6f, 0x62,
      0x65, 0x00, 0x64, 0x00, 0x00, 0x01, 0x16, 0x00, 0x00, 0x28, 0x28, 0xff, 0xc0, 0x00, 0x11,
      0x08, 0x00, 0x18, 0x2e, 0x0a, 0x03, 0x01, 0x11, 0x00, 0x02, 0x11, 0x01, 0x03, 0x24, 0x17,
      0xff, 0xda, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3f, 0xa9, 0xff, 0xd1,
  };
  const Image whole = decode_image(jpg.data(), jpg.size(), 8);
  ASSERT_EQ(whole.h, 12);
  ASSERT_EQ(whole.w, 5893);
  const Rect r{7, 2891, 4, 893};
  const Image got = decode_image_region(jpg.data(), jpg.size(), 8, [&](int, int) { return r; });
  EXPECT_EQ(got.px, vit::data::crop_image(whole, r).px);
}

}  // namespace
