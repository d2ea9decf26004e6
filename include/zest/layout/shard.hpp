// zest/layout/shard.hpp — which block of the global tensor a rank holds.
//
// Splits are balanced: extent N over p parts gives the first N % p parts one extra element.
//   50257 over 4 -> [0,12565) [12565,25129) [25129,37693) [37693,50257)
// A dim split over several axes is split over the first, then each block over the next.
//
// A rank's block, its shard, is stored row-major; shard_rows is the one view of it around
// one dim, [outer][n][inner], that the mover's slices (zest/tensor/transition_group.hpp), the
// autodiff ops' walks and the kernels' rows (zest/autodiff/kernels.hpp) all use.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string_view>

#include "zest/config.hpp"
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
constexpr block_range dim_range(layout_value v, char d, std::size_t extent, const Sizes& sizes,
                                const Coords& coords, std::size_t levels = max_axes) {
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

// This rank's block of a tensor with dims `dims` (global `extents`) under layout v: the
// offset and local extent of each dim. One function for every tensor type (basic_tensor's
// constructors call it), not one per dims and layout.
inline void locate_block(layout_value v, std::string_view dims, const std::size_t* extents,
                         std::span<const int> sizes, std::span<const int> coords,
                         std::size_t* offsets, std::size_t* local) {
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const block_range r = dim_range(v, dims[i], extents[i], sizes, coords);
    offsets[i] = r.offset;
    local[i] = r.size;
  }
}

// A shard seen as [outer][n][inner] around one dim: outer * inner rows of n elements. Row
// r = o * inner + k starts at element o * n * inner + k, and its elements lie `inner` apart.
struct shard_rows {
  std::size_t outer = 1, n = 1, inner = 1;
  ZEST_HOST_DEVICE constexpr std::size_t count() const { return outer * inner; }
  ZEST_HOST_DEVICE constexpr std::size_t first(std::size_t row) const {
    return (row / inner) * n * inner + row % inner;
  }
  // The row of element i, and i's position j < n in it.
  ZEST_HOST_DEVICE constexpr std::size_t row_of(std::size_t i) const {
    return (i / (n * inner)) * inner + i % inner;
  }
  ZEST_HOST_DEVICE constexpr std::size_t position_of(std::size_t i) const {
    return (i / inner) % n;
  }
};
// The rows around dim `dim` of a shard with local extents `local` (its first `rank` dims).
template <std::size_t N>
constexpr shard_rows rows_around(const std::array<std::size_t, N>& local, std::size_t dim,
                                 std::size_t rank = N) {
  shard_rows r;
  for (std::size_t i = 0; i < dim; ++i) r.outer *= local[i];
  r.n = local[dim];
  for (std::size_t i = dim + 1; i < rank; ++i) r.inner *= local[i];
  return r;
}

// The local index of another dim in row r of the rows around a dim:
// ((in_outer ? r / inner : r % inner) / div) % extent.
struct row_coordinate {
  bool in_outer = true;
  std::size_t inner = 1, div = 1, extent = 1;
  ZEST_HOST_DEVICE constexpr std::size_t at(std::size_t row) const {
    return ((in_outer ? row / inner : row % inner) / div) % extent;
  }
};
// Dim `dim`'s coordinate in the rows around dim `along` of a shard with local extents `local`.
template <std::size_t N>
constexpr row_coordinate coordinate_in_rows(const std::array<std::size_t, N>& local,
                                            std::size_t along, std::size_t dim) {
  row_coordinate c;
  c.in_outer = dim < along;
  c.inner = std::max<std::size_t>(1, rows_around(local, along).inner);
  c.extent = std::max<std::size_t>(1, local[dim]);
  const std::size_t end = dim < along ? along : N;
  for (std::size_t i = dim + 1; i < end; ++i) c.div *= local[i];
  c.div = std::max<std::size_t>(1, c.div);
  return c;
}

}  // namespace zest
