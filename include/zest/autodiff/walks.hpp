// zest/autodiff/walks.hpp — layouts where operands meet, and walks of local shards.
//
//   rows_around(x.local_extents(), X::dim_index('v'))  // [outer][n][inner] around dim v
//   splits_of(X::layout, "m")                          // a bias "m" split as x splits m
//
// The walks become the plain descriptors (shard_rows, broadcast_map, causal_window,
// global_index) that the function objects of zest/autodiff/kernels.hpp take.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "zest/autodiff/diagnostics.hpp"
#include "zest/autodiff/kernels.hpp"
#include "zest/core/error.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff::detail {

// ---------------------------------------------------------------------------------------
// Layouts.

// The layout of a tensor with dims `small` (all of them dims of the big tensor) that splits
// its dims as `big` does, replicated on the other axes: where a small operand meets a big one.
constexpr layout_value splits_of(layout_value big, std::string_view small) {
  layout_value v = replicated_layout(big.axis_count);
  for (std::size_t a = 0; a < big.axis_count; ++a) {
    if (big.is_split(a) && has_dim(small, big.axes[a].dim)) v.axes[a] = big.axes[a];
  }
  return v;
}

// The layout of a sum over the dims of `big` not in `kept`: pending on the axes that split
// them, otherwise as before.
constexpr layout_value summed_layout(layout_value big, std::string_view kept) {
  layout_value v = big;
  for (std::size_t a = 0; a < big.axis_count; ++a) {
    if (big.is_split(a) && !has_dim(kept, big.axes[a].dim)) {
      v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
    }
  }
  return v;
}

// A scalar that sums a tensor of layout v: pending on every axis that is not replicated.
constexpr layout_value scalar_sum_layout(layout_value v) {
  layout_value s = replicated_layout(v.axis_count);
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (!v.is_replicate(a)) s.axes[a] = axis_placement{placement_kind::partial, 0, 0};
  }
  return s;
}

// `v` replicated on the axes that `taken` splits; a split that loses an axis of its nesting
// loses the axes nested inside it too (they split blocks that no longer exist).
constexpr layout_value release_axes(layout_value v, layout_value taken) {
  layout_value out = v;
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (taken.is_split(a)) out.axes[a] = axis_placement{};
  }
  for (std::size_t k = 1; k < max_axes; ++k) {
    for (std::size_t a = 0; a < out.axis_count; ++a) {
      if (out.is_split(a) && out.axes[a].order == k &&
          out.split_axis(out.axes[a].dim, k - 1) == max_axes) {
        out.axes[a] = axis_placement{};
      }
    }
  }
  return out;
}

// An embedding's output: the ids' splits on their dims, the table's on the feature dim, and
// pending where the table's rows are split (each rank adds the rows it holds).
constexpr layout_value embedding_layout(layout_value ids, layout_value table, char rows,
                                        char feature) {
  layout_value v = replicated_layout(ids.axis_count);
  for (std::size_t a = 0; a < ids.axis_count; ++a) {
    if (ids.is_split(a)) {
      v.axes[a] = ids.axes[a];
    } else if (table.splits(a, feature)) {
      v.axes[a] = table.axes[a];
    } else if (table.splits(a, rows)) {
      v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
    }
  }
  return v;
}

template <class Mesh>
inline constexpr layout_value whole_layout = replicated_layout(Mesh::axis_count);

// ---------------------------------------------------------------------------------------
// Walking local shards (the rows around one dim: shard_rows, zest/layout/shard.hpp).

