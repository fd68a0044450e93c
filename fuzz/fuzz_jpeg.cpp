// libFuzzer target: the JPEG decode wrapper (data/decode.h) over libjpeg-turbo, whole and by
// region. The DCT-scaling hint varies with the input size so the scaled paths are reached too.
// The region decode (libjpeg-turbo's crop and skip paths) is checked against the whole decode:
// where the whole image decodes, the region must decode to exactly its pixels there (the
// loader relies on it); where it does not, the region may decode or fail, but only with
// vit::Error.
#include <cstdint>
#include <cstring>

#include "data/decode.h"
#include "fuzz_util.h"

namespace {

// A region inside (h, w) drawn from the input's bytes, so the corpus steers it too.
vit::data::Rect region_from(const uint8_t* data, size_t size, int h, int w) {
  uint64_t k = 1469598103934665603ull;  // FNV-1a over the last 16 bytes and the size
  for (size_t i = size > 16 ? size - 16 : 0; i < size; ++i) k = (k ^ data[i]) * 1099511628211ull;
  k ^= size;
  vit::data::Rect r;
  r.top = int(k % uint64_t(h));
  r.left = int((k >> 16) % uint64_t(w));
  r.height = 1 + int((k >> 32) % uint64_t(h - r.top));
  r.width = 1 + int((k >> 44) % uint64_t(w - r.left));
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int kHints[] = {0, 1, 8, 64};
  const int hint = kHints[size % 4];
  bool whole_ok = false;
  vit::data::Image whole;
  vit::fuzz::expect_value_or_error([&] {
    whole = vit::data::decode_image(data, size, hint);
    whole_ok = true;
  });
  // Headers may declare up to PIL's 179M pixels: beyond 4M the whole image is let go before the
  // region decode (which still runs), so that two large images are never held at once.
  if (whole_ok && int64_t(whole.h) * whole.w > (int64_t(1) << 22)) {
    whole = vit::data::Image();
    whole_ok = false;
  }
  vit::data::Rect r;
  const auto pick = [&](int h, int w) { return r = region_from(data, size, h, w); };
  bool part_ok = false;
  vit::data::Image part;
  vit::fuzz::expect_value_or_error([&] {
    part = vit::data::decode_image_region(data, size, hint, pick);
    part_ok = true;
  });
  if (!whole_ok) return 0;
  if (!part_ok) {
    std::fprintf(stderr, "the whole image decodes but its region %dx%d at (%d, %d) does not\n",
                 r.height, r.width, r.top, r.left);
    std::abort();
  }
  const vit::data::Image want = vit::data::crop_image(whole, r);
  if (part.h != want.h || part.w != want.w || part.c != want.c ||
      std::memcmp(part.px.data(), want.px.data(), want.px.size()) != 0) {
    std::fprintf(stderr,
                 "region %dx%d at (%d, %d) of a %dx%d image differs from the whole decode\n",
                 r.height, r.width, r.top, r.left, whole.h, whole.w);
    std::abort();
  }
  return 0;
}
