// Host bfloat16: the storage type of the CPU bf16 emulation backend. Conversion from fp32 rounds
// to nearest, ties to even (NaN stays a quiet NaN), bit for bit as CUDA's __float2bfloat16_rn,
// so the emulation rounds exactly where and how the GPU's bf16 backend does. All arithmetic on
// bf16 values is done after widening to fp32 (exact).
#pragma once
#include <cstdint>
#include <cstring>

namespace vit {

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float x) : bits(round_bits(x)) {}
  explicit operator float() const { return widen(bits); }

  static uint16_t round_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
      return uint16_t((u >> 16) | 0x0040u);  // NaN: keep the sign, force a quiet NaN
    const uint32_t lsb = (u >> 16) & 1u;     // ties go to the even neighbour
    return uint16_t((u + 0x7fffu + lsb) >> 16);
  }
  static float widen(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  }
};
static_assert(sizeof(bf16) == 2, "bf16 must be two bytes (it mirrors the GPU's storage)");

// The fp32 value x becomes once stored as bf16.
inline float round_bf16(float x) {
  return bf16::widen(bf16::round_bits(x));
}

}  // namespace vit
