// zest/layout/transition.hpp — the steps that turn one layout into another.
//
// Per mesh axis (the table with each step's bytes: docs/design-notes.md, "Transitions: what each
// one sends"):
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
//
// That fixed order needs no sizes: it is the compile-time plan. The plan that runs is the
// cheapest for the run-time extents and mesh sizes, plan_transition(from, to, shape), found
// by a search over layouts further down (with the one pricing function of a step).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include "zest/comm/communicator.hpp"
#include "zest/config.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"

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

// ---------------------------------------------------------------------------------------
// What a step costs, and the cheapest plan.
//
// plan_transition(from, to) above is the fixed-order plan: it needs no sizes, so it is the
// compile-time plan (static checks, transition_plan_v). What runs is the cheapest sequence of
// valid single-axis steps for the tensor's extents and the mesh's sizes (plan_transition with
// a transition_shape): on a 2x2 mesh<"dp","tp">, x "bm" [4x12] floats, from
// split(b:dp) split(m:tp) to split(m:dp),
//   fixed order   all_gather(tp, m) 48 B, all_gather(dp, b) 96 B, slice(dp, m)    144 B
//   cheapest      all_gather(tp, m) 48 B, all_to_all(dp, b -> m) 48 B               96 B
// (bytes sent per rank). docs/design-notes.md, "Transition order", says why it is built so.

// The facts a step's price depends on besides the layouts: the tensor's dims with their
// global extents, and the sizes of the mesh's axes.
struct transition_shape {
  std::array<char, max_dims> dims{};
  std::array<std::size_t, max_dims> extents{};
  std::array<int, max_axes> sizes{};
  std::uint8_t rank = 0;        // number of dims
  std::uint8_t axis_count = 0;  // number of mesh axes
  // An element sent over axis a weighs 1 + penalty[a] in the price (0: every axis alike).
  // ZeRO's hybrid sharding weighs its replica axes, the ones across nodes, more
  // (zero_transition_shape in zest/zero/stage.hpp): the search then sends the fewest
  // elements over them, even at the cost of more in all.
  std::array<std::uint8_t, max_axes> penalty{};
  constexpr bool operator==(const transition_shape&) const = default;
};

// make_transition_shape(std::string_view("bm"), extents, mesh.sizes()), or X::dims for the
// dims: anything with size() and operator[].
template <class Dims, class Extents, class Sizes>
constexpr transition_shape make_transition_shape(const Dims& dims, const Extents& extents,
                                                 const Sizes& sizes) {
  transition_shape s{};
  s.rank = static_cast<std::uint8_t>(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    s.dims[i] = dims[i];
    s.extents[i] = static_cast<std::size_t>(extents[i]);
  }
  s.axis_count = static_cast<std::uint8_t>(sizes.size());
  for (std::size_t a = 0; a < sizes.size(); ++a) s.sizes[a] = static_cast<int>(sizes[a]);
  return s;
}

// The cost of a plan: per step the most that any rank sends (in elements, each weighed by
// its axis' penalty: transition_shape), summed; then the number of collectives, then the
// number of steps. Compared in that order.
struct transition_cost {
  std::uint64_t elements = 0;
  std::uint32_t collectives = 0;
  std::uint32_t steps = 0;
  constexpr bool operator==(const transition_cost&) const = default;
  constexpr bool operator<(const transition_cost& o) const {
    if (elements != o.elements) return elements < o.elements;
    if (collectives != o.collectives) return collectives < o.collectives;
    return steps < o.steps;
  }
  // Cheaper in elements, or as cheap with fewer collectives (the steps do not count).
  constexpr bool strictly_cheaper_than(const transition_cost& o) const {
    return elements < o.elements || (elements == o.elements && collectives < o.collectives);
  }
};

// Every mesh axis (for the `axes` mask of the planner).
inline constexpr unsigned all_mesh_axes = ~0U;

namespace detail {

using mesh_coords = std::array<int, max_axes>;

constexpr std::size_t extent_of(const transition_shape& sh, char d) {
  for (std::size_t i = 0; i < sh.rank; ++i) {
    if (sh.dims[i] == d) return sh.extents[i];
  }
  return 1;
}

// Elements the rank at `c` holds under layout v.
constexpr std::size_t held_elements(const layout_value& v, const transition_shape& sh,
                                    const mesh_coords& c) {
  std::size_t n = 1;
  for (std::size_t i = 0; i < sh.rank; ++i)
    n *= dim_range(v, sh.dims[i], sh.extents[i], sh.sizes, c).size;
  return n;
}

// THE price of a step: the elements the rank at coordinates `c` sends in step s from
// layout v, in the communicators' ring model (zest/comm/communicator.hpp). explain, the
// ZeRO planner, this planner and the tests all price steps with this function, and the
// communicators' counters equal it (times the element size) for every rank.
constexpr std::size_t step_elements(const transition_step& s, const layout_value& v,
                                    const transition_shape& sh, const mesh_coords& c) {
  const auto n = static_cast<std::size_t>(sh.sizes[s.axis]);
  const auto me = static_cast<std::size_t>(c[s.axis]);
  const std::size_t mine = held_elements(v, sh, c);
  switch (s.kind) {
    case step_kind::all_gather: return (n - 1) * mine;  // my block to n-1 peers
    case step_kind::reduce_scatter:                     // everything but my own chunk
      return mine - held_elements(after_step(v, s), sh, c);
    case step_kind::all_reduce: return 2 * (mine - balanced_block(mine, n, me).size);
    case step_kind::all_to_all: {
      // I keep the part of my block that stays mine; the rest leaves.
      const std::size_t to_extent =
          dim_range(v, s.to_dim, extent_of(sh, s.to_dim), sh.sizes, c).size;
      const std::size_t kept =
          to_extent == 0 ? 0 : mine / to_extent * balanced_block(to_extent, n, me).size;
      return mine - kept;
    }
    default: return 0;
  }
}

// The most that any rank sends in step s: a collective ends when its busiest rank is done,
// and every rank must choose the same plan, so the planner prices a step by this maximum,
// not by what this rank sends. Ranks differ only through balanced blocks. A block is largest
// at coordinate 0 and grows with its parent block, and at a fixed coordinate on the step's
// own axis every formula above grows with the blocks; so the maximum over all ranks is the
// maximum over the step axis' coordinates with the other axes at 0 (the exhaustive test
// checks this against every rank).
constexpr std::size_t step_cost(const transition_step& s, const layout_value& v,
                                const transition_shape& sh) {
  if (!is_collective(s.kind)) return 0;
  mesh_coords c{};
  std::size_t worst = 0;
  for (int k = 0; k < sh.sizes[s.axis]; ++k) {
    c[s.axis] = k;
    const std::size_t e = step_elements(s, v, sh, c);
    worst = e > worst ? e : worst;
  }
  return worst;
}
// What the planner adds up: step_cost weighed by the step axis' penalty.
constexpr std::size_t step_price(const transition_step& s, const layout_value& v,
                                 const transition_shape& sh) {
  return step_cost(s, v, sh) * (1U + sh.penalty[s.axis]);
}

}  // namespace detail

