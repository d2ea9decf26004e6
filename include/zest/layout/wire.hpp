// zest/layout/wire.hpp — what a transition's collectives put on the wire: the elements as
// they are, or int8 with one fp32 scale per block of elements (ZeRO++'s qwZ and qgZ).
//
//   wire_format exact{};                          // the elements' own type
//   wire_format q = int8_blocks(256);             // 1 byte per element + 4 per 256
//   q.bytes(1000)                                 // 4 * 4 scales + 1000 payload = 1016
//   q.carries(step_kind::all_gather, 4)           // true: the gathered blocks travel in int8
//   q.carries(step_kind::reduce_scatter, 4)       // true: an int8 all-to-all, summed in fp32
//   q.carries(step_kind::all_reduce, 4)           // false: sums travel exact
//   q.carries(step_kind::all_gather, 1)           // false: over one rank nothing travels
//   int8_all_gathers(256), int8_reduce_scatters(256)   // one kind only (qwZ, qgZ)
//
// A block of B elements travels as a scale s = max |x| / 127 and the bytes round(127 x / max |x|),
// each in [-127, 127]; it decodes to q s, within s / 2 of x. The encoding is per block of
// one tensor's part for one rank (blocks never span two tensors of a coalesced collective):
// a tensor's part costs bytes(count) = 4 ceil(count / B) + count rounded up to 4, scales
// first, so every part starts 4-aligned. A block holding a NaN or an infinity decodes to
// NaN throughout (a loss scaler then sees the overflow).
//
// All-gathers carry the blocks; a reduce-scatter becomes an all-to-all of each rank's
// quantized parts, which the receiver decodes and sums in fp32, in rank order, rounding once
// (qgZ's dequantize-reduce). All-reduces and all-to-alls of other kinds travel exact. The
// mover (zest/tensor/transition_group.hpp) runs this; the ZeRO planner and explain price it
// with step_wire_bytes below, which equals the communicators' counters.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zest/comm/communicator.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"

namespace zest {

struct wire_format {
  std::uint32_t block = 0;      // 0: exact; B: int8 with one fp32 scale per B elements
  bool all_gathers = true;      // whether it carries the all-gathers,
  bool reduce_scatters = true;  // and the reduce-scatters

  constexpr bool quantized() const { return block != 0; }
  // Whether a step of kind k over an axis of `ranks` ranks travels quantized (over one rank
  // nothing travels, and the values stay exact).
  constexpr bool carries(step_kind k, std::size_t ranks) const {
    return quantized() && ranks > 1 &&
           ((k == step_kind::all_gather && all_gathers) ||
            (k == step_kind::reduce_scatter && reduce_scatters));
  }
  // Bytes of one tensor's part of `count` elements, quantized.
  constexpr std::size_t bytes(std::size_t count) const {
    if (count == 0) return 0;
    return 4 * ((count + block - 1) / block) + (count + 3) / 4 * 4;
  }
  // The collective the communicators see for such a step.
  constexpr collective collective_for(step_kind k, std::size_t ranks) const {
    return carries(k, ranks) && k == step_kind::reduce_scatter ? collective::all_to_all
                                                               : collective_of(k);
  }
  constexpr bool operator==(const wire_format&) const = default;
};

inline constexpr wire_format exact_wire{};
// Both kinds in blocks of B; the all-gathers only (qwZ); the reduce-scatters only (qgZ).
// A block of 0 is the exact wire.
constexpr wire_format int8_blocks(std::uint32_t block) { return wire_format{block, true, true}; }
constexpr wire_format int8_all_gathers(std::uint32_t block) {
  return block == 0 ? exact_wire : wire_format{block, true, false};
}
constexpr wire_format int8_reduce_scatters(std::uint32_t block) {
  return block == 0 ? exact_wire : wire_format{block, false, true};
}

namespace detail {

// Bytes the rank at `c` sends in step s from layout v, on `wire` (elements of element_size
// bytes when the step travels exact): the communicators' counters for the step.
constexpr std::uint64_t step_wire_bytes(const transition_step& s, layout_value v,
                                        const transition_shape& sh, const mesh_coords& c,
                                        const wire_format& wire, std::size_t element_size) {
  const auto n = static_cast<std::size_t>(sh.sizes[s.axis]);
  if (!wire.carries(s.kind, n)) {
    return static_cast<std::uint64_t>(step_elements(s, v, sh, c)) * element_size;
  }
  const auto me = static_cast<std::size_t>(c[s.axis]);
  const std::size_t mine = held_elements(v, sh, c);
  if (s.kind == step_kind::all_gather)
    return static_cast<std::uint64_t>((n - 1) * wire.bytes(mine));
  // reduce_scatter: part r of my block (rank r's block of the dim) to each rank r but me.
  const std::size_t extent = dim_range(v, s.dim, extent_of(sh, s.dim), sh.sizes, c).size;
  if (extent == 0) return 0;
  const std::size_t rest = mine / extent;
  std::uint64_t b = 0;
  for (std::size_t r = 0; r < n; ++r) {
    if (r != me) b += wire.bytes(rest * balanced_block(extent, n, r).size);
  }
  return b;
}

}  // namespace detail

}  // namespace zest
