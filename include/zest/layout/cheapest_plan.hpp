// zest/layout/cheapest_plan.hpp — the cheapest plan between two layouts for a tensor's
// extents and the mesh's sizes: a Dijkstra search over layouts, each step priced by
// zest/layout/step_cost.hpp, bounded by the fixed-order plan (zest/layout/fixed_order_plan.hpp).
//
// The fixed order needs no sizes, so it is the compile-time plan (static checks,
// transition_plan_v). What runs is the cheapest sequence of valid single-axis steps for the
// tensor's extents and the mesh's sizes: on a 2x2 mesh<"dp","tp">, x "bm" [4x12] floats,
// from split(b:dp) split(m:tp) to split(m:dp),
//   fixed order   all_gather(tp, m) 48 B, all_gather(dp, b) 96 B, slice(dp, m)    144 B
//   cheapest      all_gather(tp, m) 48 B, all_to_all(dp, b -> m) 48 B               96 B
// (bytes sent per rank). docs/design-notes.md, "Transition order", says why it is built so.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "zest/layout/fixed_order_plan.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"

namespace zest {

namespace detail {

// Layouts one search may visit. The space of layouts is small for the meshes and tensors in
// use (a 3-dim tensor on 3 axes has 176, on 4 axes 1240), and the search visits only those
// cheaper than the fixed-order plan; when it would need more, that plan is kept.
inline constexpr std::size_t search_capacity = 4096;

// Calls f(step) for every valid single-axis step from v on the axes in `axes`:
//   split (innermost of its dim) -> all_gather, or all_to_all to any other dim (innermost there)
//   partial                      -> all_reduce, or reduce_scatter into any dim (innermost)
//   replicate                    -> slice any dim (innermost), or zero_partial
// zero_partial is offered only where `to` is partial: a pending sum made elsewhere must be
// reduced later, and dropping the zero_partial (and turning that reduce_scatter into a slice)
// gives a valid plan that is no dearer, so no cheapest plan needs one.
template <class F>
constexpr void for_each_step(layout_value v, layout_value to, const transition_shape& sh,
                             unsigned axes, F&& f) {
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (((axes >> a) & 1U) == 0) continue;
    const auto u8 = static_cast<std::uint8_t>(a);
    const axis_placement& p = v.axes[a];
    if (p.kind == placement_kind::split) {
      if (p.order + 1U != v.split_count(p.dim)) continue;  // only the innermost axis moves
      f(transition_step{step_kind::all_gather, u8, p.dim, 0});
      for (std::size_t i = 0; i < sh.rank; ++i) {
        if (sh.dims[i] != p.dim) f(transition_step{step_kind::all_to_all, u8, p.dim, sh.dims[i]});
      }
    } else if (p.kind == placement_kind::partial) {
      f(transition_step{step_kind::all_reduce, u8, 0, 0});
      for (std::size_t i = 0; i < sh.rank; ++i)
        f(transition_step{step_kind::reduce_scatter, u8, sh.dims[i], 0});
    } else {
      for (std::size_t i = 0; i < sh.rank; ++i)
        f(transition_step{step_kind::slice, u8, sh.dims[i], 0});
      if (to.is_partial(a)) f(transition_step{step_kind::zero_partial, u8, 0, 0});
    }
  }
}

constexpr bool uses_only(const transition_plan& plan, unsigned axes) {
  for (const auto& s : plan) {
    if (((axes >> s.axis) & 1U) == 0) return false;
  }
  return true;
}

struct search_node {
  layout_value layout{};
  transition_cost cost{};
  transition_step step{};  // the step that reached this layout
  std::int32_t parent = -1;
  std::int32_t bucket = -1;   // its slot in the table
  std::int32_t heap_at = -1;  // its place in the heap while open; -1 once closed
};

// The memory of one search: nodes, an open-addressing table of them by layout, and a binary
// heap of the open ones. A constant evaluation makes one on its stack; at run time each
// thread keeps one (zest/layout/plan_cache.hpp).
struct search_space {
  static constexpr std::size_t buckets = 2 * search_capacity;
  std::array<search_node, search_capacity> nodes{};
  std::array<std::int32_t, buckets> table{};  // node index + 1; 0 = empty
  std::array<std::int32_t, search_capacity> heap{};
};

// Dijkstra's search for the cheapest plan, or `fixed` when none is strictly cheaper than
// `bound` (when fixed_allowed) or the table fills up. Ties between open layouts go to the
// one found first, so the result depends on nothing but the arguments.
constexpr transition_plan search_transition(layout_value from, layout_value to,
                                            const transition_shape& shape, unsigned axes,
                                            const transition_plan& fixed, bool fixed_allowed,
                                            const transition_cost& bound, search_space& ws) {
  std::size_t count = 0, open = 0;
  bool overflow = false;

  auto before = [&](std::int32_t a, std::int32_t b) {  // heap order: cost, then discovery
    const auto& x = ws.nodes[static_cast<std::size_t>(a)].cost;
    const auto& y = ws.nodes[static_cast<std::size_t>(b)].cost;
    return x < y || (x == y && a < b);
  };
  auto place = [&](std::size_t at, std::int32_t node) {
    ws.heap[at] = node;
    ws.nodes[static_cast<std::size_t>(node)].heap_at = static_cast<std::int32_t>(at);
  };
  auto sift_up = [&](std::size_t at) {
    const std::int32_t node = ws.heap[at];
    while (at > 0 && before(node, ws.heap[(at - 1) / 2])) {
      place(at, ws.heap[(at - 1) / 2]);
      at = (at - 1) / 2;
    }
    place(at, node);
  };
  auto sift_down = [&](std::size_t at) {
    const std::int32_t node = ws.heap[at];
    for (;;) {
      std::size_t child = 2 * at + 1;
      if (child >= open) break;
      if (child + 1 < open && before(ws.heap[child + 1], ws.heap[child])) ++child;
      if (!before(ws.heap[child], node)) break;
      place(at, ws.heap[child]);
      at = child;
    }
    place(at, node);
  };
  // The node of layout v, or -1 with `slot` set to the empty bucket where it would go.
  auto find = [&](layout_value v, std::size_t& slot) -> std::int32_t {
    const auto key = static_cast<std::uint64_t>(layout_key(v));
    std::size_t h =
        static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> 40U) % search_space::buckets;
    while (ws.table[h] != 0) {
      const std::int32_t i = ws.table[h] - 1;
      if (ws.nodes[static_cast<std::size_t>(i)].layout == v) return i;
      h = (h + 1) % search_space::buckets;
    }
    slot = h;
    return -1;
  };
  // A new open node for layout v in bucket `slot`; -1 when the table is full.
  auto insert = [&](layout_value v, std::size_t slot) -> std::int32_t {
    if (count == search_capacity) return -1;
    const auto i = static_cast<std::int32_t>(count++);
    ws.table[slot] = i + 1;
    ws.nodes[static_cast<std::size_t>(i)] =
        search_node{v, {}, {}, -1, static_cast<std::int32_t>(slot), -1};
    place(open++, i);
    return i;
  };

