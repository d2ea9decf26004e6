// zest/core/dtype.hpp — element types zest stores and communicates.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "zest/core/bfloat16.hpp"
#include "zest/core/float16.hpp"

namespace zest {

enum class dtype : std::uint8_t { f32, f64, bf16, i32, i64, u8, u16, f16 };

template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bfloat16> ||
    std::is_same_v<T, float16> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint8_t> ||
    std::is_same_v<T, std::uint16_t>;

template <class T>
constexpr dtype dtype_of() {
  static_assert(is_element_type_v<T>,
                "zest: unsupported element type; use float, double, zest::bfloat16, "
                "zest::float16, int32_t, int64_t, uint8_t or uint16_t");
  if constexpr (std::is_same_v<T, float>) return dtype::f32;
  else if constexpr (std::is_same_v<T, double>) return dtype::f64;
  else if constexpr (std::is_same_v<T, bfloat16>) return dtype::bf16;
  else if constexpr (std::is_same_v<T, float16>) return dtype::f16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return dtype::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return dtype::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return dtype::u8;
  else return dtype::u16;
}

constexpr std::string_view name_of(dtype t) {
  switch (t) {
    case dtype::f32: return "float";
    case dtype::f64: return "double";
    case dtype::bf16: return "bfloat16";
    case dtype::i32: return "int32";
    case dtype::i64: return "int64";
    case dtype::u8: return "uint8";
    case dtype::u16: return "uint16";
    case dtype::f16: return "float16";
  }
  return "?";
}

// Type used for arithmetic on stored elements: bfloat16 and float16 compute in float.
template <class T>
using compute_type_t =
    std::conditional_t<std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>, float, T>;

}  // namespace zest
