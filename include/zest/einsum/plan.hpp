// zest/einsum/plan.hpp — the layouts an einsum needs, derived at compile time.
//
// For every mesh axis, from the operands' placements on it (docs/design-notes.md, "The einsum
// rules"):
//   1. a dim split in the output and in every operand that has it stays split: no comm;
//   2. a contracted dim split alike in all operands that have it: local contraction, the
//      output is partial on that axis;
//   3. a dim split in one operand, the others replicated on that axis: the others are sliced
//      locally (free) and the output keeps the split, or becomes partial if contracted;
//   4. one partial operand, the rest brought to replicate on that axis: the output is partial;
//      two partial operands on one axis do not compile ("reduce first");
//   5. conflicts go to the policy (zest/einsum/policy.hpp).
// The dims of the ranked operands claim mesh axes in turn: a dim takes the axes of its
// split, in nesting order, as long as no other dim holds them. Each operand is then
// redistributed to the claimed splits, which is where the collectives come from.
//
//   "bsm,mh->bsh", x split(b:dp), w split(m:dp), gather_weights:
//     b claims dp; m cannot -> w: all_gather over dp (dim m); result split(b:dp)
//   same, keep_weights: m claims dp; b cannot -> x: all_gather over dp (dim b), slice m
//     over dp; result partial(dp)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "zest/config.hpp"
#include "zest/einsum/spec.hpp"
#include "zest/layout/fixed_order_plan.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/plan_cache.hpp"
#include "zest/layout/step.hpp"

namespace zest {

enum class einsum_problem : std::uint8_t { none, partial_twice };

struct einsum_plan {
  std::array<layout_value, max_operands> operand_layouts{};  // what each operand is brought to
  // The fixed-order plans (fixed_order_plan(from, to)): whether and at most what each transition
  // sends. What runs is the cheapest plan for the run-time extents (transition_plan_for).
  std::array<transition_plan, max_operands> operand_steps{};
  layout_value contraction_output{};  // layout of the local contraction's result
  transition_plan output_steps{};     // to a layout the caller forced
  layout_value result{};
  std::uint8_t operand_count = 0;
  einsum_problem problem = einsum_problem::none;
  std::uint8_t problem_axis = 0;

  constexpr std::size_t collectives() const {
    std::size_t n = output_steps.collectives();
    for (std::size_t i = 0; i < operand_count; ++i) n += operand_steps[i].collectives();
    return n;
  }
  constexpr std::size_t input_collectives() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < operand_count; ++i) n += operand_steps[i].collectives();
    return n;
  }
};

// `ranking` lists operand indices, the one that keeps its layout first.
constexpr einsum_plan plan_einsum(const einsum_spec& spec,
                                  const std::array<layout_value, max_operands>& in,
                                  const std::array<std::uint8_t, max_operands>& ranking,
                                  const layout_value* forced = nullptr) {
  einsum_plan plan;
  plan.operand_count = spec.operand_count;
  const std::size_t n_axes = in[0].axis_count;
  constexpr char partial_owner = 1;  // marks an axis reserved by a partial operand
  std::array<char, max_axes> owner{};
  std::array<int, max_axes> partial_operand{};
  partial_operand.fill(-1);

  // Rule 4: a pending sum on an axis reserves it.
  for (std::size_t a = 0; a < n_axes; ++a) {
    for (std::size_t i = 0; i < spec.operand_count; ++i) {
      if (!in[i].is_partial(a)) continue;
      if (partial_operand[a] >= 0) {
        plan.problem = einsum_problem::partial_twice;
        plan.problem_axis = static_cast<std::uint8_t>(a);
        return plan;
      }
      partial_operand[a] = static_cast<int>(i);
      owner[a] = partial_owner;
    }
  }

  // Rules 1-3, 5: dims claim axes, operands in the policy's ranking.
  std::array<std::array<std::uint8_t, max_axes>, 128> claimed{};
  std::array<std::uint8_t, 128> claimed_count{};
  std::array<bool, 128> settled{};
  for (std::size_t r = 0; r < spec.operand_count; ++r) {
    const std::size_t i = ranking[r];
    const einsum_term& term = spec.inputs[i];
    for (std::size_t k = 0; k < term.size; ++k) {
      const char d = term.letters[k];
      const auto u = static_cast<unsigned char>(d);
      if (settled[u] || in[i].split_count(d) == 0) continue;
      settled[u] = true;
      for (std::size_t j = 0; j < in[i].split_count(d); ++j) {
        const std::size_t a = in[i].split_axis(d, j);
        if (owner[a] != 0) break;  // nesting: what follows an unavailable axis cannot stay
        owner[a] = d;
        claimed[u][claimed_count[u]++] = static_cast<std::uint8_t>(a);
      }
    }
  }

  auto place_dim = [&](layout_value& v, char d) {
    const auto u = static_cast<unsigned char>(d);
    for (std::size_t j = 0; j < claimed_count[u]; ++j) {
      v.axes[claimed[u][j]] =
          axis_placement{placement_kind::split, d, static_cast<std::uint8_t>(j)};
    }
  };

  for (std::size_t i = 0; i < spec.operand_count; ++i) {
    layout_value v = replicated_layout(n_axes);
    for (std::size_t k = 0; k < spec.inputs[i].size; ++k) place_dim(v, spec.inputs[i].letters[k]);
    for (std::size_t a = 0; a < n_axes; ++a) {
      if (partial_operand[a] == static_cast<int>(i))
        v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
    }
    plan.operand_layouts[i] = v;
    plan.operand_steps[i] = fixed_order_plan(in[i], v);
  }

  layout_value out = replicated_layout(n_axes);
  for (std::size_t k = 0; k < spec.output.size; ++k) place_dim(out, spec.output.letters[k]);
  for (std::size_t a = 0; a < n_axes; ++a) {
    const bool contracted_split = owner[a] > partial_owner && !spec.output.has(owner[a]);
    if (partial_operand[a] >= 0 || contracted_split)
      out.axes[a] = axis_placement{placement_kind::partial, 0, 0};
  }
  plan.contraction_output = out;
  plan.result = forced ? *forced : out;
  plan.output_steps = fixed_order_plan(out, plan.result);
  return plan;
}

}  // namespace zest
