// JPEG/PNG decoding, DCT-domain scaling, encoders and the antialiased downscale.
#include <gtest/gtest.h>
#include <png.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/common.h"
#include "data/decode.h"
#include "jpeg_test_util.h"

using namespace vit::data;
namespace fs = std::filesystem;

namespace {

Image gradient(int h, int w, int c = 3) {
  Image img(h, w, c);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < c; ++ch)
        img.at(y, x)[ch] = uint8_t((x * 255 / std::max(1, w - 1) * (ch + 1) / 3 +
                                    y * 255 / std::max(1, h - 1) * (3 - ch) / 3) /
                                   2);
  return img;
}

double mean_abs_diff(const Image& a, const Image& b) {
  EXPECT_EQ(a.px.size(), b.px.size());
  double s = 0;
  for (size_t i = 0; i < a.px.size(); ++i) s += std::abs(int(a.px[i]) - int(b.px[i]));
  return s / double(a.px.size());
}

// PNG writer using libpng directly with arbitrary colour type / bit depth, to exercise the
// decoder's conversions independently of encode_png.
std::vector<uint8_t> write_png_raw(int w, int h, int color, int depth,
                                   const std::vector<uint8_t>& data, int rowbytes,
                                   const std::vector<png_color>* palette = nullptr) {
  std::vector<uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) std::abort();
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep d, png_size_t n) {
        auto* o = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(p));
        o->insert(o->end(), d, d + n);
      },
      [](png_structp) {});
  png_set_IHDR(png, info, w, h, depth, color, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (palette) png_set_PLTE(png, info, palette->data(), int(palette->size()));
  png_write_info(png, info);
  std::vector<png_bytep> rows(h);
  for (int y = 0; y < h; ++y) rows[y] = const_cast<uint8_t*>(data.data()) + size_t(y) * rowbytes;
  png_write_image(png, rows.data());
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return out;
}

}  // namespace

TEST(Decode, SniffMagic) {
  const uint8_t jpg[] = {0xFF, 0xD8, 0xFF, 0xE0};
  const uint8_t png[] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  const uint8_t junk[] = {'G', 'I', 'F', '8'};
  EXPECT_EQ(sniff_image_format(jpg, 4), ImageFormat::Jpeg);
  EXPECT_EQ(sniff_image_format(png, 8), ImageFormat::Png);
  EXPECT_EQ(sniff_image_format(junk, 4), ImageFormat::Unknown);
  EXPECT_EQ(sniff_image_format(png, 5), ImageFormat::Unknown);
  EXPECT_THROW(decode_image(junk, 4), vit::Error);
  EXPECT_THROW(decode_image(nullptr, 0), vit::Error);
}

TEST(Decode, PngRoundTripExact) {
  for (int c : {3, 1, 4}) {
    Image img = gradient(37, 53, c);
    auto bytes = encode_png(img);
    Image d = decode_image(bytes.data(), bytes.size());
    ASSERT_EQ(d.h, 37);
    ASSERT_EQ(d.w, 53);
    ASSERT_EQ(d.c, 3);
    for (int y = 0; y < img.h; ++y)
      for (int x = 0; x < img.w; ++x)
        for (int ch = 0; ch < 3; ++ch) {
          const int src_ch = c == 1 ? 0 : ch;  // gray replicated, alpha dropped
          ASSERT_EQ(d.at(y, x)[ch], img.at(y, x)[src_ch]) << c << " " << y << " " << x;
        }
  }
}

