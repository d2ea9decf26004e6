// zest/backend/host/permute.hpp — permute (transpose) and sum out dims of dense row-major
// tensors on the host, for any rank up to zest::max_dims.
//
//   float x[2 * 3 * 4];                   // dims (a, b, c) with extents (2, 3, 4)
//   float y[4 * 2 * 3];
//   std::size_t ext[] = {2, 3, 4}, perm[] = {2, 0, 1};
//   zest::host::permute(x, ext, perm, y);  // y has dims (c, a, b): y[c][a][b] = x[a][b][c]
//
//   float s[2 * 4];
//   std::size_t summed[] = {1};
//   zest::host::sum_dims(x, ext, summed, s);  // s[a][c] = sum over b of x[a][b][c]
//
// Both are thin front ends over the strided kernels in namespace detail, which contract.hpp
// drives directly with the strides of its operands.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>

#include "zest/backend/contraction_plan.hpp"
#include "zest/config.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"

namespace zest::host {

namespace detail {

using contraction::dense_strides;
using contraction::element_count;

// Converts one element, going through the compute type so that bfloat16 <-> float works.
template <class To, class From>
constexpr To convert(From x) {
  return static_cast<To>(static_cast<compute_type_t<From>>(x));
}

// A walk over up to max_dims dims, outermost first: extents plus element strides into a
// source and a destination. A destination stride of 0 sums that dim (reductions).
struct strided_walk {
  std::size_t rank = 0;
  std::array<std::size_t, max_dims> extent{};
  std::array<std::size_t, max_dims> src{};
  std::array<std::size_t, max_dims> dst{};

  // Extent-1 dims never move an offset, so they are dropped here once for every caller.
  void push(std::size_t e, std::size_t src_stride, std::size_t dst_stride) {
    if (e == 1) return;
    extent[rank] = e;
    src[rank] = src_stride;
    dst[rank] = dst_stride;
    ++rank;
  }

  // Fuses neighbours that are contiguous in both tensors: (4,5):(5,1) -> (20):(1).
  // Fewer, longer dims mean fewer odometer steps and longer inner loops.
  void fuse() {
    if (rank < 2) return;
    std::size_t out = 0;
    for (std::size_t d = 1; d < rank; ++d) {
      if (src[out] == src[d] * extent[d] && dst[out] == dst[d] * extent[d]) {
        extent[out] *= extent[d];
        src[out] = src[d];
        dst[out] = dst[d];
      } else {
        ++out;
        extent[out] = extent[d];
        src[out] = src[d];
        dst[out] = dst[d];
      }
    }
    rank = out + 1;
  }

