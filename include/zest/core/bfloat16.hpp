// zest/core/bfloat16.hpp — bfloat16 storage type (1 sign, 8 exponent, 7 mantissa bits).
//
// Storage and communication type only: arithmetic converts to float. Conversion from
// float rounds to nearest even; NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace zest {

struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() = default;
  constexpr bfloat16(float f) : bits(round_from(f)) {}  // NOLINT: implicit like a float
  constexpr operator float() const {                    // NOLINT
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16U);
  }

  static constexpr bfloat16 from_bits(std::uint16_t b) {
    bfloat16 r;
    r.bits = b;
    return r;
  }
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }

 private:
  static constexpr std::uint16_t round_from(float f) {
    const auto u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7f800000U) == 0x7f800000U && (u & 0x007fffffU) != 0) {
      return static_cast<std::uint16_t>((u >> 16U) | 0x0040U);  // quiet NaN
    }
    const std::uint32_t lsb = (u >> 16U) & 1U;
    return static_cast<std::uint16_t>((u + 0x7fffU + lsb) >> 16U);
  }
};

static_assert(sizeof(bfloat16) == 2);

}  // namespace zest