TEST(Decode, PngPalette16BitAndLowBitGray) {
  // Palette.
  std::vector<png_color> pal = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}};
  std::vector<uint8_t> idx(4 * 3);
  for (int i = 0; i < 12; ++i) idx[i] = uint8_t(i % 4);
  auto b = write_png_raw(4, 3, PNG_COLOR_TYPE_PALETTE, 8, idx, 4, &pal);
  Image d = decode_image(b.data(), b.size());
  ASSERT_EQ(d.c, 3);
  for (int i = 0; i < 12; ++i) {
    const png_color& p = pal[i % 4];
    EXPECT_EQ(d.px[3 * i], p.red);
    EXPECT_EQ(d.px[3 * i + 1], p.green);
    EXPECT_EQ(d.px[3 * i + 2], p.blue);
  }
  // 16-bit RGB, big-endian samples: 0xABCD -> scaled to 8 bit ~ 0xAB.
  std::vector<uint8_t> rgb16(2 * 2 * 6);
  for (size_t i = 0; i < rgb16.size(); i += 2) rgb16[i] = 0xAB, rgb16[i + 1] = 0xCD;
  b = write_png_raw(2, 2, PNG_COLOR_TYPE_RGB, 16, rgb16, 12);
  d = decode_image(b.data(), b.size());
  ASSERT_EQ(d.c, 3);
  for (uint8_t v : d.px) EXPECT_NEAR(int(v), 0xAB, 1);
  // 1-bit gray: pixels 1,0,1,0 -> 255,0,255,0.
  std::vector<uint8_t> g1 = {0xA0};
  b = write_png_raw(4, 1, PNG_COLOR_TYPE_GRAY, 1, g1, 1);
  d = decode_image(b.data(), b.size());
  ASSERT_EQ(d.w, 4);
  EXPECT_EQ(d.at(0, 0)[0], 255);
  EXPECT_EQ(d.at(0, 1)[1], 0);
  EXPECT_EQ(d.at(0, 2)[2], 255);
}

TEST(Decode, JpegRoundTripClose) {
  Image img = gradient(64, 96);
  auto bytes = encode_jpeg(img, 95);
  ASSERT_EQ(sniff_image_format(bytes.data(), bytes.size()), ImageFormat::Jpeg);
  Image d = decode_image(bytes.data(), bytes.size());
  ASSERT_EQ(d.h, 64);
  ASSERT_EQ(d.w, 96);
  ASSERT_EQ(d.c, 3);
  EXPECT_LT(mean_abs_diff(img, d), 2.0);
  // Lower quality -> smaller file, still close on a smooth gradient.
  auto small = encode_jpeg(img, 40);
  EXPECT_LT(small.size(), bytes.size());
  Image d2 = decode_image(small.data(), small.size());
  EXPECT_LT(mean_abs_diff(img, d2), 5.0);
}

TEST(Decode, JpegGrayscaleBecomesRgb) {
  Image img = gradient(20, 30, 1);
  auto bytes = encode_jpeg(img, 95);
  Image d = decode_image(bytes.data(), bytes.size());
  ASSERT_EQ(d.c, 3);
  double err = 0;
  for (int y = 0; y < 20; ++y)
    for (int x = 0; x < 30; ++x) {
      EXPECT_EQ(d.at(y, x)[0], d.at(y, x)[1]);
      EXPECT_EQ(d.at(y, x)[0], d.at(y, x)[2]);
      err += std::abs(int(d.at(y, x)[0]) - int(img.at(y, x)[0]));
    }
  EXPECT_LT(err / 600, 2.0);
}

TEST(Decode, JpegDctScalingPicksSmallestSufficientScale) {
  auto bytes = encode_jpeg(gradient(375, 500), 90);
  struct Case {
    int hint, h, w;
  };
  // Scales: 1/8 -> 63x47 (ceil), 1/4 -> 125x94, 1/2 -> 250x188, 1 -> 500x375.
  for (Case c : {Case{0, 375, 500}, Case{160, 188, 250}, Case{188, 188, 250}, Case{189, 375, 500},
                 Case{94, 94, 125}, Case{47, 47, 63}, Case{1, 47, 63}, Case{1000, 375, 500}}) {
    Image d = decode_image(bytes.data(), bytes.size(), c.hint);
    EXPECT_EQ(d.h, c.h) << "hint " << c.hint;
    EXPECT_EQ(d.w, c.w) << "hint " << c.hint;
    EXPECT_GE(std::min(d.h, d.w), std::min(c.hint, 375));
  }
  // The scaled decode approximates a downscale of the full image.
  Image full = decode_image(bytes.data(), bytes.size());
  Image half = decode_image(bytes.data(), bytes.size(), 160);
  Image ref = resize_bilinear_aa(full, half.h, half.w);
  EXPECT_LT(mean_abs_diff(ref, half), 3.0);
  // PNG ignores the hint.
  auto png = encode_png(gradient(40, 50));
  Image p = decode_image(png.data(), png.size(), 10);
  EXPECT_EQ(p.h, 40);
}