  void erase(std::size_t d) {
    for (std::size_t i = d + 1; i < rank; ++i) {
      extent[i - 1] = extent[i];
      src[i - 1] = src[i];
      dst[i - 1] = dst[i];
    }
    --rank;
  }
};

// Calls f(src_offset, dst_offset) for every index of the first `rank` dims of w.
template <class F>
void for_each_offset(const strided_walk& w, std::size_t rank, F&& f) {
  std::array<std::size_t, max_dims> index{};
  std::size_t s = 0;
  std::size_t d = 0;
  for (;;) {
    f(s, d);
    std::size_t dim = rank;
    for (;;) {
      if (dim == 0) return;
      --dim;
      s += w.src[dim];
      d += w.dst[dim];
      if (++index[dim] < w.extent[dim]) break;
      s -= w.src[dim] * w.extent[dim];
      d -= w.dst[dim] * w.extent[dim];
      index[dim] = 0;
    }
  }
}

template <bool Add, class S, class D>
inline void store(D& out, S value) {
  if constexpr (Add) {
    out = convert<D>(convert<compute_type_t<D>>(out) + convert<compute_type_t<D>>(value));
  } else {
    out = convert<D>(value);
  }
}

// Side of the square tile of the blocked transpose. A tile is gathered into a local buffer
// reading whole source lines, then written out as whole destination lines, so neither side
// depends on many lines (often in one cache set, for power-of-two strides) staying cached.
// 16 KiB of tile fits L1 with room for the lines in flight.
template <class S>
inline constexpr std::size_t transpose_tile = sizeof(S) <= 4 ? 64 : 32;

// dst = src (or dst += src with Add) over a walk whose destination strides are all
// non-zero (a permutation, possibly converting the element type). Dims should be listed
// in destination order so that writes are sequential.
template <bool Add, class S, class D>
void copy_strided(strided_walk w, const S* src, D* dst) {
  w.fuse();
  if (w.rank == 0) {
    store<Add>(*dst, *src);
    return;
  }
  const std::size_t last = w.rank - 1;
  // The dim the source reads fastest along; when it is not the destination's inner dim the
  // copy is a transpose between the two, done in tiles.
  std::size_t fast = last;
  for (std::size_t d = 0; d < w.rank; ++d) {
    if (w.src[d] < w.src[fast]) fast = d;
  }
  if (fast == last || w.dst[last] != 1 || w.src[fast] != 1) {
    const std::size_t n = w.extent[last], ss = w.src[last], ds = w.dst[last];
    for_each_offset(w, last, [&](std::size_t so, std::size_t dof) {
      const S* s = src + so;
      D* d = dst + dof;
      if (ss == 1 && ds == 1 && !Add && std::is_same_v<S, D>) {
        std::memcpy(static_cast<void*>(d), static_cast<const void*>(s), n * sizeof(D));
      } else {
        for (std::size_t i = 0; i < n; ++i) store<Add>(d[i * ds], s[i * ss]);
      }
    });
    return;
  }
  // Tile over (fast, last): rows = fast (unit stride in src), cols = last (unit in dst).
  const std::size_t rows = w.extent[fast], cols = w.extent[last];
  const std::size_t src_col = w.src[last], dst_row = w.dst[fast];
  strided_walk outer = w;
  outer.erase(last);
  outer.erase(fast);
  constexpr std::size_t side = transpose_tile<S>;
  S tile[side][side];
  for_each_offset(outer, outer.rank, [&](std::size_t so, std::size_t dof) {
    const S* s = src + so;
    D* d = dst + dof;
    for (std::size_t r0 = 0; r0 < rows; r0 += side) {
      const std::size_t nr = std::min(rows - r0, side);
      for (std::size_t c0 = 0; c0 < cols; c0 += side) {
        const std::size_t nc = std::min(cols - c0, side);
        if (nr == side && nc == side) {  // constant trip counts: unrolled, vectorized
          for (std::size_t c = 0; c < side; ++c) {
            const S* line = s + r0 + (c0 + c) * src_col;
            for (std::size_t r = 0; r < side; ++r) tile[r][c] = line[r];
          }
          for (std::size_t r = 0; r < side; ++r) {
            D* line = d + (r0 + r) * dst_row + c0;
            for (std::size_t c = 0; c < side; ++c) store<Add>(line[c], tile[r][c]);
          }
          continue;
        }
        for (std::size_t c = 0; c < nc; ++c) {
          const S* line = s + r0 + (c0 + c) * src_col;
          for (std::size_t r = 0; r < nr; ++r) tile[r][c] = line[r];
        }
        for (std::size_t r = 0; r < nr; ++r) {
          D* line = d + (r0 + r) * dst_row + c0;
          for (std::size_t c = 0; c < nc; ++c) store<Add>(line[c], tile[r][c]);
        }
      }
    }
  });
}

// dst += sum of src over the dims whose destination stride is 0. Dims should be listed in
// source order (src read sequentially); dst must already hold zeros or the values to add to.
template <class S, class D>
void reduce_strided(strided_walk w, const S* src, D* dst) {
  using acc_t = compute_type_t<D>;
  w.fuse();
  if (w.rank == 0) {
    store<true>(*dst, *src);
    return;
  }
  const std::size_t last = w.rank - 1;
  const std::size_t n = w.extent[last], ss = w.src[last], ds = w.dst[last];
  for_each_offset(w, last, [&](std::size_t so, std::size_t dof) {
    const S* s = src + so;
    D* d = dst + dof;
    if (ds == 0) {
      // Four partial sums: shorter dependency chains and a smaller rounding error.
      acc_t acc[4] = {0, 0, 0, 0};
      std::size_t i = 0;
      for (; i + 4 <= n; i += 4) {
        for (std::size_t j = 0; j < 4; ++j) acc[j] += convert<acc_t>(s[(i + j) * ss]);
      }
      for (; i < n; ++i) acc[0] += convert<acc_t>(s[i * ss]);
      store<true>(*d, (acc[0] + acc[1]) + (acc[2] + acc[3]));
    } else {
      for (std::size_t i = 0; i < n; ++i) store<true>(d[i * ds], s[i * ss]);
    }
  });
}

inline void check_rank(std::string_view what, std::size_t rank) {
  if (rank > max_dims) {
    throw shape_error(zest::detail::message("zest: ", what, ": rank ", rank,
                                            " exceeds zest::max_dims = ", max_dims));
  }
}

}  // namespace detail

// dst = src permuted: dst dim i is src dim perm[i] (numpy.transpose(src, perm)).
// With accumulate, dst += the permuted src. S and D may differ (e.g. bfloat16 -> float).
template <class S, class D>
void permute(const S* src, std::span<const std::size_t> src_extents,
             std::span<const std::size_t> perm, D* dst, bool accumulate = false) {
  const std::size_t rank = src_extents.size();
  detail::check_rank("permute", rank);
  std::array<bool, max_dims> seen{};
  if (perm.size() != rank) {
    throw shape_error(zest::detail::message("zest: permute: permutation has ", perm.size(),
                                            " entries for a rank-", rank, " tensor"));
  }
  for (auto p : perm) {
    if (p >= rank || seen[p]) {
      throw shape_error(
          zest::detail::message("zest: permute: entry ", p, " is out of range or repeated"));
    }
    seen[p] = true;
  }
  if (detail::element_count(src_extents) == 0) return;
  const auto src_strides = detail::dense_strides(src_extents);
  std::array<std::size_t, max_dims> dst_extents{};
  for (std::size_t i = 0; i < rank; ++i) dst_extents[i] = src_extents[perm[i]];
  const auto dst_strides = detail::dense_strides(std::span(dst_extents.data(), rank));
  detail::strided_walk w;
  for (std::size_t i = 0; i < rank; ++i)
    w.push(dst_extents[i], src_strides[perm[i]], dst_strides[i]);
  if (accumulate) {
    detail::copy_strided<true>(w, src, dst);
  } else {
    detail::copy_strided<false>(w, src, dst);
  }
}

// dst = src summed over the dims listed in `summed`; dst keeps the other dims in their
// order. With accumulate, dst += that sum. Summing over an extent-0 dim gives zeros.
template <class S, class D>
void sum_dims(const S* src, std::span<const std::size_t> src_extents,
              std::span<const std::size_t> summed, D* dst, bool accumulate = false) {
  const std::size_t rank = src_extents.size();
  detail::check_rank("sum_dims", rank);
  std::array<bool, max_dims> is_summed{};
  for (auto d : summed) {
    if (d >= rank) {
      throw shape_error(zest::detail::message("zest: sum_dims: dim ", d,
                                              " is out of range for a rank-", rank, " tensor"));
    }
    is_summed[d] = true;
  }
  std::size_t dst_count = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    if (!is_summed[d]) dst_count *= src_extents[d];
  }
  if (!accumulate) std::fill(dst, dst + dst_count, D(0.0F));
  if (dst_count == 0 || detail::element_count(src_extents) == 0) return;
  const auto src_strides = detail::dense_strides(src_extents);
  detail::strided_walk w;
  std::size_t stride = dst_count;
  std::array<std::size_t, max_dims> dst_strides{};
  for (std::size_t d = 0; d < rank; ++d) {
    if (is_summed[d]) continue;
    stride /= src_extents[d];
    dst_strides[d] = stride;
  }
  for (std::size_t d = 0; d < rank; ++d) w.push(src_extents[d], src_strides[d], dst_strides[d]);
  detail::reduce_strided(w, src, dst);
}

}  // namespace zest::host
