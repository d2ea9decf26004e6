// zest/layout/plan_cache.hpp — the plans that run: the cheapest plan (zest/layout/cheapest_plan.hpp)
// searched once per (from, to, shape, axes) and thread, and transition_plan_for, what
// redistribute, einsum and explain ask for.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "zest/core/fixed_string.hpp"
#include "zest/layout/cheapest_plan.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"

namespace zest {

namespace detail {
// Run-time plans are searched once per (from, to, shape, axes) and thread: a small
// direct-mapped cache keeps the recent ones (a training step redistributes the same few
// shapes again and again).
inline transition_plan cached_transition_plan(layout_value from, layout_value to,
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
  std::uint64_t h = static_cast<std::uint64_t>(layout_key(from)) * 31U +
                    static_cast<std::uint64_t>(layout_key(to)) + axes;
  for (std::size_t i = 0; i < shape.rank; ++i) h = h * 1000003U + shape.extents[i];
  for (std::size_t a = 0; a < shape.axis_count; ++a)
    h = h * 131U + static_cast<std::uint64_t>(shape.sizes[a]) * 7U + shape.penalty[a];
  entry& e = cache[static_cast<std::size_t>((h * 0x9E3779B97F4A7C15ULL) >> 58U)];
  if (!e.used || e.from != from || e.to != to || e.axes != axes || !(e.shape == shape)) {
    e = entry{from, to, shape, axes, cheapest_plan(from, to, shape, axes), true};
  }
  return e.plan;
}
}  // namespace detail

// The plan that runs for a tensor with dims Dims and global extents `global` on `mesh`
// (anything with sizes()): the cheapest one, as redistribute, einsum and explain use it.
template <fixed_string Dims, class Extents, class Mesh>
transition_plan transition_plan_for(layout_value from, layout_value to, const Extents& global,
                                    const Mesh& mesh, unsigned axes = all_mesh_axes) {
  return detail::cached_transition_plan(from, to, make_transition_shape(Dims, global, mesh.sizes()),
                                        axes);
}

}  // namespace zest
