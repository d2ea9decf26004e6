// zest/layout/placement.hpp — what one mesh axis does to a tensor.
//
// Placements are empty tag types; they name mesh axes and tensor dims by their spellings:
//
//   replicate<"tp">            every rank along "tp" holds the whole tensor (the default)
//   split<'b', "dp">           dim b is cut into balanced blocks over the ranks of "dp"
//   split<'m', "dp", "tp">     dim m is cut over "dp", and each block again over "tp"
//   partial<"tp">              every rank along "tp" holds a summand; the value is their sum
//
// A split over several axes is nested, the first axis major: with m = 10 over dp = 2 and
// tp = 2, rank (dp=1, tp=0) holds m[5, 8) and (1, 1) holds m[8, 10). Nesting is what lets
// gathering the last axis leave a valid split over the others.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <string_view>

#include "zest/core/fixed_string.hpp"

namespace zest {

enum class placement_kind : std::uint8_t { replicate, split, partial };

// Each placement states what it is through static members (kind, dim, axes) rather than
// being recognised by pattern matching: that is what the `placement` concept checks, and
// it works the same in every compiler front end (nvcc's included).
template <fixed_string Axis>
struct replicate {
  static constexpr placement_kind kind = placement_kind::replicate;
  static constexpr char dim = 0;
  static constexpr std::array<std::string_view, 1> axes{view_of<Axis>};
};

template <char Dim, fixed_string... Axes>
struct split {
  static constexpr placement_kind kind = placement_kind::split;
  static constexpr char dim = Dim;
  static constexpr std::array<std::string_view, sizeof...(Axes)> axes{view_of<Axes>...};
};

template <fixed_string Axis>
struct partial {
  static constexpr placement_kind kind = placement_kind::partial;
  static constexpr char dim = 0;
  static constexpr std::array<std::string_view, 1> axes{view_of<Axis>};
};

template <class P>
concept placement = requires {
  { P::kind } -> std::convertible_to<placement_kind>;
  { P::dim } -> std::convertible_to<char>;
  P::axes.size();
};

}  // namespace zest
