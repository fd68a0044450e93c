#include "data/decode.h"

#include <fmt/format.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>

// jpeglib.h needs size_t/FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "core/common.h"
#include "data/stage_clock.h"

namespace vit::data {

namespace {

// PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS * 2, where PIL raises instead of
// warning): images whose header claims more pixels are refused before any decoding. The
// fuzzer's JPEGs of ~1 KB claiming 200M-4G pixels took up to 23 s each, or 12 GB of libjpeg's
// coefficient buffers (progressive), under the old limit of 2^28 output pixels (after DCT
// scaling, so up to 2^34 source pixels).
constexpr uint64_t kMaxPixels = 178956970;
// libjpeg's own allocations (the whole image's DCT coefficients for progressive files: 2 bytes
// per pixel and component): beyond this a clear error, as libjpeg-turbo has no backing store.
constexpr long kJpegMaxMemory = 1536L << 20;

// ---------------------------------------------------------------------------------------------
// libjpeg plumbing. libjpeg reports fatal errors through error_exit, which must not return; we
// longjmp back to the function that called setjmp. That function (and everything libjpeg calls
// in between) holds no C++ objects with non-trivial destructors, so the jump skips nothing; the
// C++ state lives in a context struct owned by the caller, which throws after the jump.

struct JpegErr {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
  bool eof_seen;  // ran out of input (see jpeg_on_message)
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->msg);
  if (e->eof_seen)
    std::snprintf(e->msg + std::strlen(e->msg), sizeof e->msg - std::strlen(e->msg),
                  " (file truncated)");
  longjmp(e->jump, 1);
}

// Warnings (msg_level -1) are tolerated (corrupt-but-decodable data), except a truncated file.
// libjpeg reports running out of input as JWRN_JPEG_EOF (it then feeds a fake EOI marker); that
// alone is harmless when only the final EOI marker is missing (the decoder merely prefetched
// past the end). If the entropy decoder then actually needs bits that are not there it reports
// JWRN_HIT_MARKER and would fill the rest of the image with grey: that is a truncated file.
void jpeg_on_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level != -1) return;  // trace messages
  auto* e = reinterpret_cast<JpegErr*>(cinfo->err);
  const int code = cinfo->err->msg_code;
  if (code == JWRN_JPEG_EOF) {
    e->eof_seen = true;
  } else if (code == JWRN_HIT_MARKER && e->eof_seen) {
    std::snprintf(e->msg, sizeof e->msg, "premature end of JPEG data (file truncated)");
    longjmp(e->jump, 1);
  }
}

struct JpegDecodeCtx {
  const uint8_t* bytes;
  size_t n;
  int hint;
  Image* out;
  char msg[JMSG_LENGTH_MAX];
  const RegionPicker* pick = nullptr;  // null: the whole image
  std::exception_ptr pick_error{};     // what the picker threw, rethrown as it is
};

// The picker's region, checked against the (h, w) image; false with msg set when the picker
// threw or asked for pixels outside. A function of its own: jpeg_decode_impl's setjmp must not
// share a frame with C++ exception handling.
bool pick_region(const RegionPicker& pick, int h, int w, Rect* r, char* msg, size_t msg_size,
                 std::exception_ptr* error) {
  try {
    *r = pick(h, w);
  } catch (...) {
    *error = std::current_exception();
    return false;
  }
  if (!region_inside(*r, h, w)) {
    std::snprintf(msg, msg_size, "region %dx%d at (%d, %d) outside the %dx%d image", r->height,
                  r->width, r->top, r->left, h, w);
    return false;
  }
  return true;
}

bool ends_with_eoi(const uint8_t* bytes, size_t n) {
  return n >= 2 && bytes[n - 2] == 0xFF && bytes[n - 1] == 0xD9;
}

