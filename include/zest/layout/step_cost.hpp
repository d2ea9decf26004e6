// zest/layout/step_cost.hpp — what a step and a plan cost: the one pricing function of a
// step (detail::step_elements), which explain, the ZeRO planner, the cheapest-plan search and
// the tests use, and which the communicators' counters equal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "zest/config.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/step.hpp"

namespace zest {

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
constexpr std::size_t held_elements(layout_value v, const transition_shape& sh,
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
constexpr std::size_t step_elements(const transition_step& s, layout_value v,
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
constexpr std::size_t step_cost(const transition_step& s, layout_value v,
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
constexpr std::size_t step_price(const transition_step& s, layout_value v,
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

}  // namespace zest
