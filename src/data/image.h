// An 8-bit image in interleaved (H, W, C) layout, C = 1 (grey) or 3 (RGB): the unit decoders
// produce and augmentations transform.
#pragma once
#include <cstdint>
#include <vector>

namespace vit::data {

struct Image {
  int h = 0, w = 0, c = 0;
  std::vector<uint8_t> px;  // (h, w, c)
  Image() = default;
  Image(int h_, int w_, int c_) : h(h_), w(w_), c(c_), px(size_t(h_) * w_ * c_, 0) {}
  uint8_t* at(int y, int x) { return px.data() + (size_t(y) * w + x) * c; }
  const uint8_t* at(int y, int x) const { return px.data() + (size_t(y) * w + x) * c; }
};

}  // namespace vit::data
