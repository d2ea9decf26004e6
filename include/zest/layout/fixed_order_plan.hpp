// zest/layout/fixed_order_plan.hpp — the plan between two layouts in a fixed order, which
// needs no sizes: the compile-time plan (static checks, transition_plan_v, einsum's plan).
//
// fixed_order_plan orders the steps so that every intermediate layout is valid: partial axes
// are resolved first (reduce-scatter when the target split can take it directly), then
// splits that must go are undone from the innermost axis out (all-to-all where the axis
// moves to another dim, all-gather otherwise), then new splits are sliced, major first.
//
//   split(b:dp)         -> split(s:dp)           all_to_all(dp, b->s)
//   split(m:dp,tp)      -> replicate             all_gather(tp, m), all_gather(dp, m)
//   partial(dp)         -> split(b:dp)           reduce_scatter(dp, b)
//
// The plan that runs is the cheapest for the run-time extents and mesh sizes
// (zest/layout/cheapest_plan.hpp), which keeps this one wherever nothing is cheaper.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zest/layout/layout.hpp"
#include "zest/layout/step.hpp"

namespace zest {

namespace detail {
// True when the splits of d in `cur` are exactly the first k splits of d in `to`.
constexpr bool is_split_prefix(layout_value cur, layout_value to, char d, std::size_t k) {
  if (cur.split_count(d) != k || to.split_count(d) < k) return false;
  for (std::size_t j = 0; j < k; ++j) {
    if (cur.split_axis(d, j) != to.split_axis(d, j)) return false;
  }
  return true;
}
}  // namespace detail

constexpr transition_plan fixed_order_plan(layout_value from, layout_value to) {
  transition_plan plan{};
  layout_value cur = from;
  const std::size_t n = from.axis_count;

  // 1. Pending sums: reduce-scatter straight into the target split when it nests, else all-reduce.
  for (std::size_t a = 0; a < n; ++a) {
    if (!cur.is_partial(a) || to.is_partial(a)) continue;
    const auto u8 = static_cast<std::uint8_t>(a);
    if (to.is_split(a) && detail::is_split_prefix(cur, to, to.axes[a].dim, to.axes[a].order)) {
      plan.push({step_kind::reduce_scatter, u8, to.axes[a].dim, 0});
      cur.axes[a] = to.axes[a];
    } else {
      plan.push({step_kind::all_reduce, u8, 0, 0});
      cur.axes[a] = axis_placement{};
    }
  }

  // 2. Undo the splits that do not belong to the target's nesting, innermost first.
  for (std::size_t a0 = 0; a0 < n; ++a0) {
    if (!cur.is_split(a0) || cur.axes[a0].order != 0) continue;
    const char d = cur.axes[a0].dim;
    std::size_t keep = 0;
    while (keep < cur.split_count(d) && keep < to.split_count(d) &&
           cur.split_axis(d, keep) == to.split_axis(d, keep)) {
      ++keep;
    }
    for (std::size_t j = cur.split_count(d); j-- > keep;) {
      const std::size_t a = cur.split_axis(d, j);
      const auto u8 = static_cast<std::uint8_t>(a);
      const bool moves = to.is_split(a) && to.axes[a].dim != d &&
                         detail::is_split_prefix(cur, to, to.axes[a].dim, to.axes[a].order);
      if (moves) {
        plan.push({step_kind::all_to_all, u8, d, to.axes[a].dim});
        cur.axes[a] = to.axes[a];
      } else {
        plan.push({step_kind::all_gather, u8, d, 0});
        cur.axes[a] = axis_placement{};
      }
    }
  }

  // 3. New splits, major first, so each slice nests inside the ones before it.
  for (std::size_t k = 0; k < max_axes; ++k) {
    for (std::size_t a = 0; a < n; ++a) {
      if (!to.is_split(a) || to.axes[a].order != k || cur.axes[a] == to.axes[a]) continue;
      plan.push({step_kind::slice, static_cast<std::uint8_t>(a), to.axes[a].dim, 0});
      cur.axes[a] = to.axes[a];
    }
  }

  // 4. New pending sums: the value stays on coordinate 0, the other ranks hold zeros.
  for (std::size_t a = 0; a < n; ++a) {
    if (to.is_partial(a) && !cur.is_partial(a)) {
      plan.push({step_kind::zero_partial, static_cast<std::uint8_t>(a), 0, 0});
      cur.axes[a] = to.axes[a];
    }
  }
  return plan;
}

}  // namespace zest
