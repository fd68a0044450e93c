// Strict UTF-8 validation: what YAML and JSON files may hold. Invalid bytes, overlong forms,
// surrogates and code points above U+10FFFF are refused; emitters would otherwise replace or
// re-decode them, so a string would not read back as written.
#pragma once
#include <cstdint>
#include <string_view>

namespace vit {

inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t b = uint8_t(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    // Sequence length and the smallest code point that needs it (overlong forms are below it).
    const int n = b >= 0xf0 && b <= 0xf4   ? 4
                  : b >= 0xe0 && b <= 0xef ? 3
                  : b >= 0xc2 && b <= 0xdf ? 2
                                           : 0;
    if (n == 0 || i + size_t(n) > s.size()) return false;
    uint32_t cp = b & (0x7f >> n);
    for (int k = 1; k < n; ++k) {
      const uint8_t c = uint8_t(s[i + size_t(k)]);
      if ((c & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3f);
    }
    const uint32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += size_t(n);
  }
  return true;
}

}  // namespace vit
