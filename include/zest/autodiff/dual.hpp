// zest/autodiff/dual.hpp — the layout of a gradient: the dual of the value's layout.
//
// Per mesh axis:
//   dual(replicate) = partial     a value used replicated on an axis is used once per rank;
//                                 its gradient is the sum of the ranks' contributions, still
//                                 pending
//   dual(partial)   = replicate   every summand influences the value alike, so each receives
//                                 the whole gradient
//   dual(split(d))  = split(d)    each rank owns the gradient of the block it owns
//
//   value  w  split(m:dp)   (ZeRO-3, stored)    gradient split(m:dp)
//   used   w  replicate     (after all-gather)  gradient partial(dp) -> reduce-scatter
//
// dual(dual(L)) == L. The redistribute between two layouts has, as its backward, the
// redistribute between their duals in the other direction: all-gather <-> reduce-scatter,
// all-reduce <-> zero_partial (local), all-to-all <-> all-to-all.
#pragma once

#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/layout_of.hpp"
#include "zest/layout/placement.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

constexpr axis_placement dual(const axis_placement& p) {
  switch (p.kind) {
    case placement_kind::replicate: return axis_placement{placement_kind::partial, 0, 0};
    case placement_kind::partial: return axis_placement{placement_kind::replicate, 0, 0};
    case placement_kind::split: return p;
  }
  return p;
}

constexpr layout_value dual(layout_value v) {
  layout_value out = v;
  for (std::size_t a = 0; a < v.axis_count; ++a) out.axes[a] = dual(v.axes[a]);
  return out;
}

// The type of X's gradient: same element type, mesh and dims, the dual layout.
template <sharded_tensor X>
using dual_tensor =
    typename with_layout_for<std::remove_cvref_t<X>, dual(std::remove_cvref_t<X>::layout)>::type;

// `v` with its partial axes that are also partial in `other` made replicated: what an
// operand must be reduced to before it meets `other` in a product (a product of two pending
// sums is not the sum of the products).
constexpr layout_value without_shared_partials(layout_value v, layout_value other) {
  layout_value out = v;
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (v.is_partial(a) && other.is_partial(a)) out.axes[a] = axis_placement{};
  }
  return out;
}
}  // namespace zest::autodiff