TEST(Decode, CorruptAndTruncatedThrow) {
  auto jpg = encode_jpeg(gradient(64, 64), 90);
  auto png = encode_png(gradient(64, 64));
  // Truncations at many points, including inside the headers: always vit::Error, never a crash.
  for (size_t cut : {size_t(3), size_t(10), size_t(100), jpg.size() / 2, jpg.size() - 10}) {
    EXPECT_THROW(decode_image(jpg.data(), cut), vit::Error) << "jpeg cut " << cut;
  }
  for (size_t cut : {size_t(8), size_t(20), size_t(40), png.size() / 2, png.size() - 4}) {
    EXPECT_THROW(decode_image(png.data(), cut), vit::Error) << "png cut " << cut;
  }
  // Sweep: any cut inside the entropy-coded data is an error.
  for (size_t cut = 0; cut + 8 < jpg.size(); cut += 13)
    EXPECT_THROW(decode_image(jpg.data(), cut), vit::Error) << "jpeg cut " << cut;
  for (size_t cut = 0; cut + 12 < png.size(); cut += 13)
    EXPECT_THROW(decode_image(png.data(), cut), vit::Error) << "png cut " << cut;
  // Only the final EOI marker missing: every pixel is there, accepted.
  Image no_eoi = decode_image(jpg.data(), jpg.size() - 2);
  Image full = decode_image(jpg.data(), jpg.size());
  EXPECT_EQ(no_eoi.px, full.px);
  // Garbage after the magic.
  std::vector<uint8_t> bad(jpg.begin(), jpg.begin() + 4);
  bad.resize(500, 0x5A);
  EXPECT_THROW(decode_image(bad.data(), bad.size()), vit::Error);
  std::vector<uint8_t> badp(png.begin(), png.begin() + 8);
  badp.resize(500, 0x5A);
  EXPECT_THROW(decode_image(badp.data(), badp.size()), vit::Error);
  // Corrupted PNG image data (CRC / zlib error).
  std::vector<uint8_t> flip = png;
  for (size_t i = png.size() / 2; i < png.size() / 2 + 16; ++i) flip[i] ^= 0xFF;
  EXPECT_THROW(decode_image(flip.data(), flip.size()), vit::Error);
  // Message says what went wrong.
  try {
    decode_image(jpg.data(), jpg.size() / 2);
    FAIL();
  } catch (const vit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("JPEG"), std::string::npos) << e.what();
  }
}

