// zest/layout/transition.hpp — the steps that turn one layout into another, at compile time.
//
// Per mesh axis (DESIGN.md's table):
//   split(d)  -> replicate   all_gather          partial -> replicate  all_reduce
//   partial   -> split(d)    reduce_scatter      split(d) -> split(e)  all_to_all
//   replicate -> split(d)    slice (local)       replicate -> partial  zero_partial (local)
//
// plan_transition orders the steps so that every intermediate layout is valid: partial axes
// are resolved first (reduce-scatter when the target split can take it directly), then
// splits that must go are undone from the innermost axis out (all-to-all where the axis
// moves to another dim, all-gather otherwise), then new splits are sliced, major first.
//
//   split(b:dp)         -> split(s:dp)           all_to_all(dp, b->s)
//   split(m:dp,tp)      -> replicate             all_gather(tp, m), all_gather(dp, m)
//   partial(dp)         -> split(b:dp)           reduce_scatter(dp, b)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zest/comm/communicator.hpp"
#include "zest/config.hpp"
#include "zest/layout/layout.hpp"

namespace zest {

enum class step_kind : std::uint8_t {
  all_gather,
  reduce_scatter,
  all_reduce,
  all_to_all,
  slice,
  zero_partial
};

constexpr std::string_view name_of(step_kind k) {
  switch (k) {
    case step_kind::all_gather: return "all_gather";
    case step_kind::reduce_scatter: return "reduce_scatter";
    case step_kind::all_reduce: return "all_reduce";
    case step_kind::all_to_all: return "all_to_all";
    case step_kind::slice: return "slice";
    case step_kind::zero_partial: return "zero_partial";
  }
  return "?";
}

// Whether a step talks to other ranks.
constexpr bool is_collective(step_kind k) {
  return k != step_kind::slice && k != step_kind::zero_partial;
}

struct transition_step {
  step_kind kind = step_kind::slice;
  std::uint8_t axis = 0;
  char dim = 0;     // the dim gathered, scattered, sliced, or sent away by all_to_all
  char to_dim = 0;  // all_to_all: the dim that becomes split
  constexpr bool operator==(const transition_step&) const = default;
};

struct transition_plan {
  static constexpr std::size_t capacity = 3 * max_axes;
  std::array<transition_step, capacity> steps{};
  std::uint8_t count = 0;

  constexpr void push(transition_step s) { steps[count++] = s; }
  constexpr const transition_step* begin() const { return steps.data(); }
  constexpr const transition_step* end() const { return steps.data() + count; }
  constexpr std::size_t size() const { return count; }
  constexpr const transition_step& operator[](std::size_t i) const { return steps[i]; }
  constexpr std::size_t collectives() const {
    std::size_t n = 0;
    for (const auto& s : *this) n += is_collective(s.kind) ? 1U : 0U;
    return n;
  }
  constexpr std::size_t count_of(step_kind k) const {
    std::size_t n = 0;
    for (const auto& s : *this) n += s.kind == k ? 1U : 0U;
    return n;
  }
};

namespace detail {
// True when the splits of d in `cur` are exactly the first k splits of d in `to`.
constexpr bool is_split_prefix(const layout_value& cur, const layout_value& to, char d,
                               std::size_t k) {
  if (cur.split_count(d) != k || to.split_count(d) < k) return false;
  for (std::size_t j = 0; j < k; ++j) {
    if (cur.split_axis(d, j) != to.split_axis(d, j)) return false;
  }
  return true;
}
}  // namespace detail

namespace detail {
// The layout after one step.
// Shared by the planner below, redistribute's execution and explain's byte model.
constexpr layout_value after_step(layout_value v, const transition_step& s) {
  auto& p = v.axes[s.axis];
  switch (s.kind) {
    case step_kind::all_gather:
    case step_kind::all_reduce: p = axis_placement{}; break;
    case step_kind::zero_partial: p = axis_placement{placement_kind::partial, 0, 0}; break;
    case step_kind::slice:
    case step_kind::reduce_scatter: {
      const auto order = static_cast<std::uint8_t>(v.split_count(s.dim));
      p = axis_placement{placement_kind::split, s.dim, order};
      break;
    }
    case step_kind::all_to_all: {
      const auto order = static_cast<std::uint8_t>(v.split_count(s.to_dim));
      p = axis_placement{placement_kind::split, s.to_dim, order};
      break;
    }
  }
  return v;
}

}  // namespace detail

constexpr transition_plan plan_transition(const layout_value& from, const layout_value& to) {
  transition_plan plan;
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

// "all_gather over dp (dim m)"
template <class AxisNames>
std::string to_string(const transition_step& s, const AxisNames& names) {
  std::string out(name_of(s.kind));
  out += " over ";
  out += names[s.axis];
  switch (s.kind) {
    case step_kind::all_gather:
    case step_kind::reduce_scatter:
    case step_kind::slice:
      out += " (dim ";
      out += s.dim;
      out += ')';
      break;
    case step_kind::all_to_all:
      out += " (dim ";
      out += s.dim;
      out += " -> ";
      out += s.to_dim;
      out += ')';
      break;
    default: break;
  }
  return out;
}

// The collective a step performs (for byte accounting); only valid when is_collective().
constexpr collective collective_of(step_kind k) {
  switch (k) {
    case step_kind::all_gather: return collective::all_gather;
    case step_kind::reduce_scatter: return collective::reduce_scatter;
    case step_kind::all_reduce: return collective::all_reduce;
    default: return collective::all_to_all;
  }
}

}  // namespace zest
