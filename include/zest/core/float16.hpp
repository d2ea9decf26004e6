// zest/core/float16.hpp — IEEE 754 binary16 storage type (1 sign, 5 exponent, 10 mantissa bits).
//
//   zest::float16 h(0.1f);          // explicit: rounds to nearest even (0x2e66)
//   float x = h;                    // exact
//   h.bits(); zest::float16::from_bits(0x7bff);   // 65504, the largest finite value
//
// Storage and communication type only: arithmetic converts to float. Conversion from float
// rounds to nearest even, overflows to +-inf (from 65520 up, the first value that rounds
// past 65504), produces subnormals down to 2^-24 (below 2^-25 it is a signed zero) and
// keeps NaN a NaN, made quiet (the upper payload bits survive). Conversion to float is exact.
// Construction from float is explicit: a float16 holds 11 significant bits, and a silent
// narrowing would hide where precision is lost.
#pragma once

#include <bit>
#include <cstdint>

namespace zest {

class float16 {
 public:
  constexpr float16() = default;
  constexpr explicit float16(float f) : bits_(round_from(f)) {}
  constexpr operator float() const { return to_float(bits_); }  // NOLINT: exact, like a float

  constexpr std::uint16_t bits() const { return bits_; }
  static constexpr float16 from_bits(std::uint16_t b) {
    float16 r;
    r.bits_ = b;
    return r;
  }
  // Bitwise equality (as bfloat16's): +0 and -0 differ, a NaN equals itself.
  friend constexpr bool operator==(float16 a, float16 b) { return a.bits_ == b.bits_; }

  // Branch-free, so loops over float16 arrays vectorise: the cases are blended with masks.
  static constexpr float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16U;
    const std::uint32_t a = static_cast<std::uint32_t>(h & 0x7fffU) << 13U;  // float position
    const std::uint32_t exponent = a & 0x0f800000U;
    // Normal: rebias the exponent by 127 - 15; inf/NaN by as much again (exponent all ones).
    const std::uint32_t special = 0U - static_cast<std::uint32_t>(exponent == 0x0f800000U);
    const std::uint32_t normal = a + 0x38000000U + (special & 0x38000000U);
    // Subnormal: 2^-14 * (1 + m/1024) - 2^-14 = m * 2^-24, exact, with no float subnormal
    // involved (so flush-to-zero modes do not disturb it). Zero comes out as +0.
    const std::uint32_t subnormal =
        std::bit_cast<std::uint32_t>(std::bit_cast<float>(a + 0x38800000U) - 0x1p-14F);
    const std::uint32_t tiny = 0U - static_cast<std::uint32_t>(exponent == 0);
    return std::bit_cast<float>(((subnormal & tiny) | (normal & ~tiny)) | sign);
  }

  static constexpr std::uint16_t round_from(float f) {
    const auto u = std::bit_cast<std::uint32_t>(f);
    const auto sign = static_cast<std::uint16_t>((u >> 16U) & 0x8000U);
    const std::uint32_t a = u & 0x7fffffffU;
    if (a >= 0x7f800000U) {  // inf, or NaN made quiet with its upper payload bits
      if (a == 0x7f800000U) return static_cast<std::uint16_t>(sign | 0x7c00U);
      return static_cast<std::uint16_t>(sign | 0x7e00U | ((a >> 13U) & 0x03ffU));
    }
    if (a >= 0x477ff000U)
      return static_cast<std::uint16_t>(sign | 0x7c00U);  // >= 65520: rounds past 65504
    if (a >= 0x38800000U) {                               // >= 2^-14: a normal float16
      const std::uint32_t rebiased = a - 0x38000000U;
      const std::uint32_t lsb = (rebiased >> 13U) & 1U;
      return static_cast<std::uint16_t>(sign | ((rebiased + 0x0fffU + lsb) >> 13U));
    }
    if (a <= 0x33000000U) return sign;  // <= 2^-25: ties to the even zero
    // Subnormal: value / 2^-24 = significand * 2^(exponent - 126), shift in [14, 24].
    const std::uint32_t significand = (a & 0x007fffffU) | 0x00800000U;
    const std::uint32_t shift = 126U - (a >> 23U);
    std::uint32_t q = significand >> shift;
    const std::uint32_t rest = significand & ((1U << shift) - 1U);
    const std::uint32_t half = 1U << (shift - 1U);
    if (rest > half || (rest == half && (q & 1U) != 0)) ++q;  // may carry into 0x0400: 2^-14
    return static_cast<std::uint16_t>(sign | q);
  }

 private:
  std::uint16_t bits_ = 0;
};

static_assert(sizeof(float16) == 2);

}  // namespace zest