TEST(Decode, FileErrorsNameTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("vit_decode_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto jpg = encode_jpeg(gradient(32, 32), 90);
  const std::string good = (dir / "good.png").string();  // JPEG bytes, wrong extension: fine
  std::ofstream(good, std::ios::binary)
      .write(reinterpret_cast<const char*>(jpg.data()), jpg.size());
  const std::string bad = (dir / "bad.jpg").string();
  std::ofstream(bad, std::ios::binary).write(reinterpret_cast<const char*>(jpg.data()), 50);
  EXPECT_EQ(decode_image_file(good).h, 32);
  for (const std::string& p : {bad, (dir / "missing.jpg").string()}) {
    try {
      decode_image_file(p);
      ADD_FAILURE() << p;
    } catch (const vit::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

TEST(Decode, ResizeMaxSide) {
  Image img = gradient(300, 400);
  Image r = resize_max_side(img, 100);
  EXPECT_EQ(r.w, 100);
  EXPECT_EQ(r.h, 75);
  EXPECT_EQ(r.c, 3);
  // Unchanged when already small.
  Image same = resize_max_side(img, 400);
  EXPECT_EQ(same.px, img.px);
  // Constant image stays constant (weights normalised).
  Image flat(50, 70, 3);
  std::fill(flat.px.begin(), flat.px.end(), 123);
  for (uint8_t v : resize_max_side(flat, 13).px) ASSERT_EQ(v, 123);
  // Area averaging: a 1-pixel checkerboard reduced 4x becomes ~uniform grey (no aliasing).
  Image cb(64, 64, 1);
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 64; ++x) cb.at(y, x)[0] = ((x + y) & 1) ? 255 : 0;
  Image small = resize_max_side(cb, 16);
  ASSERT_EQ(small.h, 16);
  for (uint8_t v : small.px) EXPECT_NEAR(int(v), 128, 2);
  // Close to the full-res gradient sampled at the output centres.
  Image g = resize_max_side(gradient(200, 200), 50);
  Image g_ref = gradient(50, 50);
  EXPECT_LT(mean_abs_diff(g, g_ref), 3.0);
  // Extreme aspect ratio keeps at least one pixel.
  Image thin = resize_max_side(gradient(2, 1000), 100);
  EXPECT_EQ(thin.w, 100);
  EXPECT_EQ(thin.h, 1);
}

TEST(Decode, JpegAdobeCmykBecomesRgb) {
  // Adobe-style (inverted) CMYK JPEG written with libjpeg directly: stored (C,M,Y,K) =
  // (200,100,50,255) means RGB (200,100,50).
  const int w = 16, h = 8;
  Image cmyk(h, w, 4);
  for (size_t i = 0; i < cmyk.px.size(); i += 4)
    cmyk.px[i] = 200, cmyk.px[i + 1] = 100, cmyk.px[i + 2] = 50, cmyk.px[i + 3] = 255;
  const std::vector<uint8_t> jpeg =
      vit::test::encode_jpeg_kind(cmyk, {"cmyk", 1, 1, false, 0, 100});
  Image d = decode_image(jpeg.data(), jpeg.size());
  ASSERT_EQ(d.c, 3);
  ASSERT_EQ(d.w, w);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      EXPECT_NEAR(d.at(y, x)[0], 200, 3);
      EXPECT_NEAR(d.at(y, x)[1], 100, 3);
      EXPECT_NEAR(d.at(y, x)[2], 50, 3);
    }
}

// Decompression bombs: a small JPEG whose header claims more pixels than PIL's limit
// (178,956,970) is refused at once with one clear error, before libjpeg allocates or decodes
// (the fuzzer found ~1 KB files claiming 200M-4G pixels that took up to 23 s or 12 GB).
TEST(Decode, DecompressionBombIsRefusedAtOnce) {
  std::vector<uint8_t> jpg = encode_jpeg(gradient(16, 16), 90);
  size_t sof = 0;
  for (size_t i = 2; i + 9 < jpg.size(); ++i)
    if (jpg[i] == 0xFF && (jpg[i + 1] == 0xC0 || jpg[i + 1] == 0xC2)) sof = i;
  ASSERT_GT(sof, 0u);
  auto set_size = [&](int height, int width) {  // SOF: FF Cn, length, precision, H, W
    jpg[sof + 5] = uint8_t(height >> 8), jpg[sof + 6] = uint8_t(height);
    jpg[sof + 7] = uint8_t(width >> 8), jpg[sof + 8] = uint8_t(width);
  };
  set_size(20000, 20000);  // 400M pixels
  try {
    decode_image(jpg.data(), jpg.size(), 8);
    ADD_FAILURE() << "a 20000 x 20000 JPEG was decoded";
  } catch (const vit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("image too large (20000x20000"), std::string::npos)
        << e.what();
  }
  set_size(16, 16);  // the same bytes with the true size decode
  EXPECT_EQ(decode_image(jpg.data(), jpg.size()).w, 16);
}
