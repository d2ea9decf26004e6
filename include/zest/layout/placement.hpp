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

#include <cstdint>
#include <type_traits>

#include "zest/core/fixed_string.hpp"

namespace zest {

enum class placement_kind : std::uint8_t { replicate, split, partial };

template <fixed_string Axis>
struct replicate {
  static constexpr placement_kind kind = placement_kind::replicate;
};

template <char Dim, fixed_string... Axes>
struct split {
  static constexpr placement_kind kind = placement_kind::split;
  static constexpr char dim = Dim;
};

template <fixed_string Axis>
struct partial {
  static constexpr placement_kind kind = placement_kind::partial;
};

namespace detail {
template <class P>
struct is_placement : std::false_type {};
template <fixed_string A>
struct is_placement<replicate<A>> : std::true_type {};
template <char D, fixed_string... A>
struct is_placement<split<D, A...>> : std::true_type {};
template <fixed_string A>
struct is_placement<partial<A>> : std::true_type {};
}  // namespace detail

template <class P>
concept placement = detail::is_placement<P>::value;

}  // namespace zest