// A big shard walked against a small one whose dims are some of the big one's, split alike
// (so their local extents agree): the big shard's dims are merged into groups that are all
// in the small one or all not, and walked as runs along the last group.
struct broadcast_walk {
  std::size_t groups = 0;
  std::array<std::size_t, max_dims> extent{}, stride{};  // stride in the small shard, 0: absent
  std::size_t rows = 0, run = 1;
  bool run_in_small = true;
};
template <std::size_t Rank>
broadcast_walk walk_of(std::string_view big, std::string_view small,
                       const std::array<std::size_t, Rank>& local) {
  broadcast_walk w;
  std::array<bool, max_dims> in_small{};
  for (std::size_t i = 0; i < Rank; ++i) {
    if (local[i] == 1) continue;  // no effect on any offset
    const bool in = has_dim(small, big[i]);
    if (w.groups > 0 && in_small[w.groups - 1] == in) {
      w.extent[w.groups - 1] *= local[i];
    } else {
      in_small[w.groups] = in;
      w.extent[w.groups++] = local[i];
    }
  }
  if (w.groups == 0) {
    in_small[0] = true;
    w.extent[w.groups++] = 1;
  }
  std::size_t s = 1;
  for (std::size_t g = w.groups; g-- > 0;) {
    w.stride[g] = in_small[g] ? s : 0;
    if (in_small[g]) s *= w.extent[g];
  }
  w.run = w.extent[w.groups - 1];
  w.run_in_small = in_small[w.groups - 1];
  w.rows = 1;
  for (std::size_t g = 0; g + 1 < w.groups; ++g) w.rows *= w.extent[g];
  return w;
}

// "b=1, t=5": the global position of element `flat` of a local shard, for error messages.
template <std::size_t Rank>
std::string position_of(std::string_view dims, const std::array<std::size_t, Rank>& local,
                        const std::array<std::size_t, Rank>& offset, std::size_t flat) {
  std::array<std::size_t, Rank> index{};
  for (std::size_t k = Rank; k-- > 0;) {
    index[k] = offset[k] + (local[k] == 0 ? 0 : flat % local[k]);
    flat = local[k] == 0 ? 0 : flat / local[k];
  }
  std::string out;
  for (std::size_t k = 0; k < Rank; ++k) {
    if (k) out += ", ";
    out += dims[k];
    out += '=';
    out += std::to_string(index[k]);
  }
  return out;
}

// Throws unless y's extent on each of its dims equals x's on that dim.
template <fixed_string Op, sharded_tensor X, sharded_tensor Y>
void check_extents(const X& x, const Y& y, std::string_view x_name, std::string_view y_name) {
  for (std::size_t k = 0; k < Y::rank; ++k) {
    const char d = Y::dims[k];
    if (y.extents()[k] != x.extent(d)) {
      throw shape_error(zest::detail::message("zest: ", view_of<Op>, ": dim '", d, "' has extent ",
                                              x.extent(d), " in ", x_name, " (\"", view_of<X::dims>,
                                              "\") but ", y.extents()[k], " in ", y_name, " (\"",
                                              view_of<Y::dims>, "\")"));
    }
  }
}

template <class T>
constexpr T minus_infinity = -std::numeric_limits<T>::infinity();

// The walks above as the plain descriptors that kernels.hpp's function objects take.
// The causal mask's window for rows around dim Along of x (Q, K: the mask's query and key
// dims): which entries of each row it keeps.
template <char Along, char Q, char K, sharded_tensor X>
kernels::causal_window causal_window_of(const X& x) {
  constexpr std::size_t along = X::dim_index(Along);
  constexpr std::size_t other = X::dim_index(Along == K ? Q : K);
  kernels::causal_window w;
  w.masked = true;
  w.along_k = Along == K;
  w.other = coordinate_in_rows(x.local_extents(), along, other);
  w.other_offset = x.local_offsets()[other];
  w.own_offset = x.local_offsets()[along];
  w.n = x.local_extents()[along];
  return w;
}
inline kernels::broadcast_map broadcast_map_of(const broadcast_walk& w) {
  kernels::broadcast_map m;
  m.groups = w.groups;
  std::size_t big = 1;
  for (std::size_t g = w.groups; g-- > 0;) {
    m.extent[g] = w.extent[g];
    m.small_stride[g] = w.stride[g];
    m.big_stride[g] = big;
    big *= w.extent[g];
    if (w.stride[g] == 0) m.absent_count *= w.extent[g];
  }
  return m;
}
template <std::size_t Rank>
kernels::global_index global_index_of(const std::array<std::size_t, Rank>& global,
                                      const std::array<std::size_t, Rank>& local,
                                      const std::array<std::size_t, Rank>& offset) {
  kernels::global_index g;
  g.rank = Rank;
  std::size_t stride = 1;
  for (std::size_t k = Rank; k-- > 0;) {
    g.local[k] = local[k];
    g.offset[k] = offset[k];
    g.stride[k] = stride;
    stride *= global[k];
  }
  return g;
}

}  // namespace zest::autodiff::detail
