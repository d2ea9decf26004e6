// Tests of zest::float16: every one of the 65536 bit patterns against an independent decoder
// (std::ldexp on the fields), the round trip float16 -> float -> float16, round to nearest
// even at halfway points (normal and subnormal), overflow, and the extremes.
#include "zest/core/float16.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "zest/core/dtype.hpp"

namespace {

using zest::float16;

// IEEE binary16 by its definition, independent of float16's bit tricks.
double decode(std::uint16_t h) {
  const int sign = (h & 0x8000U) != 0 ? -1 : 1;
  const int exponent = (h >> 10U) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

std::uint16_t bits_of(float f) { return float16(f).bits(); }

}  // namespace

TEST_CASE("float16: every bit pattern converts to float exactly and round-trips") {
  int wrong_value = 0, wrong_trip = 0, nan_count = 0;
  std::string first;
  for (std::uint32_t b = 0; b <= 0xffffU; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = float16::from_bits(h);
    const double want = decode(h);
    if (std::isnan(want)) {
      ++nan_count;
      // A NaN stays a NaN, made quiet; payload bits may change, the sign does not.
      const std::uint16_t back = bits_of(f);
      if (!std::isnan(f) || (back & 0x7c00U) != 0x7c00U || (back & 0x03ffU) == 0 ||
          (back & 0x0200U) == 0 || (back & 0x8000U) != (h & 0x8000U)) {
        if (wrong_trip++ == 0) first = "NaN pattern " + std::to_string(b);
      }
      continue;
    }
    if (static_cast<double>(f) != want || std::signbit(f) != ((h & 0x8000U) != 0)) {
      if (wrong_value++ == 0) first = "value of pattern " + std::to_string(b);
    }
    if (bits_of(f) != h) {
      if (wrong_trip++ == 0) first = "round trip of pattern " + std::to_string(b);
    }
  }
  INFO(first);
  CHECK(wrong_value == 0);
  CHECK(wrong_trip == 0);
  CHECK(nan_count == 2 * 1023);
}

TEST_CASE("float16: quiet NaNs keep their upper payload bits") {
  CHECK(bits_of(std::numeric_limits<float>::quiet_NaN()) == 0x7e00);
  CHECK(bits_of(-std::numeric_limits<float>::quiet_NaN()) == 0xfe00);
  // A signalling NaN whose payload lives only in the bits float16 drops is still a NaN.
  CHECK(bits_of(std::bit_cast<float>(0x7f800001U)) == 0x7e00);
  CHECK(bits_of(std::bit_cast<float>(0x7f802000U)) == 0x7e01);
  CHECK(std::isnan(static_cast<float>(float16::from_bits(0x7c01))));
}

TEST_CASE("float16: halfway cases round to even") {
  // Around 1: spacing 2^-10. 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10 (odd).
  CHECK(bits_of(1.0F + 0x1p-11F) == 0x3c00);
  CHECK(bits_of(1.0F + 3 * 0x1p-11F) == 0x3c02);         // between 0x3c01 (odd) and 0x3c02 (even)
  CHECK(bits_of(1.0F + 0x1p-11F + 0x1p-20F) == 0x3c01);  // just above halfway: up
  CHECK(bits_of(1.0F + 3 * 0x1p-11F - 0x1p-20F) == 0x3c01);  // just below halfway: down
  CHECK(bits_of(-(1.0F + 0x1p-11F)) == 0xbc00);
  CHECK(bits_of(-(1.0F + 3 * 0x1p-11F)) == 0xbc02);
  // Rounding up carries into the exponent: 2 - 2^-11 lies halfway between 0x3bff and 2.0.
  CHECK(bits_of(2.0F - 0x1p-11F) == 0x4000);
  // Subnormals: spacing 2^-24. 2.5 * 2^-24 -> 2, 3.5 * 2^-24 -> 4, 1.5 * 2^-24 -> 2.
  CHECK(bits_of(2.5F * 0x1p-24F) == 0x0002);
  CHECK(bits_of(3.5F * 0x1p-24F) == 0x0004);
  CHECK(bits_of(1.5F * 0x1p-24F) == 0x0002);
  // Largest subnormal + half a step rounds up into the smallest normal (0x0400 = 2^-14).
  CHECK(bits_of(1023.5F * 0x1p-24F) == 0x0400);
  CHECK(bits_of(1022.5F * 0x1p-24F) == 0x03fe);
  // Every halfway point between neighbours, across the whole finite range.
  int wrong = 0;
  for (std::uint32_t b = 0; b < 0x7bffU; ++b) {
    const double lo = decode(static_cast<std::uint16_t>(b));
    const double hi = decode(static_cast<std::uint16_t>(b + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact in float
    const std::uint16_t want =
        (b & 1U) == 0 ? static_cast<std::uint16_t>(b) : static_cast<std::uint16_t>(b + 1);
    if (bits_of(mid) != want || bits_of(-mid) != (want | 0x8000U)) ++wrong;
  }
  CHECK(wrong == 0);
}

TEST_CASE("float16: range limits") {
  CHECK(static_cast<float>(float16::from_bits(0x7bff)) == 65504.0F);
  CHECK(bits_of(65504.0F) == 0x7bff);
  CHECK(bits_of(65519.996F) == 0x7bff);  // below the halfway point to 65536
  CHECK(bits_of(65520.0F) == 0x7c00);    // halfway: rounds to the even "65536", i.e. inf
  CHECK(bits_of(-65520.0F) == 0xfc00);
  CHECK(bits_of(1e10F) == 0x7c00);
  CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(bits_of(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7c00);

  // Smallest subnormal 2^-24; half of it ties to zero, a little more rounds up to it.
  CHECK(static_cast<float>(float16::from_bits(0x0001)) == 0x1p-24F);
  CHECK(bits_of(0x1p-24F) == 0x0001);
  CHECK(bits_of(0x1p-25F) == 0x0000);
  CHECK(bits_of(0x1p-25F + 0x1p-40F) == 0x0001);
  CHECK(bits_of(-0x1p-25F) == 0x8000);
  CHECK(bits_of(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(bits_of(-0.0F) == 0x8000);
  CHECK(bits_of(0.0F) == 0x0000);
  // Smallest normal and largest subnormal.
  CHECK(static_cast<float>(float16::from_bits(0x0400)) == 0x1p-14F);
  CHECK(static_cast<float>(float16::from_bits(0x03ff)) == 1023 * 0x1p-24F);
  CHECK(bits_of(0.1F) == 0x2e66);
  CHECK(bits_of(1.0F / 3.0F) == 0x3555);
}

TEST_CASE("float16: constexpr, dtype and compute type") {
  static_assert(float16(1.5F).bits() == 0x3e00);
  static_assert(static_cast<float>(float16::from_bits(0xc000)) == -2.0F);
  static_assert(float16(0.5F) == float16::from_bits(0x3800));
  static_assert(zest::dtype_of<float16>() == zest::dtype::f16);
  static_assert(zest::is_element_type_v<float16>);
  static_assert(std::is_same_v<zest::compute_type_t<float16>, float>);
  static_assert(!std::is_convertible_v<float, float16>);  // construction is explicit
  static_assert(std::is_convertible_v<float16, float>);
  static_assert(std::is_trivially_copyable_v<float16>);
  CHECK(zest::name_of(zest::dtype::f16) == "float16");
  CHECK(zest::name_of(zest::dtype_of<zest::bfloat16>()) == "bfloat16");
}
