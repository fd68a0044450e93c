// JPEGs of every kind for the decoder tests, written with libjpeg directly (encode_jpeg writes
// only baseline 4:2:0): chroma subsampling, progressive scans, restart markers, CMYK.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <vector>

// jpeglib.h needs size_t/FILE declared first.
// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on

#include "data/image.h"

namespace vit::test {

struct JpegKind {
  const char* name;
  int h_samp = 2, v_samp = 2;  // the luma's sampling factors (chroma 1x1): 2x2 = 4:2:0
  bool progressive = false;
  int restart_rows = 0;  // a restart marker every that many MCU rows (0 = none)
  int quality = 90;
};

// img: c == 1 (grayscale), 3 (RGB, stored as YCbCr) or 4 (CMYK; libjpeg writes Adobe's marker).
inline std::vector<uint8_t> encode_jpeg_kind(const data::Image& img, const JpegKind& k) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = JDIMENSION(img.w);
  cinfo.image_height = JDIMENSION(img.h);
  cinfo.input_components = img.c;
  cinfo.in_color_space = img.c == 1 ? JCS_GRAYSCALE : img.c == 4 ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, k.quality, TRUE);
  if (img.c == 3) {
    cinfo.comp_info[0].h_samp_factor = k.h_samp;
    cinfo.comp_info[0].v_samp_factor = k.v_samp;
  }
  if (k.progressive) jpeg_simple_progression(&cinfo);
  cinfo.restart_in_rows = k.restart_rows;
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row =
        const_cast<uint8_t*>(img.px.data()) + size_t(cinfo.next_scanline) * img.w * img.c;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buf, buf + size);
  std::free(buf);
  return out;
}

}  // namespace vit::test
