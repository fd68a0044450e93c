// Image decoding/encoding: JPEG (libjpeg-turbo, libjpeg API) and PNG (libpng), plus an
// antialiased downscale. Every decoded image is 8-bit RGB, (H, W, 3) interleaved.
//
// Decoding rules:
// * The format is detected from the magic bytes (JPEG: FF D8 FF; PNG: 89 'PNG' 0D 0A 1A 0A),
//   never from the file name.
// * JPEG: grayscale is replicated to RGB; CMYK/YCCK (Adobe) is converted to RGB. With
//   min_side_hint > 0 the decoder uses libjpeg's DCT-domain scaling: it picks the SMALLEST of the
//   scales 1/8, 1/4, 1/2, 1 whose output short side is still >= min_side_hint (so a 500x375 image
//   with hint 160 decodes at 1/2 to 250x188). Hint 0 (or a hint larger than the image) = full size.
// * PNG: any bit depth / colour type; palette and low-bit gray are expanded, gray is replicated,
//   alpha is dropped (not composited, like PIL's convert("RGB")), 16-bit is scaled to 8-bit.
//   min_side_hint is ignored for PNG.
// * Corrupt or truncated data -> vit::Error (never a crash or a process exit). libjpeg's
//   non-fatal "corrupt data" warnings (e.g. extraneous bytes before a marker, common in ImageNet)
//   are tolerated, but a premature end of the JPEG data is an error (like PIL's default).
// * Images above 2^28 pixels are refused (protects against garbage headers).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/image.h"

namespace vit::data {

enum class ImageFormat { Unknown, Jpeg, Png };

// Format from the first bytes; Unknown when neither magic matches.
ImageFormat sniff_image_format(const uint8_t* bytes, size_t n);

// Decodes an in-memory JPEG or PNG to RGB (c == 3). Throws vit::Error("... decoding JPEG: <why>").
Image decode_image(const uint8_t* bytes, size_t n, int min_side_hint = 0);

// A rectangle of an image: rows [top, top + height), columns [left, left + width).
struct Rect {
  int top = 0, left = 0, height = 0, width = 0;
};
// Chooses, from the decoded image's size (h, w), the part of it to keep.
using RegionPicker = std::function<Rect(int h, int w)>;

// Whether r is a non-empty rectangle inside an (h, w) image; region_error says why not.
inline bool region_inside(const Rect& r, int h, int w) {
  return r.top >= 0 && r.left >= 0 && r.height >= 1 && r.width >= 1 && r.top + r.height <= h &&
         r.left + r.width <= w;
}
std::string region_error(const Rect& r, int h, int w);

// decode_image, keeping only the region `pick` chooses once the (DCT-scaled) size is known:
// the pixels are those of the whole decode, cropped. A JPEG decodes only the iMCU columns that
// cover the region (not for progressive files), skips most of the IDCT, upsampling and colour
// conversion of the rows above it, and stops after it when the data ends with the EOI marker or has
// been consumed (else it decodes the rest, to fail on a truncated file as a whole decode does); a
// PNG decodes whole. So a truncated file fails whatever the region, but a complete one with a
// malformed marker after its scan data decodes here and fails in a whole decode. A null picker
// keeps everything. A region outside the image is a vit::Error; what the picker throws is rethrown
// as it is.
Image decode_image_region(const uint8_t* bytes, size_t n, int min_side_hint,
                          const RegionPicker& pick);

// decode_image_file, keeping only the region `pick` chooses (as decode_image_region).
Image decode_image_file_region(const std::string& path, int min_side_hint,
                               const RegionPicker& pick);

// The region r of img (a copy); vit::Error when r is not inside img.
Image crop_image(const Image& img, const Rect& r);

// Reads and decodes a file; errors name the file ("<path>: corrupt JPEG: ...").
Image decode_image_file(const std::string& path, int min_side_hint = 0);

// Baseline JPEG (4:2:0 chroma subsampling, quality 1..100) of an image with c == 1 or 3.
std::vector<uint8_t> encode_jpeg(const Image& img, int quality);

// 8-bit PNG (gray for c == 1, RGB for c == 3, RGBA for c == 4); used by tests and debug dumps.
std::vector<uint8_t> encode_png(const Image& img);

// Antialiased (area-weighted triangle filter, like PIL's reducing bilinear) downscale so that the
// longer side is <= max_side, aspect ratio kept (each side rounded, at least 1). Returns a copy
// when already small enough or max_side <= 0.
Image resize_max_side(const Image& img, int max_side);

// General antialiased bilinear resize to (out_h, out_w); upscaling is plain bilinear.
Image resize_bilinear_aa(const Image& img, int out_h, int out_w);

}  // namespace vit::data
