// zest/layout/step.hpp — the vocabulary of layout transitions: the steps, and a plan as a
// sequence of them.
//
// Per mesh axis (the table with each step's bytes: docs/design-notes.md, "Transitions: what each
// one sends"):
//   split(d)  -> replicate   all_gather          partial -> replicate  all_reduce
//   partial   -> split(d)    reduce_scatter      split(d) -> split(e)  all_to_all
//   replicate -> split(d)    slice (local)       replicate -> partial  zero_partial (local)
//
// Two planners turn one layout into another with these steps: the fixed order
// (zest/layout/fixed_order_plan.hpp), which needs no sizes and is the compile-time plan, and
// the cheapest plan for the run-time extents and mesh sizes (zest/layout/cheapest_plan.hpp,
// priced by zest/layout/step_cost.hpp, remembered by zest/layout/plan_cache.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zest/comm/communicator.hpp"
#include "zest/layout/layout.hpp"

namespace zest {

// One definition of the collectives' names: the collective steps are the communicators'
// collectives (zest/comm/communicator.hpp), with the same values; slice and zero_partial are
// the local steps after them.
enum class step_kind : std::uint8_t {
  all_gather = static_cast<std::uint8_t>(collective::all_gather),
  reduce_scatter = static_cast<std::uint8_t>(collective::reduce_scatter),
  all_reduce = static_cast<std::uint8_t>(collective::all_reduce),
  all_to_all = static_cast<std::uint8_t>(collective::all_to_all),
  slice = collective_kinds,
  zero_partial
};

// Whether a step talks to other ranks.
constexpr bool is_collective(step_kind k) {
  return k != step_kind::slice && k != step_kind::zero_partial;
}

// The collective a step performs; only valid when is_collective().
constexpr collective collective_of(step_kind k) { return static_cast<collective>(k); }

constexpr std::string_view name_of(step_kind k) {
  switch (k) {
    case step_kind::slice: return "slice";
    case step_kind::zero_partial: return "zero_partial";
    default: return name_of(collective_of(k));
  }
}

struct transition_step {
  step_kind kind;
  std::uint8_t axis;
  char dim;     // the dim gathered, scattered, sliced, or sent away by all_to_all
  char to_dim;  // all_to_all: the dim that becomes split
  constexpr bool operator==(const transition_step&) const = default;
};

struct transition_plan {
  static constexpr std::size_t capacity = 3 * max_axes;
  std::array<transition_step, capacity> steps;
  std::uint8_t count;

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

}  // namespace zest