  transition_plan result = fixed;
  std::size_t slot = 0;
  (void)find(from, slot);
  (void)insert(from, slot);
  while (open != 0 && !overflow) {
    const auto at = static_cast<std::size_t>(ws.heap[0]);
    ws.nodes[at].heap_at = -1;
    if (--open != 0) {
      place(0, ws.heap[open]);
      sift_down(0);
    }
    if (ws.nodes[at].layout == to) {
      std::array<transition_step, transition_plan::capacity> back{};
      std::size_t n = 0;
      for (std::int32_t i = static_cast<std::int32_t>(at);
           ws.nodes[static_cast<std::size_t>(i)].parent >= 0;
           i = ws.nodes[static_cast<std::size_t>(i)].parent)
        back[n++] = ws.nodes[static_cast<std::size_t>(i)].step;
      result = transition_plan{};
      while (n > 0) result.push(back[--n]);
      break;
    }
    const layout_value here = ws.nodes[at].layout;
    const transition_cost paid = ws.nodes[at].cost;
    for_each_step(here, to, shape, axes, [&](const transition_step& s) {
      if (overflow || paid.steps + 1 > transition_plan::capacity) return;
      const layout_value next = after_step(here, s);
      std::int32_t i = find(next, slot);
      if (i >= 0 && ws.nodes[static_cast<std::size_t>(i)].heap_at < 0) return;  // closed
      transition_cost c = paid;
      c.elements += step_price(s, here, shape);
      c.collectives += is_collective(s.kind) ? 1U : 0U;
      c.steps += 1;
      if (fixed_allowed && !c.strictly_cheaper_than(bound)) return;  // cannot beat the incumbent
      if (i >= 0 && !(c < ws.nodes[static_cast<std::size_t>(i)].cost)) return;
      if (i < 0) i = insert(next, slot);
      if (i < 0) {
        overflow = true;
        return;
      }
      search_node& node = ws.nodes[static_cast<std::size_t>(i)];
      node.cost = c;
      node.parent = static_cast<std::int32_t>(at);
      node.step = s;
      sift_up(static_cast<std::size_t>(node.heap_at));
    });
  }
  if (overflow) result = fixed;
  for (std::size_t i = 0; i < count; ++i)  // leave the table empty for the next search
    ws.table[static_cast<std::size_t>(ws.nodes[i].bucket)] = 0;
  return result;
}

// The run-time search's memory: one per thread, allocated on first use.
inline search_space& thread_search_space() {
  static thread_local std::unique_ptr<search_space> ws;
  if (!ws) ws = std::make_unique<search_space>();
  return *ws;
}

}  // namespace detail

// The cheapest plan from `from` to `to` for a tensor and mesh of this shape: the sequence of
// valid single-axis steps (every intermediate is a layout) whose cost_of is least, ties
// going to fewer collectives and then fewer steps. The fixed-order plan is kept whenever no
// plan is strictly cheaper in bytes or collectives, so it is what runs in every case where
// it was already the best. `axes` restricts the steps to a set of mesh axes (bit a: axis a).
// A Dijkstra search over layouts, bounded by the fixed-order plan's cost; constexpr.
constexpr transition_plan cheapest_plan(layout_value from, layout_value to,
                                        const transition_shape& shape,
                                        unsigned axes = all_mesh_axes) {
  const transition_plan fixed = fixed_order_plan(from, to);
  const bool fixed_allowed = detail::uses_only(fixed, axes);
  if (fixed.collectives() == 0 && fixed_allowed) return fixed;  // sends nothing: optimal
  const transition_cost bound = cost_of(fixed, from, shape);
  if (std::is_constant_evaluated()) {
    detail::search_space ws{};
    return detail::search_transition(from, to, shape, axes, fixed, fixed_allowed, bound, ws);
  }
  return detail::search_transition(from, to, shape, axes, fixed, fixed_allowed, bound,
                                   detail::thread_search_space());
}

}  // namespace zest
