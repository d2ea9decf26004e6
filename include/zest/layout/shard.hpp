// zest/layout/shard.hpp — which block of the global tensor a rank holds.
//
// Splits are balanced: extent N over p parts gives the first N % p parts one extra element.
//   50257 over 4 -> [0,12565) [12565,25129) [25129,37693) [37693,50257)
// A dim split over several axes is split over the first, then each block over the next.
#pragma once

#include <algorithm>
#include <cstddef>

#include "zest/layout/layout.hpp"

namespace zest {

struct block_range {
  std::size_t offset = 0;
  std::size_t size = 0;
  constexpr bool operator==(const block_range&) const = default;
};

constexpr block_range balanced_block(std::size_t extent, std::size_t parts, std::size_t index) {
  const std::size_t q = extent / parts;
  const std::size_t r = extent % parts;
  return {index * q + std::min(index, r), q + (index < r ? 1U : 0U)};
}

// The range of dim d (global extent `extent`) that the rank at `coords` holds under layout
// v, considering only the first `levels` axes that split d (all of them by default).
template <class Sizes, class Coords>
constexpr block_range dim_range(const layout_value& v, char d, std::size_t extent,
                                const Sizes& sizes, const Coords& coords,
                                std::size_t levels = max_axes) {
  block_range r{0, extent};
  const std::size_t n = std::min(levels, v.split_count(d));
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t a = v.split_axis(d, k);
    const block_range sub = balanced_block(r.size, static_cast<std::size_t>(sizes[a]),
                                           static_cast<std::size_t>(coords[a]));
    r.offset += sub.offset;
    r.size = sub.size;
  }
  return r;
}

}  // namespace zest