// The cost of running `plan` from layout `from` on `shape`.
constexpr transition_cost cost_of(const transition_plan& plan, layout_value from,
                                  const transition_shape& shape) {
  transition_cost c{};
  for (const auto& s : plan) {
    c.elements += detail::step_price(s, from, shape);
    c.collectives += is_collective(s.kind) ? 1U : 0U;
    c.steps += 1;
    from = detail::after_step(from, s);
  }
  return c;
}

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
constexpr void for_each_step(const layout_value& v, const layout_value& to,
                             const transition_shape& sh, unsigned axes, F&& f) {
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

// A layout as one integer, for the search's table: 10 bits per axis.
constexpr std::uint64_t search_key(const layout_value& v) {
  std::uint64_t k = 0;
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    const axis_placement& p = v.axes[a];
    std::uint64_t code = 0;
    if (p.kind == placement_kind::partial) code = 1;
    if (p.kind == placement_kind::split)
      code = 2 + static_cast<unsigned char>(p.dim) * max_axes + p.order;
    k = (k << 10U) | code;
  }
  return k;
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
// thread keeps one (zest/layout/transition.hpp's cached_transition_plan).
struct search_space {
  static constexpr std::size_t buckets = 2 * search_capacity;
  std::array<search_node, search_capacity> nodes{};
  std::array<std::int32_t, buckets> table{};  // node index + 1; 0 = empty
  std::array<std::int32_t, search_capacity> heap{};
};

// Dijkstra's search for the cheapest plan, or `fixed` when none is strictly cheaper than
// `bound` (when fixed_allowed) or the table fills up. Ties between open layouts go to the
// one found first, so the result depends on nothing but the arguments.
constexpr transition_plan search_transition(const layout_value& from, const layout_value& to,
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
  auto find = [&](const layout_value& v, std::size_t& slot) -> std::int32_t {
    const std::uint64_t key = search_key(v);
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
  auto insert = [&](const layout_value& v, std::size_t slot) -> std::int32_t {
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
constexpr transition_plan plan_transition(const layout_value& from, const layout_value& to,
                                          const transition_shape& shape,
                                          unsigned axes = all_mesh_axes) {
  const transition_plan fixed = plan_transition(from, to);
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

namespace detail {
// Run-time plans are searched once per (from, to, shape, axes) and thread: a small
// direct-mapped cache keeps the recent ones (a training step redistributes the same few
// shapes again and again).
inline transition_plan cached_transition_plan(const layout_value& from, const layout_value& to,
                                              const transition_shape& shape,
                                              unsigned axes = all_mesh_axes) {
  if (from == to) return transition_plan{};
  struct entry {
    layout_value from{}, to{};
    transition_shape shape{};
    unsigned axes = 0;
    transition_plan plan{};
    bool used = false;
  };
  static thread_local std::array<entry, 64> cache{};
  std::uint64_t h = search_key(from) * 31U + search_key(to) + axes;
  for (std::size_t i = 0; i < shape.rank; ++i) h = h * 1000003U + shape.extents[i];
  for (std::size_t a = 0; a < shape.axis_count; ++a)
    h = h * 131U + static_cast<std::uint64_t>(shape.sizes[a]) * 7U + shape.penalty[a];
  entry& e = cache[static_cast<std::size_t>((h * 0x9E3779B97F4A7C15ULL) >> 58U)];
  if (!e.used || e.from != from || e.to != to || e.axes != axes || !(e.shape == shape)) {
    e = entry{from, to, shape, axes, plan_transition(from, to, shape, axes), true};
  }
  return e.plan;
}
}  // namespace detail

// The plan that runs for a tensor with dims Dims and global extents `global` on `mesh`
// (anything with sizes()): the cheapest one, as redistribute, einsum and explain use it.
template <fixed_string Dims, class Extents, class Mesh>
transition_plan transition_plan_for(const layout_value& from, const layout_value& to,
                                    const Extents& global, const Mesh& mesh,
                                    unsigned axes = all_mesh_axes) {
  return detail::cached_transition_plan(from, to, make_transition_shape(Dims, global, mesh.sizes()),
                                        axes);
}

}  // namespace zest