// Output row y of the region from one decoded scanline `s` (comps bytes a pixel, starting at
// the region's first column): RGB as is, CMYK converted.
void put_row(const uint8_t* s, int comps, bool adobe_inverted, int width, uint8_t* row) {
  if (comps == 3) {
    std::memcpy(row, s, size_t(width) * 3);
    return;
  }
  for (int x = 0; x < width; ++x, s += 4) {
    int c = s[0], m = s[1], y = s[2], k = s[3];
    // Adobe writes inverted CMYK (0 = full ink); a plain CMYK file stores ink amounts.
    if (!adobe_inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    row[3 * x + 0] = uint8_t((c * k + 127) / 255);
    row[3 * x + 1] = uint8_t((m * k + 127) / 255);
    row[3 * x + 2] = uint8_t((y * k + 127) / 255);
  }
}

// Whether libjpeg-turbo 2.1's jpeg_crop_scanline gives the whole decode's pixels for this file:
// one interleaved scan whose first component has the largest sampling factors (every common
// layout: grey, 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, CMYK). Not for:
// - multi-scan files (progressive, or sequential with a scan per component), whose entropy
//   decoding is done in jpeg_start_decompress anyway: block smoothing of incompletely loaded
//   progressive data takes the window's first block for its left neighbours' (jdcoefct.c),
//   and a sequential file whose first scan held its first component alone, sampled below
//   another's, came out with uninitialised memory in the window's right half (found by
//   fuzz_jpeg's comparison with the whole decode);
// - a first component sampled below another one (the same file's layout).
bool croppable(const jpeg_decompress_struct& cinfo) {
  if (cinfo.progressive_mode || jpeg_has_multiple_scans(const_cast<j_decompress_ptr>(&cinfo)))
    return false;
  const jpeg_component_info& first = cinfo.comp_info[0];
  return first.h_samp_factor == cinfo.max_h_samp_factor &&
         first.v_samp_factor == cinfo.max_v_samp_factor;
}

// Returns false with ctx.msg set on error.
bool jpeg_decode_impl(JpegDecodeCtx& ctx) {
  jpeg_decompress_struct cinfo;
  JpegErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.emit_message = jpeg_on_message;
  err.msg[0] = '\0';
  err.eof_seen = false;
  if (setjmp(err.jump)) {
    std::snprintf(ctx.msg, sizeof ctx.msg, "%s", err.msg);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  cinfo.mem->max_memory_to_use = kJpegMaxMemory;
  jpeg_mem_src(&cinfo, ctx.bytes, static_cast<unsigned long>(ctx.n));
  jpeg_read_header(&cinfo, TRUE);
  if (uint64_t(cinfo.image_width) * cinfo.image_height > kMaxPixels) {
    std::snprintf(
        ctx.msg, sizeof ctx.msg, "image too large (%ux%u, more than PIL's limit of %llu pixels)",
        cinfo.image_width, cinfo.image_height, static_cast<unsigned long long>(kMaxPixels));
    jpeg_destroy_decompress(&cinfo);
    return false;
  }

  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.dct_method = JDCT_ISLOW;

  // Smallest DCT scale whose short side still reaches the hint.
  cinfo.scale_num = 1;
  cinfo.scale_denom = 1;
  if (ctx.hint > 0) {
    for (unsigned denom : {8u, 4u, 2u}) {
      cinfo.scale_denom = denom;
      jpeg_calc_output_dimensions(&cinfo);
      if (std::min(cinfo.output_width, cinfo.output_height) >= unsigned(ctx.hint)) break;
      cinfo.scale_denom = 1;
    }
  }
  jpeg_calc_output_dimensions(&cinfo);  // at most the source's size, checked above

  jpeg_start_decompress(&cinfo);
  const int w = int(cinfo.output_width), h = int(cinfo.output_height);
  Rect r{0, 0, h, w};
  if (ctx.pick && !pick_region(*ctx.pick, h, w, &r, ctx.msg, sizeof ctx.msg, &ctx.pick_error)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const int comps = cinfo.output_components;  // 3 (RGB) or 4 (CMYK)
  *ctx.out = Image(r.height, r.width, 3);
  uint8_t* dst = ctx.out->px.data();
  if (r.width == w && r.height == h && comps == 3) {  // the whole image, straight into place
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = dst + size_t(cinfo.output_scanline) * w * 3;
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  // A region: libjpeg decodes only the iMCU columns that cover the columns asked for (it widens
  // them to iMCU boundaries) and does no IDCT, upsampling or colour conversion for the rows it
  // skips above. Its fancy upsampler treats the cropped window's first and last columns as
  // image edges (at 4:2:x the two pixels of one chroma sample differ from a whole decode's), so
  // the window reaches kCropMargin pixels beyond the region on each side.
  constexpr int kCropMargin = 4;
  const int lo = std::max(0, r.left - kCropMargin);
  const int hi = std::min(w, r.left + r.width + kCropMargin);
  JDIMENSION x0 = 0, cw = JDIMENSION(w);
  const bool cropped = hi - lo < w && croppable(cinfo);
  if (cropped) {
    x0 = JDIMENSION(lo);
    cw = JDIMENSION(hi - lo);
    jpeg_crop_scanline(&cinfo, &x0, &cw);
  }
  JSAMPARRAY buf = (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                              cw * JDIMENSION(comps), 1);
  const size_t skip_px = size_t(r.left) - x0;  // the region's first column in the cropped row
  if (r.top > 0) jpeg_skip_scanlines(&cinfo, JDIMENSION(r.top));
  for (int y = 0; y < r.height; ++y) {
    jpeg_read_scanlines(&cinfo, buf, 1);
    put_row(buf[0] + skip_px * size_t(comps), comps, cinfo.saw_Adobe_marker, r.width,
            dst + size_t(y) * r.width * 3);
  }
  // The rows below. A whole decode fails on a truncated file, and only on that (libjpeg reports
  // corrupt entropy data as warnings). The decode can stop here when the data ends with the EOI
  // marker (within entropy-coded data 0xFF is always followed by 0x00 or a restart marker, so
  // such data is not truncated) or when all input has been consumed (a multi-scan file is
  // entropy-decoded in jpeg_start_decompress, which reported any truncation). Otherwise the
  // rest is read (cropped: its columns only): jpeg_skip_scanlines to the last row takes a
  // shortcut in libjpeg-turbo 2.1 that decodes nothing and would miss a truncation.
  if (cinfo.output_scanline < cinfo.output_height &&
      (ends_with_eoi(ctx.bytes, ctx.n) || jpeg_input_complete(&cinfo))) {
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  while (cinfo.output_scanline < cinfo.output_height) jpeg_read_scanlines(&cinfo, buf, 1);
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

struct JpegEncodeCtx {
  const Image* img;
  int quality;
  unsigned char* buf;  // malloc'ed by libjpeg's memory destination
  unsigned long size;
  char msg[JMSG_LENGTH_MAX];
};

bool jpeg_encode_impl(JpegEncodeCtx& ctx) {
  jpeg_compress_struct cinfo;
  JpegErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.msg[0] = '\0';
  err.eof_seen = false;
  if (setjmp(err.jump)) {
    std::snprintf(ctx.msg, sizeof ctx.msg, "%s", err.msg);
    jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &ctx.buf, &ctx.size);
  const Image& img = *ctx.img;
  cinfo.image_width = JDIMENSION(img.w);
  cinfo.image_height = JDIMENSION(img.h);
  cinfo.input_components = img.c;
  cinfo.in_color_space = img.c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, ctx.quality, TRUE);
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_start_compress(&cinfo, TRUE);
  const size_t stride = size_t(img.w) * img.c;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(img.px.data()) + cinfo.next_scanline * stride;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

// ---------------------------------------------------------------------------------------------
// libpng plumbing: same setjmp discipline (png_jmpbuf).

struct PngReadSrc {
  const uint8_t* bytes;
  size_t n, pos;
};

struct PngMsg {
  char msg[256];
};

void png_on_error(png_structp png, png_const_charp m) {
  auto* pm = static_cast<PngMsg*>(png_get_error_ptr(png));
  std::snprintf(pm->msg, sizeof pm->msg, "%s", m ? m : "unknown error");
  png_longjmp(png, 1);
}
void png_on_warning(png_structp, png_const_charp) {}

void png_read_mem(png_structp png, png_bytep out, png_size_t len) {
  auto* src = static_cast<PngReadSrc*>(png_get_io_ptr(png));
  if (len > src->n - src->pos) png_error(png, "unexpected end of data (file truncated)");
  std::memcpy(out, src->bytes + src->pos, len);
  src->pos += len;
}

struct PngDecodeCtx {
  const uint8_t* bytes;
  size_t n;
  Image* out;
  std::vector<png_bytep>* rows;
  PngMsg err;
};

bool png_decode_impl(PngDecodeCtx& ctx) {
  ctx.err.msg[0] = '\0';
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx.err, png_on_error, png_on_warning);
  if (!png) {
    std::snprintf(ctx.err.msg, sizeof ctx.err.msg, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  PngReadSrc src{ctx.bytes, ctx.n, 0};
  if (!info || setjmp(png_jmpbuf(png))) {
    if (!info) std::snprintf(ctx.err.msg, sizeof ctx.err.msg, "out of memory");
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    return false;
  }
  png_set_read_fn(png, &src, png_read_mem);
  png_read_info(png, info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, color = 0, interlace = 0;
  png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, nullptr, nullptr);
  if (uint64_t(w) * h > kMaxPixels) png_error(png, "image too large (more than PIL's limit)");
  png_set_expand(png);  // palette -> RGB, gray < 8 bit -> 8 bit, tRNS -> alpha
  if (depth == 16) png_set_scale_16(png);
  png_set_strip_alpha(png);
  if (!(color & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != size_t(w) * 3) png_error(png, "unsupported pixel layout");
  *ctx.out = Image(int(h), int(w), 3);
  ctx.rows->resize(h);
  for (png_uint_32 y = 0; y < h; ++y) (*ctx.rows)[y] = ctx.out->px.data() + size_t(y) * w * 3;
  png_read_image(png, ctx.rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

struct PngWriteDst {
  std::vector<uint8_t>* out;
};
void png_write_mem(png_structp png, png_bytep data, png_size_t len) {
  auto* d = static_cast<PngWriteDst*>(png_get_io_ptr(png));
  d->out->insert(d->out->end(), data, data + len);
}
void png_flush_mem(png_structp) {}

struct PngEncodeCtx {
  const Image* img;
  std::vector<uint8_t>* out;
  std::vector<png_bytep>* rows;
  PngMsg err;
};

bool png_encode_impl(PngEncodeCtx& ctx) {
  ctx.err.msg[0] = '\0';
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx.err, png_on_error, png_on_warning);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  PngWriteDst dst{ctx.out};
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info ? &info : nullptr);
    return false;
  }
  const Image& img = *ctx.img;
  const int color = img.c == 1   ? PNG_COLOR_TYPE_GRAY
                    : img.c == 4 ? PNG_COLOR_TYPE_RGB_ALPHA
                                 : PNG_COLOR_TYPE_RGB;
  png_set_write_fn(png, &dst, png_write_mem, png_flush_mem);
  png_set_IHDR(png, info, png_uint_32(img.w), png_uint_32(img.h), 8, color, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, ctx.rows->data());
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Separable resampling with a triangle filter whose support grows with the reduction factor
// (antialiasing); pixel centres at i + 0.5.

struct Taps {
  std::vector<int> start, count;
  std::vector<float> w;  // out * max_count
  int max_count = 0;
};

Taps make_taps(int in, int out) {
  Taps t;
  const double scale = double(in) / out;
  const double fs = std::max(scale, 1.0);  // filter stretch
  const double support = fs;               // triangle radius 1 in output units
  t.max_count = int(std::ceil(support)) * 2 + 2;
  t.start.resize(out);
  t.count.resize(out);
  t.w.assign(size_t(out) * t.max_count, 0.0f);
  for (int i = 0; i < out; ++i) {
    const double center = (i + 0.5) * scale;
    int lo = std::max(0, int(std::floor(center - support)));
    int hi = std::min(in, int(std::ceil(center + support)));
    double sum = 0;
    std::vector<double> tmp;
    for (int x = lo; x < hi; ++x) {
      const double d = std::abs((x + 0.5 - center) / fs);
      tmp.push_back(std::max(0.0, 1.0 - d));
      sum += tmp.back();
    }
    // Trim zero-weight ends.
    int a = 0, b = int(tmp.size());
    while (a < b && tmp[a] == 0.0) ++a;
    while (b > a && tmp[b - 1] == 0.0) --b;
    if (a == b) {  // degenerate (cannot happen for in >= 1), fall back to nearest
      const int x = std::clamp(int(center), 0, in - 1);
      t.start[i] = x;
      t.count[i] = 1;
      t.w[size_t(i) * t.max_count] = 1.0f;
      continue;
    }
    t.start[i] = lo + a;
    t.count[i] = b - a;
    for (int k = a; k < b; ++k) t.w[size_t(i) * t.max_count + (k - a)] = float(tmp[k] / sum);
  }
  return t;
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* b, size_t n) {
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::Jpeg;
  static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (n >= 8 && std::memcmp(b, png_sig, 8) == 0) return ImageFormat::Png;
  return ImageFormat::Unknown;
}

Image decode_image(const uint8_t* bytes, size_t n, int min_side_hint) {
  return decode_image_region(bytes, n, min_side_hint, nullptr);
}

std::string region_error(const Rect& r, int h, int w) {
  return fmt::format("region {}x{} at ({}, {}) outside the {}x{} image", r.height, r.width, r.top,
                     r.left, h, w);
}

Image crop_image(const Image& img, const Rect& r) {
  VIT_CHECK(region_inside(r, img.h, img.w), region_error(r, img.h, img.w));
  Image out(r.height, r.width, img.c);
  for (int y = 0; y < r.height; ++y)
    std::memcpy(out.at(y, 0), img.at(r.top + y, r.left), size_t(r.width) * img.c);
  return out;
}

Image decode_image_region(const uint8_t* bytes, size_t n, int min_side_hint,
                          const RegionPicker& pick) {
  switch (sniff_image_format(bytes, n)) {
    case ImageFormat::Jpeg: {
      Image out;
      JpegDecodeCtx ctx{bytes, n, std::max(0, min_side_hint), &out, {}};
      ctx.pick = pick ? &pick : nullptr;
      if (!jpeg_decode_impl(ctx)) {
        if (ctx.pick_error) std::rethrow_exception(ctx.pick_error);
        throw Error(fmt::format("corrupt JPEG: {}", ctx.msg));
      }
      return out;
    }
    case ImageFormat::Png: {  // decoded whole, then cropped
      Image out;
      std::vector<png_bytep> rows;
      PngDecodeCtx ctx{bytes, n, &out, &rows, {}};
      if (!png_decode_impl(ctx)) throw Error(fmt::format("corrupt PNG: {}", ctx.err.msg));
      return pick ? crop_image(out, pick(out.h, out.w)) : out;
    }
    default:
      throw Error(fmt::format("not a JPEG or PNG image ({} bytes, unrecognised magic bytes)", n));
  }
}

Image decode_image_file(const std::string& path, int min_side_hint) {
  return decode_image_file_region(path, min_side_hint, nullptr);
}

Image decode_image_file_region(const std::string& path, int min_side_hint,
                               const RegionPicker& pick) {
  std::vector<uint8_t> buf;
  {
    StageScope clock(Stage::Read);
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) throw Error(fmt::format("{}: cannot open image file", path));
    const std::streamoff size = f.tellg();
    buf.resize(size > 0 ? size_t(size) : 0);
    f.seekg(0);
    if (size > 0 && !f.read(reinterpret_cast<char*>(buf.data()), size))
      throw Error(fmt::format("{}: read error", path));
  }
  try {
    StageScope clock(Stage::Decode);
    return decode_image_region(buf.data(), buf.size(), min_side_hint, pick);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
}

std::vector<uint8_t> encode_jpeg(const Image& img, int quality) {
  VIT_CHECK(img.c == 1 || img.c == 3,
            fmt::format("encode_jpeg: need 1 or 3 channels, got {}", img.c));
  VIT_CHECK(img.h > 0 && img.w > 0 && img.h <= 65500 && img.w <= 65500,
            fmt::format("encode_jpeg: bad image size {}x{}", img.w, img.h));
  VIT_CHECK(img.px.size() == size_t(img.h) * img.w * img.c,
            "encode_jpeg: pixel buffer size mismatch");
  JpegEncodeCtx ctx{&img, std::clamp(quality, 1, 100), nullptr, 0, {}};
  const bool ok = jpeg_encode_impl(ctx);
  std::vector<uint8_t> out;
  if (ok) out.assign(ctx.buf, ctx.buf + ctx.size);
  std::free(ctx.buf);
  if (!ok) throw Error(fmt::format("JPEG encoding failed: {}", ctx.msg));
  return out;
}

std::vector<uint8_t> encode_png(const Image& img) {
  VIT_CHECK(img.c == 1 || img.c == 3 || img.c == 4,
            fmt::format("encode_png: need 1, 3 or 4 channels, got {}", img.c));
  VIT_CHECK(img.h > 0 && img.w > 0, fmt::format("encode_png: bad image size {}x{}", img.w, img.h));
  VIT_CHECK(img.px.size() == size_t(img.h) * img.w * img.c,
            "encode_png: pixel buffer size mismatch");
  std::vector<uint8_t> out;
  std::vector<png_bytep> rows(img.h);
  for (int y = 0; y < img.h; ++y) rows[y] = const_cast<uint8_t*>(img.at(y, 0));
  PngEncodeCtx ctx{&img, &out, &rows, {}};
  if (!png_encode_impl(ctx)) throw Error(fmt::format("PNG encoding failed: {}", ctx.err.msg));
  return out;
}

Image resize_bilinear_aa(const Image& img, int out_h, int out_w) {
  VIT_CHECK(out_h > 0 && out_w > 0, fmt::format("resize: bad output size {}x{}", out_w, out_h));
  VIT_CHECK(img.h > 0 && img.w > 0 && img.c > 0, "resize: empty input image");
  if (out_h == img.h && out_w == img.w) return img;
  const int c = img.c;
  const Taps tx = make_taps(img.w, out_w), ty = make_taps(img.h, out_h);
  // Horizontal pass: (h, out_w, c) floats.
  std::vector<float> mid(size_t(img.h) * out_w * c);
  for (int y = 0; y < img.h; ++y) {
    const uint8_t* src = img.at(y, 0);
    float* dst = mid.data() + size_t(y) * out_w * c;
    for (int x = 0; x < out_w; ++x) {
      const float* w = tx.w.data() + size_t(x) * tx.max_count;
      const uint8_t* s = src + size_t(tx.start[x]) * c;
      for (int ch = 0; ch < c; ++ch) {
        float acc = 0;
        for (int k = 0; k < tx.count[x]; ++k) acc += w[k] * s[size_t(k) * c + ch];
        dst[size_t(x) * c + ch] = acc;
      }
    }
  }
  // Vertical pass.
  Image out(out_h, out_w, c);
  const size_t row = size_t(out_w) * c;
  std::vector<float> acc(row);
  for (int y = 0; y < out_h; ++y) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const float* w = ty.w.data() + size_t(y) * ty.max_count;
    for (int k = 0; k < ty.count[y]; ++k) {
      const float* s = mid.data() + size_t(ty.start[y] + k) * row;
      const float wk = w[k];
      for (size_t j = 0; j < row; ++j) acc[j] += wk * s[j];
    }
    uint8_t* d = out.px.data() + size_t(y) * row;
    for (size_t j = 0; j < row; ++j) d[j] = uint8_t(std::clamp(std::lround(acc[j]), 0L, 255L));
  }
  return out;
}

Image resize_max_side(const Image& img, int max_side) {
  const int longer = std::max(img.h, img.w);
  if (max_side <= 0 || longer <= max_side) return img;
  const double s = double(max_side) / longer;
  int oh = std::max(1, int(std::lround(img.h * s)));
  int ow = std::max(1, int(std::lround(img.w * s)));
  oh = std::min(oh, max_side);
  ow = std::min(ow, max_side);
  return resize_bilinear_aa(img, oh, ow);
}

}  // namespace vit::data
