// zest/autodiff/ops.hpp — nonlinear and broadcasting operations of the tape.
//
//   auto h = autodiff::broadcast_add(x, bias);              // "btm" + "m"
//   auto a = autodiff::gelu(h);
//   auto p = autodiff::causal_softmax<'q', 'k'>(scores);    // "bhqk": mask and softmax, one pass
//   auto n = autodiff::layer_norm<'m'>(x, gamma, beta);
//   auto e = autodiff::embedding<"btm">(ids, wte);          // ids "bt" int32_t, wte "vm"
//   auto loss = autodiff::cross_entropy<'v'>(logits, targets);
//
// Like tape.hpp's operations, each computes its value on the local shard and records one
// backward step; a gradient reaches its input in the dual of the input's layout.
//
// Layouts. A nonlinear operation needs whole values (f(a + b) is not f(a) + f(b)), so its
// operands may not be partial; the result keeps the operand's layout. An operation along a
// dim (softmax, layer_norm, cross_entropy) needs that dim whole on every rank. A small
// operand that meets a large one (a bias, layer_norm's gain, an embedding table) is used in
// the layout that splits its dims as the large one does; its gradient, a local sum over the
// dims it lacks, is then pending on the axes that split those dims:
//
//   x "btm" split(b:dp) + bias "m" replicated   ->  bias gradient partial(dp), no collective
//   reduce_sum<"m">(x "btm" split(b:dp))        ->  "m" partial(dp)
//   cross_entropy<'v'>(logits "btv" split(b:dp)) ->  scalar partial(dp)
//
// Kernels see a local shard as [outer][n][inner] around the dim they work along (row-major),
// so a row is n elements `inner` apart. Contiguous rows (inner == 1, the usual case) run as
// Eigen array expressions, vectorised exp and tanh included, with no allocation; they use
// the vector width the compiler is allowed (-mavx2 -mfma or -march=native make exp and tanh
// about four times faster than plain x86-64). That is the host backend; every other backend
// (a GPU's, the emulated one that tests it) runs the same operations as the function objects
// of zest/autodiff/kernels.hpp, one call per element, row or column ("Other backends" below).
//
// Run-time checks (extents, ids, targets, p) throw zest::shape_error. Ids and targets are
// checked on the local shard (copied to the host off the host backend), so with split ids
// only the ranks that hold a bad one throw.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/kernels.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/random.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

// ---------------------------------------------------------------------------------------
// Diagnostics: each is instantiated with the operation's name and the offending types or
// dims, which the compiler prints on the line above the message.

namespace autodiff_error {
template <fixed_string Operation, class Tensor>
struct not_floating {
  static_assert(always_false<Tensor>,
                "zest autodiff: this operation needs float or double elements (operation and "
                "tensor shown above). Fix: convert the tensor to float or double.");
};
template <fixed_string Operation, char Dim, class Tensor>
struct missing_dim {
  static_assert(always_false<Tensor>,
                "zest autodiff: the operation names a dim that the tensor does not have "
                "(operation, dim and tensor shown above). Fix: name one of the tensor's dims.");
};
template <fixed_string Operation, char Dim, class Tensor>
struct split_dim {
  static_assert(always_false<Tensor>,
                "zest autodiff: the operation works along a dim that is split over a mesh axis "
                "(operation, dim and tensor shown above): no rank holds a whole row. Fix: "
                "redistribute<layout<...>>(x) to a layout that keeps that dim whole (split "
                "other dims instead).");
};
template <fixed_string Operation, class X, class Y>
struct operand_mismatch {
  static_assert(always_false<X>,
                "zest autodiff: the operands need the same element type and mesh (operation and "
                "both tensors shown above). Fix: convert one of them.");
};
template <fixed_string Operation, class X, class Y>
struct not_a_subsequence {
  static_assert(always_false<X>,
                "zest autodiff: the second operand's dims must be some of the first operand's "
                "dims, in the same order (operation and both tensors shown above). Fix: "
                "einsum<\"...\">(y) to reorder y's dims, or pass the larger tensor first.");
};
template <char Q, char K, char D, class X>
struct causal_dims {
  static_assert(always_false<X>,
                "zest autodiff: causal_mask<Q, K> and causal_softmax<Q, K, D> need two distinct "
                "dims Q and K, and D must be one of them (dims and tensor shown above). Fix: "
                "causal_softmax<'q', 'k'>(scores) normalises along K.");
};
template <char D, class Parameter>
struct norm_parameter {
  static_assert(always_false<Parameter>,
                "zest autodiff: layer_norm<D>'s gamma and beta are 1-D tensors whose one dim is "
                "D (dim and parameter shown above). Fix: make them tensors with dims \"D\", "
                "e.g. \"m\" for layer_norm<'m'>.");
};
template <fixed_string Operation, class Tensor>
struct not_int32 {
  static_assert(always_false<Tensor>,
                "zest autodiff: token ids and targets are int32_t tensors (operation and tensor "
                "shown above). Fix: store them as std::int32_t.");
};
template <class Table>
struct table_shape {
  static_assert(always_false<Table>,
                "zest autodiff: embedding's table has two dims, rows then features, e.g. \"vm\" "
                "(table shown above). Fix: einsum<\"...\"> it to two dims.");
};
template <class Table>
struct table_rows_split {
  static_assert(always_false<Table>,
                "zest autodiff: embedding's table has its row dim split (table shown above); a "
                "rank could not look up every id. Fix: split the feature dim instead, or "
                "redistribute<layout<...>>(table) so that the rows are whole.");
};
template <fixed_string OutDims, class Ids, class Table>
struct embedding_dims {
  static_assert(always_false<Ids>,
                "zest autodiff: embedding<OutDims>: OutDims must be the ids' dims followed by "
                "the table's feature dim (all shown above), e.g. embedding<\"btm\">(ids \"bt\", "
                "table \"vm\"). Fix: spell OutDims that way.");
};
template <char V, class Logits, class Targets>
struct target_dims {
  static_assert(always_false<Targets>,
                "zest autodiff: cross_entropy<V>'s targets have the logits' dims without V, in "
                "the same order (V, logits and targets shown above). Fix: give the targets "
                "those dims, e.g. \"bt\" for logits \"btv\".");
};
template <fixed_string OutDims, class X>
struct reduce_dims {
  static_assert(always_false<X>,
                "zest autodiff: reduce_sum<OutDims>: OutDims must be some of x's dims, in x's "
                "order (both shown above). Fix: reduce with those dims, then einsum<\"...\"> to "
                "reorder.");
};
}  // namespace autodiff_error

namespace detail {

// ---------------------------------------------------------------------------------------
// Compile-time checks, one diagnostic each.

template <fixed_string Op, class X>
constexpr bool check_real_operand() {
  if constexpr (!is_real<typename X::value_type>) {
    (void)autodiff_error::not_floating<Op, X>{};
    return false;
  } else {
    return true;
  }
}

// A real operand of a nonlinear operation: not partial.
template <fixed_string Op, class X>
constexpr bool check_operand() {
  if constexpr (!check_real_operand<Op, X>()) {
    return false;
  } else if constexpr (X::layout.any_partial()) {
    (void)autodiff_error::partial_operand<Op, X>{};
    return false;
  } else {
    return true;
  }
}

// Dim D of X, which the operation needs whole.
template <fixed_string Op, char D, class X>
constexpr bool check_whole_dim() {
  if constexpr (!X::dims.contains(D)) {
    (void)autodiff_error::missing_dim<Op, D, X>{};
    return false;
  } else if constexpr (X::layout.split_count(D) != 0) {
    (void)autodiff_error::split_dim<Op, D, X>{};
    return false;
  } else {
    return true;
  }
}

template <fixed_string Op, class X, class Y>
constexpr bool check_same_kind() {
  if constexpr (!std::is_same_v<typename X::value_type, typename Y::value_type> ||
                !std::is_same_v<typename X::mesh_type, typename Y::mesh_type>) {
    (void)autodiff_error::operand_mismatch<Op, X, Y>{};
    return false;
  } else {
    return true;
  }
}

constexpr bool has_dim(std::string_view dims, char d) {
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == d) return true;
  }
  return false;
}

// Whether `small` lists some of `big`'s dims in big's order.
constexpr bool is_subsequence(std::string_view small, std::string_view big) {
  std::size_t j = 0;
  for (std::size_t i = 0; i < big.size() && j < small.size(); ++i) {
    if (big[i] == small[j]) ++j;
  }
  return j == small.size();
}

// ---------------------------------------------------------------------------------------
// Layouts.

// The layout of a tensor with dims `small` (all of them dims of the big tensor) that splits
// its dims as `big` does, replicated on the other axes: where a small operand meets a big one.
constexpr layout_value splits_of(const layout_value& big, std::string_view small) {
  layout_value v = replicated_layout(big.axis_count);
  for (std::size_t a = 0; a < big.axis_count; ++a) {
    if (big.is_split(a) && has_dim(small, big.axes[a].dim)) v.axes[a] = big.axes[a];
  }
  return v;
}

// The layout of a sum over the dims of `big` not in `kept`: pending on the axes that split
// them, otherwise as before.
constexpr layout_value summed_layout(const layout_value& big, std::string_view kept) {
  layout_value v = big;
  for (std::size_t a = 0; a < big.axis_count; ++a) {
    if (big.is_split(a) && !has_dim(kept, big.axes[a].dim)) {
      v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
    }
  }
  return v;
}

// A scalar that sums a tensor of layout v: pending on every axis that is not replicated.
constexpr layout_value scalar_sum_layout(const layout_value& v) {
  layout_value s = replicated_layout(v.axis_count);
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (!v.is_replicate(a)) s.axes[a] = axis_placement{placement_kind::partial, 0, 0};
  }
  return s;
}

// `v` replicated on the axes that `taken` splits; a split that loses an axis of its nesting
// loses the axes nested inside it too (they split blocks that no longer exist).
constexpr layout_value release_axes(const layout_value& v, const layout_value& taken) {
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

// An embedding's output: the ids' splits on their dims, the table's on the feature dim.
constexpr layout_value embedding_layout(const layout_value& ids, const layout_value& table,
                                        char feature) {
  layout_value v = replicated_layout(ids.axis_count);
  for (std::size_t a = 0; a < ids.axis_count; ++a) {
    if (ids.is_split(a)) {
      v.axes[a] = ids.axes[a];
    } else if (table.splits(a, feature)) {
      v.axes[a] = table.axes[a];
    }
  }
  return v;
}

template <class Mesh>
inline constexpr layout_value whole_layout = replicated_layout(Mesh::axis_count);

// x as a tensor of layout L: a reference to x itself when it has that layout already.
template <layout_key L, sharded_tensor X>
decltype(auto) at_layout(const X& x) {
  if constexpr (X::layout == L) {
    return (x);
  } else {
    return redistribute_to<L>(x);
  }
}

// ---------------------------------------------------------------------------------------
// Walking local shards.

using unit_stride = std::integral_constant<std::size_t, 1>;

// A local shard as [outer][n][inner] around one dim: outer * inner rows of n elements.
struct rows_along {
  std::size_t outer = 1, n = 1, inner = 1;
  std::size_t count() const { return outer * inner; }
};
template <std::size_t Rank>
rows_along rows_of(const std::array<std::size_t, Rank>& local, std::size_t dim) {
  rows_along r;
  for (std::size_t i = 0; i < dim; ++i) r.outer *= local[i];
  r.n = local[dim];
  for (std::size_t i = dim + 1; i < Rank; ++i) r.inner *= local[i];
  return r;
}

// f(row, first, stride) for each row: row = o * inner + i numbers the rows in the order of
// the shard without the dim; the row's elements are first + j * stride, j < n.
template <class F>
void for_each_row(const rows_along& r, F&& f) {
  if (r.inner == 1) {
    for (std::size_t o = 0; o < r.outer; ++o) f(o, o * r.n, unit_stride{});
  } else {
    for (std::size_t o = 0; o < r.outer; ++o) {
      for (std::size_t i = 0; i < r.inner; ++i) f(o * r.inner + i, o * r.n * r.inner + i, r.inner);
    }
  }
}

// The local index, in row `row` of a walk around dim `along`, of another dim `dim`.
struct row_coordinate {
  bool in_outer = true;
  std::size_t inner = 1, div = 1, extent = 1;
  std::size_t at(std::size_t row) const {
    return ((in_outer ? row / inner : row % inner) / div) % extent;
  }
};
template <std::size_t Rank>
row_coordinate coordinate_of(const std::array<std::size_t, Rank>& local, std::size_t along,
                             std::size_t dim) {
  row_coordinate c;
  c.in_outer = dim < along;
  c.inner = std::max<std::size_t>(1, rows_of(local, along).inner);
  c.extent = std::max<std::size_t>(1, local[dim]);
  const std::size_t end = dim < along ? along : Rank;
  for (std::size_t i = dim + 1; i < end; ++i) c.div *= local[i];
  c.div = std::max<std::size_t>(1, c.div);
  return c;
}

// What a causal mask keeps of a row along K (a prefix: global k <= global q) or along Q
// (a suffix: global q >= global k).
struct causal_rows {
  rows_along rows;
  row_coordinate other;  // the other dim of the pair
  std::size_t other_offset = 0, own_offset = 0;
  bool along_k = true;
  std::pair<std::size_t, std::size_t> kept(std::size_t row) const {
    const auto g = static_cast<long long>(other_offset + other.at(row));
    const auto n = static_cast<long long>(rows.n);
    const auto own = static_cast<long long>(own_offset);
    if (along_k) return {0, static_cast<std::size_t>(std::clamp(g + 1 - own, 0LL, n))};
    return {static_cast<std::size_t>(std::clamp(g - own, 0LL, n)), rows.n};
  }
};
template <char Along, char Q, char K, sharded_tensor X>
causal_rows causal_rows_of(const X& x) {
  constexpr std::size_t along = X::dim_index(Along);
  constexpr std::size_t other = X::dim_index(Along == K ? Q : K);
  causal_rows c;
  c.rows = rows_of(x.local_extents(), along);
  c.other = coordinate_of(x.local_extents(), along, other);
  c.other_offset = x.local_offsets()[other];
  c.own_offset = x.local_offsets()[along];
  c.along_k = Along == K;
  return c;
}

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

// f(big_first, small_first, step) for each run: element j of the run is big_first + j in the
// big shard and small_first + j * step in the small one (step a compile-time 1 or 0).
template <class F>
void for_each_run(const broadcast_walk& w, F&& f) {
  const auto walk = [&](auto step) {
    std::array<std::size_t, max_dims> index{};
    std::size_t small = 0;
    for (std::size_t r = 0; r < w.rows; ++r) {
      f(r * w.run, small, step);
      for (std::size_t g = w.groups - 1; g-- > 0;) {
        small += w.stride[g];
        if (++index[g] < w.extent[g]) break;
        small -= w.stride[g] * w.extent[g];
        index[g] = 0;
      }
    }
  };
  if (w.run_in_small) {
    walk(unit_stride{});
  } else {
    walk(std::integral_constant<std::size_t, 0>{});
  }
}

// f(local_first, global_first, run) for each run of the local shard along its last dim:
// local_first is the run's offset in the shard, global_first the row-major flat index of
// its first element in the global tensor.
template <std::size_t Rank, class F>
void for_each_global_run(const std::array<std::size_t, Rank>& global,
                         const std::array<std::size_t, Rank>& local,
                         const std::array<std::size_t, Rank>& offset, F&& f) {
  if constexpr (Rank == 0) {
    f(std::size_t{0}, std::size_t{0}, std::size_t{1});
  } else {
    std::array<std::size_t, Rank> gstride{};
    std::size_t rows = 1, s = 1;
    for (std::size_t k = Rank; k-- > 0;) {
      gstride[k] = s;
      s *= global[k];
      if (k + 1 < Rank) rows *= local[k];
    }
    const std::size_t run = local[Rank - 1];
    if (run == 0) return;
    std::size_t g = 0;
    for (std::size_t k = 0; k < Rank; ++k) g += offset[k] * gstride[k];
    std::array<std::size_t, Rank> index{};
    for (std::size_t r = 0; r < rows; ++r) {
      f(r * run, g, run);
      for (std::size_t k = Rank - 1; k-- > 0;) {
        g += gstride[k];
        if (++index[k] < local[k]) break;
        g -= gstride[k] * local[k];
        index[k] = 0;
      }
    }
  }
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
inline kernels::row_walk row_walk_of(const rows_along& r) { return {r.n, r.inner}; }
inline kernels::causal_window causal_window_of(const causal_rows& c) {
  kernels::causal_window w;
  w.masked = true;
  w.along_k = c.along_k;
  w.in_outer = c.other.in_outer;
  w.inner = c.other.inner;
  w.div = c.other.div;
  w.extent = c.other.extent;
  w.other_offset = c.other_offset;
  w.own_offset = c.own_offset;
  w.n = c.rows.n;
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

// ---------------------------------------------------------------------------------------
// Kernels. A row is n elements `s` apart; [lo, hi) are the entries that take part (the rest
// are masked). Contiguous rows run as Eigen array expressions, which are vectorised (exp,
// tanh included) whatever the optimisation flags; strided rows run as plain loops. The
// kernels depend only on the element type and the stride type, so every tensor type shares
// them.

template <class T>
using array_map = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using const_array_map = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
array_map<T> as_array(T* p, std::size_t n) {
  return array_map<T>(p, static_cast<Eigen::Index>(n));
}
template <class T>
const_array_map<T> as_array(const T* p, std::size_t n) {
  return const_array_map<T>(p, static_cast<Eigen::Index>(n));
}
template <class S>
inline constexpr bool contiguous = std::is_same_v<S, unit_stride>;

template <class T, class S>
void fill_row(T* y, S s, std::size_t from, std::size_t to, T value) {
  for (std::size_t j = from; j < to; ++j) y[j * s] = value;
}

// y = exp(x - m) over n > 0 contiguous entries, exactly 0 where x is -infinity (Eigen's
// vectorised exp returns a tiny denormal there, which would slow the steps that follow;
// rows without -infinity skip the fix-up).
template <class T>
void exp_shifted(const T* x, T* y, std::size_t n, T m) {
  const auto xs = as_array(x, n);
  as_array(y, n) = (xs - m).exp();
  if (xs.minCoeff() == minus_infinity<T>) {
    for (std::size_t j = 0; j < n; ++j) y[j] = x[j] == minus_infinity<T> ? T(0) : y[j];
  }
}

template <class T, class S>
void softmax_row(const T* x, T* y, std::size_t n, S s, std::size_t lo, std::size_t hi) {
  fill_row(y, s, 0, lo, T(0));
  fill_row(y, s, hi, n, T(0));
  if (lo >= hi) return;
  if constexpr (contiguous<S>) {
    auto ys = as_array(y + lo, hi - lo);
    exp_shifted(x + lo, y + lo, hi - lo, as_array(x + lo, hi - lo).maxCoeff());
    ys *= T(1) / ys.sum();
  } else {
    T m = minus_infinity<T>;
    for (std::size_t j = lo; j < hi; ++j) m = std::max(m, x[j * s]);
    T sum = 0;
    for (std::size_t j = lo; j < hi; ++j) {
      const T e = std::exp(x[j * s] - m);
      y[j * s] = e;
      sum += e;
    }
    const T r = T(1) / sum;
    for (std::size_t j = lo; j < hi; ++j) y[j * s] *= r;
  }
}

// The log of the sum of exp over [lo, hi), stably (the max subtracted first).
template <class T, class S>
T log_sum_exp(const T* x, S s, std::size_t lo, std::size_t hi) {
  if constexpr (contiguous<S>) {
    const auto xs = as_array(x + lo, hi - lo);
    const T m = xs.maxCoeff();
    return m + std::log((xs - m).exp().sum());  // -infinity adds a negligible tiny term
  } else {
    T m = minus_infinity<T>;
    for (std::size_t j = lo; j < hi; ++j) m = std::max(m, x[j * s]);
    T sum = 0;
    for (std::size_t j = lo; j < hi; ++j) sum += std::exp(x[j * s] - m);
    return m + std::log(sum);
  }
}

template <class T, class S>
void log_softmax_row(const T* x, T* y, std::size_t n, S s, std::size_t lo, std::size_t hi) {
  fill_row(y, s, 0, lo, minus_infinity<T>);
  fill_row(y, s, hi, n, minus_infinity<T>);
  if (lo >= hi) return;
  const T lse = log_sum_exp(x, s, lo, hi);
  if constexpr (contiguous<S>) {
    as_array(y + lo, hi - lo) = as_array(x + lo, hi - lo) - lse;
  } else {
    for (std::size_t j = lo; j < hi; ++j) y[j * s] = x[j * s] - lse;
  }
}

// dx = y * (dz - sum(dz * y)); masked entries have y = 0, so dx = 0 there.
template <class T, class S>
void softmax_backward_row(const T* y, const T* dz, T* dx, std::size_t n, S s) {
  if constexpr (contiguous<S>) {
    const auto ys = as_array(y, n);
    const auto dzs = as_array(dz, n);
    const T dot = (dzs * ys).sum();
    as_array(dx, n) = ys * (dzs - dot);
  } else {
    T dot = 0;
    for (std::size_t j = 0; j < n; ++j) dot += dz[j * s] * y[j * s];
    for (std::size_t j = 0; j < n; ++j) dx[j * s] = y[j * s] * (dz[j * s] - dot);
  }
}

// dx = dz - softmax * sum(dz), softmax = exp(y) (0 where masked).
template <class T, class S>
void log_softmax_backward_row(const T* y, const T* dz, T* dx, std::size_t n, S s) {
  if constexpr (contiguous<S>) {
    if (n == 0) return;
    const auto dzs = as_array(dz, n);
    const T total = dzs.sum();
    exp_shifted(y, dx, n, T(0));
    as_array(dx, n) = dzs - as_array(dx, n) * total;
  } else {
    T total = 0;
    for (std::size_t j = 0; j < n; ++j) total += dz[j * s];
    for (std::size_t j = 0; j < n; ++j) dx[j * s] = dz[j * s] - std::exp(y[j * s]) * total;
  }
}

// dx = (exp(x - lse) - onehot(target)) * scale.
template <class T, class S>
void cross_entropy_backward_row(const T* x, T* dx, std::size_t n, S s, T lse, std::size_t target,
                                T scale) {
  if constexpr (contiguous<S>) {
    as_array(dx, n) = (as_array(x, n) - lse).exp() * scale;
  } else {
    for (std::size_t j = 0; j < n; ++j) dx[j * s] = std::exp(x[j * s] - lse) * scale;
  }
  dx[target * s] -= scale;
}

// y = (x - mean) * rstd * gamma + beta; returns {mean, rstd}.
template <class T, class S>
std::pair<T, T> layer_norm_row(const T* x, T* y, std::size_t n, S s, const T* gamma, const T* beta,
                               T eps) {
  const T inv_n = T(1) / static_cast<T>(std::max<std::size_t>(n, 1));
  if constexpr (contiguous<S>) {
    const auto xs = as_array(x, n);
    const T mu = xs.sum() * inv_n;
    const T r = T(1) / std::sqrt((xs - mu).square().sum() * inv_n + eps);
    as_array(y, n) = (xs - mu) * r * as_array(gamma, n) + as_array(beta, n);
    return {mu, r};
  } else {
    T sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += x[j * s];
    const T mu = sum * inv_n;
    T var = 0;
    for (std::size_t j = 0; j < n; ++j) var += (x[j * s] - mu) * (x[j * s] - mu);
    const T r = T(1) / std::sqrt(var * inv_n + eps);
    for (std::size_t j = 0; j < n; ++j) y[j * s] = (x[j * s] - mu) * r * gamma[j] + beta[j];
    return {mu, r};
  }
}

// With xhat = (x - mean) * rstd and dxhat = dz * gamma: dgamma += dz * xhat, dbeta += dz
// (when dgamma is set), dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) (when
// dx is set).
template <class T, class S>
void layer_norm_backward_row(const T* x, const T* dz, T* dx, std::size_t n, S s, const T* gamma,
                             T mu, T r, T* dgamma, T* dbeta) {
  const T inv_n = T(1) / static_cast<T>(std::max<std::size_t>(n, 1));
  if constexpr (contiguous<S>) {
    const auto xhat = (as_array(x, n) - mu) * r;
    const auto dzs = as_array(dz, n);
    const auto dxhat = dzs * as_array(gamma, n);
    if (dgamma) {
      as_array(dgamma, n) += dzs * xhat;
      as_array(dbeta, n) += dzs;
    }
    if (!dx) return;
    const T mean_d = dxhat.sum() * inv_n;
    const T mean_dx = (dxhat * xhat).sum() * inv_n;
    as_array(dx, n) = r * (dxhat - mean_d - xhat * mean_dx);
  } else {
    T mean_d = 0, mean_dx = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const T xhat = (x[j * s] - mu) * r;
      const T dxhat = dz[j * s] * gamma[j];
      if (dgamma) {
        dgamma[j] += dz[j * s] * xhat;
        dbeta[j] += dz[j * s];
      }
      mean_d += dxhat;
      mean_dx += dxhat * xhat;
    }
    if (!dx) return;
    mean_d *= inv_n;
    mean_dx *= inv_n;
    for (std::size_t j = 0; j < n; ++j) {
      const T xhat = (x[j * s] - mu) * r;
      dx[j * s] = r * (dz[j * s] * gamma[j] - mean_d - xhat * mean_dx);
    }
  }
}

// Runs of a broadcast walk: n contiguous elements of the big shard against n contiguous
// elements (Step = 1) or one element (Step = 0) of the small one.
template <bool Multiply, class T, class Step>
void combine_run(const T* x, const T* y, T* z, std::size_t n, Step) {
  const auto xs = as_array(x, n);
  auto zs = as_array(z, n);
  if constexpr (Step::value == 0) {
    if constexpr (Multiply) {
      zs = xs * y[0];
    } else {
      zs = xs + y[0];
    }
  } else {
    if constexpr (Multiply) {
      zs = xs * as_array(y, n);
    } else {
      zs = xs + as_array(y, n);
    }
  }
}
// small += big (times `weight`, when set), summed over the run where Step = 0.
template <class T, class Step>
void sum_run(const T* big, const T* weight, T* small, std::size_t n, Step) {
  const auto bs = as_array(big, n);
  if constexpr (Step::value == 0) {
    small[0] += weight ? (bs * as_array(weight, n)).sum() : bs.sum();
  } else if (weight) {
    as_array(small, n) += bs * as_array(weight, n);
  } else {
    as_array(small, n) += bs;
  }
}
// big = small repeated over the run.
template <class T, class Step>
void expand_run(const T* small, T* big, std::size_t n, Step) {
  if constexpr (Step::value == 0) {
    as_array(big, n).setConstant(small[0]);
  } else {
    as_array(big, n) = as_array(small, n);
  }
}

// GPT-2's gelu and its derivative over n contiguous elements.
template <class T>
struct gelu_constants {
  static constexpr T c = T(0.7978845608028654);  // sqrt(2 / pi)
  static constexpr T a = T(0.044715);
};
template <class T>
void gelu_forward(const T* x, T* y, std::size_t n) {
  constexpr T c = gelu_constants<T>::c, a = gelu_constants<T>::a;
  const auto xs = as_array(x, n);
  as_array(y, n) = T(0.5) * xs * (T(1) + (c * (xs + a * xs.cube())).tanh());
}
template <class T>
void gelu_backward(const T* x, const T* dz, T* dx, std::size_t n) {
  constexpr T c = gelu_constants<T>::c, a = gelu_constants<T>::a;
  const auto xs = as_array(x, n);
  auto t = as_array(dx, n);
  t = (c * (xs + a * xs.cube())).tanh();  // dx holds tanh(u) for the second pass
  t = as_array(dz, n) * (T(0.5) * (T(1) + t) +
                         T(0.5) * c * xs * (T(1) - t.square()) * (T(1) + T(3) * a * xs.square()));
}

// Softmax (Log = false) or log-softmax along D; with Q and K set, causally masked first
// (entries with global k > global q take no part: 0, or -infinity for log-softmax).
template <bool Log, char D, char Q, char K, sharded_tensor X>
variable<X> softmax_along(const variable<X>& x) {
  using T = typename X::value_type;
  constexpr bool masked = Q != 0;
  const X& xv = x.value();
  X y(xv.mesh(), xv.extents(), X::uninitialized);
  const rows_along rows = rows_of(xv.local_extents(), X::dim_index(D));
  causal_rows causal;
  if constexpr (masked) causal = causal_rows_of<D, Q, K>(xv);
  const T* px = xv.local().data();
  T* py = y.local().data();
  for_each_row(rows, [&](std::size_t row, std::size_t first, auto s) {
    std::pair<std::size_t, std::size_t> kept{0, rows.n};
    if constexpr (masked) kept = causal.kept(row);
    if constexpr (Log) {
      log_softmax_row(px + first, py + first, rows.n, s, kept.first, kept.second);
    } else {
      softmax_row(px + first, py + first, rows.n, s, kept.first, kept.second);
    }
  });
  auto out = make_result(x.owner(), std::move(y), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), rows] {
      if (!on->grad) return;
      dual_tensor<X> dx(on->value.mesh(), on->value.extents(), dual_tensor<X>::uninitialized);
      const T* yv = on->value.local().data();
      const T* dz = std::as_const(*on->grad).local().data();
      T* pdx = dx.local().data();
      for_each_row(rows, [&](std::size_t, std::size_t first, auto s) {
        if constexpr (Log) {
          log_softmax_backward_row(yv + first, dz + first, pdx + first, rows.n, s);
        } else {
          softmax_backward_row(yv + first, dz + first, pdx + first, rows.n, s);
        }
      });
      xn->accumulate(std::move(dx));
    });
  }
  return out;
}

// x (+ or *) y, y broadcast over the dims it lacks.
template <fixed_string Op, bool Multiply, sharded_tensor X, sharded_tensor Y>
variable<X> broadcast_apply(const variable<X>& x, const variable<Y>& y) {
  using T = typename X::value_type;
  constexpr layout_value y_at = splits_of(X::layout, view_of<Y::dims>);
  using y_grad_t = typename relayout<Y, dual(y_at)>::type;  // pending where x's extra dims split
  check_extents<Op>(x.value(), y.value(), "x", "y");
  const X& xv = x.value();
  constexpr bool moved = Y::layout != y_at;  // y used through a copy in layout y_at
  decltype(auto) yu = at_layout<y_at>(y.value());
  const broadcast_walk w = walk_of(view_of<X::dims>, view_of<Y::dims>, xv.local_extents());
  X z(xv.mesh(), xv.extents(), X::uninitialized);
  {
    const T* px = xv.local().data();
    const T* py = yu.local().data();
    T* pz = z.local().data();
    for_each_run(w, [&](std::size_t b, std::size_t s, auto step) {
      combine_run<Multiply>(px + b, py + s, pz + b, w.run, step);
    });
  }
  auto out = make_result(x.owner(), std::move(z), x.requires_grad() || y.requires_grad());
  if (!out.requires_grad()) return out;
  // y as used, for the product's gradient of x: y's own node unless it was moved.
  auto y_used = detail::keep_if < Multiply && moved > (std::move(yu));
  x.owner().record([xn = x.node(), yn = y.node(), on = out.node(), w, y_used = std::move(y_used)] {
    (void)y_used;  // used in one branch of an if constexpr only
    if (!on->grad) return;
    const T* dz = std::as_const(*on->grad).local().data();
    if (xn->requires_grad) {
      if constexpr (Multiply) {
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        T* pdx = dx.local().data();
        const T* py = [&] {
          if constexpr (moved) {
            return y_used.local().data();
          } else {
            return std::as_const(yn->value).local().data();
          }
        }();
        for_each_run(w, [&](std::size_t b, std::size_t s, auto step) {
          combine_run<true>(dz + b, py + s, pdx + b, w.run, step);
        });
        xn->accumulate(std::move(dx));
      } else {
        xn->accumulate(dual_tensor<X>(*on->grad));
      }
    }
    if (yn->requires_grad) {
      y_grad_t dy(yn->value.mesh(), yn->value.extents());
      T* pdy = dy.local().data();
      const T* px = xn->value.local().data();
      for_each_run(w, [&](std::size_t b, std::size_t s, auto step) {
        sum_run(dz + b, Multiply ? px + b : nullptr, pdy + s, w.run, step);
      });
      yn->accumulate(redistribute_to<dual(Y::layout)>(std::move(dy)));
    }
  });
  return out;
}

template <fixed_string Op, class X, class Y>
constexpr bool check_broadcast() {
  if constexpr (!check_operand<Op, X>()) {
    return false;
  } else if constexpr (!check_same_kind<Op, X, Y>()) {
    return false;
  } else if constexpr (Y::layout.any_partial()) {
    (void)autodiff_error::partial_operand<Op, Y>{};
    return false;
  } else if constexpr (!is_subsequence(view_of<Y::dims>, view_of<X::dims>)) {
    (void)autodiff_error::not_a_subsequence<Op, X, Y>{};
    return false;
  } else {
    return true;
  }
}

// OutDims == the ids' dims followed by the table's feature dim.
template <fixed_string OutDims, class Ids, class Table>
constexpr bool embedding_dims_ok() {
  if (OutDims.size() != Ids::rank + 1) return false;
  for (std::size_t k = 0; k < Ids::rank; ++k) {
    if (OutDims[k] != Ids::dims[k]) return false;
  }
  return OutDims[Ids::rank] == Table::dims[1];
}

// Throws for an index (an id, a target) at `flat` of a local shard outside [0, rows).
template <fixed_string Op, sharded_tensor Ids>
[[noreturn]] void bad_index(const Ids& ids, std::size_t flat, std::int64_t id, std::size_t rows,
                            std::string_view what) {
  throw shape_error(zest::detail::message(
      "zest: ", view_of<Op>, ": ", what, " ", id, " at position (",
      position_of(view_of<Ids::dims>, ids.local_extents(), ids.local_offsets(), flat), ") of \"",
      view_of<Ids::dims>, "\" is outside [0, ", rows, ")"));
}

// Dropout's keep test for global flat index i: a uniform 53-bit draw at or above p.
struct dropout_mask {
  std::uint64_t key = 0, threshold = 0;
  dropout_mask(double p, std::uint64_t seed)
      : key(splitmix64(seed)), threshold(static_cast<std::uint64_t>(std::ceil(p * 0x1p53))) {}
  bool keep(std::uint64_t i) const { return (splitmix64(key ^ i) >> 11) >= threshold; }
};

// out[i] = keep(i) ? in[i] * scale : 0 over a local shard, i the global flat index.
template <sharded_tensor In, sharded_tensor Out>
void apply_dropout(const In& in, Out& out, const dropout_mask& mask,
                   typename In::value_type scale) {
  using T = typename In::value_type;
  const T* pi = in.local().data();
  T* po = out.local().data();
  if constexpr (on_host<In>) {
    for_each_global_run(in.extents(), in.local_extents(), in.local_offsets(),
                        [&](std::size_t l, std::size_t g, std::size_t run) {
                          for (std::size_t j = 0; j < run; ++j) {
                            po[l + j] = pi[l + j] * (mask.keep(g + j) ? scale : T(0));
                          }
                        });
  } else {
    In::backend_type::for_each(
        out.local_count(),
        kernels::dropout_apply<T>{
            pi, po, global_index_of(in.extents(), in.local_extents(), in.local_offsets()), mask.key,
            mask.threshold, scale});
  }
}

// ---------------------------------------------------------------------------------------
// Other backends: the operations below with kernels.hpp's function objects in place of the
// host loops. Same layouts, checks and recorded steps; scratch (per-row statistics, picked
// ids) in the backend's buffers; ids and targets are copied to the host to be checked.

// small = the sums of kernels::broadcast_sum: one pass, or two (chunks of sum_chunk terms,
// then the chunks in order) when each small element sums many big ones.
template <class B, class T>
void run_broadcast_sum(const T* big, const T* weight, T* small, std::size_t smalls,
                       const kernels::broadcast_map& map) {
  if (map.absent_count <= kernels::sum_chunk) {
    B::for_each(smalls, kernels::broadcast_sum<T>{big, weight, small, map});
    return;
  }
  const std::size_t chunks = (map.absent_count + kernels::sum_chunk - 1) / kernels::sum_chunk;
  typename B::template buffer<T> partial(chunks * smalls);
  B::for_each(chunks * smalls, kernels::broadcast_sum<T>{big, weight, partial.data(), map,
                                                         kernels::sum_chunk, smalls});
  B::for_each(smalls, kernels::add_chunks<T>{partial.data(), small, smalls, chunks});
}

template <fixed_string Op, bool Multiply, sharded_tensor X, sharded_tensor Y>
variable<X> generic_broadcast_apply(const variable<X>& x, const variable<Y>& y) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  constexpr layout_value y_at = splits_of(X::layout, view_of<Y::dims>);
  using y_grad_t = typename relayout<Y, dual(y_at)>::type;
  check_extents<Op>(x.value(), y.value(), "x", "y");
  const X& xv = x.value();
  constexpr bool moved = Y::layout != y_at;
  decltype(auto) yu = at_layout<y_at>(y.value());
  const kernels::broadcast_map map =
      broadcast_map_of(walk_of(view_of<X::dims>, view_of<Y::dims>, xv.local_extents()));
  X z(xv.mesh(), xv.extents(), X::uninitialized);
  B::for_each(z.local_count(), kernels::broadcast_combine<T, Multiply>{
                                   xv.local().data(), yu.local().data(), z.local().data(), map});
  auto out = make_result(x.owner(), std::move(z), x.requires_grad() || y.requires_grad());
  if (!out.requires_grad()) return out;
  auto y_used = detail::keep_if < Multiply && moved > (std::move(yu));
  x.owner().record(
      [xn = x.node(), yn = y.node(), on = out.node(), map, y_used = std::move(y_used)] {
        (void)y_used;  // used in one branch of an if constexpr only
        if (!on->grad) return;
        const T* dz = std::as_const(*on->grad).local().data();
        if (xn->requires_grad) {
          if constexpr (Multiply) {
            dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
            const T* py = [&] {
              if constexpr (moved) {
                return y_used.local().data();
              } else {
                return std::as_const(yn->value).local().data();
              }
            }();
            B::for_each(dx.local_count(),
                        kernels::broadcast_combine<T, true>{dz, py, dx.local().data(), map});
            xn->accumulate(std::move(dx));
          } else {
            xn->accumulate(dual_tensor<X>(*on->grad));
          }
        }
        if (yn->requires_grad) {
          y_grad_t dy(yn->value.mesh(), yn->value.extents(), y_grad_t::uninitialized);
          const T* weight = Multiply ? std::as_const(xn->value).local().data() : nullptr;
          run_broadcast_sum<B>(dz, weight, dy.local().data(), dy.local_count(), map);
          yn->accumulate(redistribute_to<dual(Y::layout)>(std::move(dy)));
        }
      });
  return out;
}

template <sharded_tensor X>
variable<X> generic_gelu(const variable<X>& x) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  const X& xv = x.value();
  X y(xv.mesh(), xv.extents(), X::uninitialized);
  B::for_each(y.local_count(), kernels::gelu_forward<T>{xv.local().data(), y.local().data()});
  auto out = make_result(x.owner(), std::move(y), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node()] {
      if (!on->grad) return;
      dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
      B::for_each(
          dx.local_count(),
          kernels::gelu_backward<T>{std::as_const(xn->value).local().data(),
                                    std::as_const(*on->grad).local().data(), dx.local().data()});
      xn->accumulate(std::move(dx));
    });
  }
  return out;
}

template <bool Log, char D, char Q, char K, sharded_tensor X>
variable<X> generic_softmax_along(const variable<X>& x) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  const X& xv = x.value();
  X y(xv.mesh(), xv.extents(), X::uninitialized);
  const rows_along rows = rows_of(xv.local_extents(), X::dim_index(D));
  const kernels::row_walk walk = row_walk_of(rows);
  kernels::causal_window window;
  window.n = rows.n;
  if constexpr (Q != 0) window = causal_window_of(causal_rows_of<D, Q, K>(xv));
  B::for_each(rows.count(),
              kernels::softmax_rows<T, Log>{xv.local().data(), y.local().data(), walk, window});
  auto out = make_result(x.owner(), std::move(y), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), count = rows.count(), walk] {
      if (!on->grad) return;
      dual_tensor<X> dx(on->value.mesh(), on->value.extents(), dual_tensor<X>::uninitialized);
      B::for_each(count, kernels::softmax_backward_rows<T, Log>{
                             std::as_const(on->value).local().data(),
                             std::as_const(*on->grad).local().data(), dx.local().data(), walk});
      xn->accumulate(std::move(dx));
    });
  }
  return out;
}

template <char Q, char K, sharded_tensor X>
variable<X> generic_causal_mask(const variable<X>& x) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  const X& xv = x.value();
  X y(xv.mesh(), xv.extents(), X::uninitialized);
  const causal_rows causal = causal_rows_of<K, Q, K>(xv);
  const kernels::row_walk walk = row_walk_of(causal.rows);
  const kernels::causal_window window = causal_window_of(causal);
  const std::size_t count = causal.rows.count();
  B::for_each(count, kernels::causal_mask_rows<T>{xv.local().data(), y.local().data(), walk, window,
                                                  minus_infinity<T>});
  auto out = make_result(x.owner(), std::move(y), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), count, walk, window] {
      if (!on->grad) return;
      dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
      B::for_each(count, kernels::causal_mask_rows<T>{std::as_const(*on->grad).local().data(),
                                                      dx.local().data(), walk, window, T(0)});
      xn->accumulate(std::move(dx));
    });
  }
  return out;
}

template <char D, sharded_tensor X, sharded_tensor G>
variable<X> generic_layer_norm(const variable<X>& x, const variable<G>& gamma,
                               const variable<G>& beta, double eps) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  constexpr layout_value whole = whole_layout<typename X::mesh_type>;
  constexpr layout_value pending = dual(whole);  // sums over rows, pending on every axis
  using param_grad_t = typename relayout<G, pending>::type;
  check_extents<"layer_norm">(x.value(), gamma.value(), "x", "gamma");
  check_extents<"layer_norm">(x.value(), beta.value(), "x", "beta");
  const X& xv = x.value();
  const auto& gv = at_layout<whole>(gamma.value());
  const auto& bv = at_layout<whole>(beta.value());
  const rows_along rows = rows_of(xv.local_extents(), X::dim_index(D));
  const kernels::row_walk walk = row_walk_of(rows);
  typename B::template buffer<T> row_mean(rows.count()), row_rstd(rows.count());
  X y(xv.mesh(), xv.extents(), X::uninitialized);
  B::for_each(rows.count(),
              kernels::layer_norm_rows<T>{xv.local().data(), gv.local().data(), bv.local().data(),
                                          y.local().data(), row_mean.data(), row_rstd.data(), walk,
                                          static_cast<T>(eps)});
  const bool params = gamma.requires_grad() || beta.requires_grad();
  auto out = make_result(x.owner(), std::move(y), x.requires_grad() || params);
  if (!out.requires_grad()) return out;
  x.owner().record([xn = x.node(), gn = gamma.node(), bn = beta.node(), on = out.node(), rows, walk,
                    row_mean = std::move(row_mean), row_rstd = std::move(row_rstd)] {
    if (!on->grad) return;
    const T* px = std::as_const(xn->value).local().data();
    const T* dz = std::as_const(*on->grad).local().data();
    if (xn->requires_grad) {
      const auto& gv = at_layout<whole_layout<typename X::mesh_type>>(gn->value);
      dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
      B::for_each(rows.count(),
                  kernels::layer_norm_backward_rows<T>{px, dz, gv.local().data(), row_mean.data(),
                                                       row_rstd.data(), dx.local().data(), walk});
      xn->accumulate(std::move(dx));
    }
    if (gn->requires_grad || bn->requires_grad) {
      param_grad_t dgamma(gn->value.mesh(), gn->value.extents(), param_grad_t::uninitialized);
      param_grad_t dbeta(bn->value.mesh(), bn->value.extents(), param_grad_t::uninitialized);
      // One pass over all rows per column, or chunks of rows first when there are many.
      const std::size_t n = rows.n, count = rows.count();
      const std::size_t chunks =
          std::max<std::size_t>(1, (count + kernels::sum_chunk - 1) / kernels::sum_chunk);
      if (chunks == 1) {
        B::for_each(n, kernels::layer_norm_parameter_grads<T>{
                           px, dz, row_mean.data(), row_rstd.data(), dgamma.local().data(),
                           dbeta.local().data(), walk, count, n, kernels::sum_chunk});
      } else {
        typename B::template buffer<T> pg(chunks * n), pb(chunks * n);
        B::for_each(chunks * n, kernels::layer_norm_parameter_grads<T>{
                                    px, dz, row_mean.data(), row_rstd.data(), pg.data(), pb.data(),
                                    walk, count, n, kernels::sum_chunk});
        B::for_each(n, kernels::add_chunks<T>{pg.data(), dgamma.local().data(), n, chunks});
        B::for_each(n, kernels::add_chunks<T>{pb.data(), dbeta.local().data(), n, chunks});
      }
      if (gn->requires_grad) gn->accumulate(redistribute_to<dual(G::layout)>(std::move(dgamma)));
      if (bn->requires_grad) bn->accumulate(redistribute_to<dual(G::layout)>(std::move(dbeta)));
    }
  });
  return out;
}

template <fixed_string OutDims, sharded_tensor Ids, sharded_tensor Table>
auto generic_embedding(const Ids& ids, const variable<Table>& table) {
  using T = typename Table::value_type;
  using B = typename Table::backend_type;
  constexpr char feature = Table::dims[1];
  constexpr layout_value table_at = release_axes(Table::layout, Ids::layout);
  constexpr layout_value out_layout = embedding_layout(Ids::layout, table_at, feature);
  using out_t = basic_tensor<T, typename Table::mesh_type, OutDims, out_layout>;
  using grad_at_t = typename relayout<Table, dual(table_at)>::type;
  const auto& tv = at_layout<table_at>(table.value());
  const std::size_t rows = tv.extents()[0];
  const std::size_t width = tv.local_extents()[1];
  typename out_t::extents_type extents{};
  for (std::size_t k = 0; k < Ids::rank; ++k) extents[k] = ids.extents()[k];
  extents[Ids::rank] = tv.extents()[1];
  out_t y(tv.mesh(), extents, out_t::uninitialized);
  const auto checked = ids.local_to_host();
  for (std::size_t p = 0; p < checked.size(); ++p) {
    const std::int32_t id = checked[p];
    if (id < 0 || static_cast<std::size_t>(id) >= rows)
      bad_index<"embedding">(ids, p, id, rows, "id");
  }
  B::for_each(y.local_count(), kernels::embedding_gather<T>{tv.local().data(), ids.local().data(),
                                                            y.local().data(), width});
  auto out = make_result(table.owner(), std::move(y), table.requires_grad());
  if (out.requires_grad()) {
    // For the gradient: the positions of each table row, in order (a stable counting sort
    // of the checked ids), so that one call per table element sums its positions.
    if (checked.size() >= std::size_t{1} << 32U) {
      throw shape_error(zest::detail::message("zest: embedding: ", checked.size(),
                                              " ids on one rank exceed the 2^32 that the "
                                              "gradient's position lists index"));
    }
    std::vector<std::uint32_t> first(rows + 1, 0), order(checked.size());
    for (const std::int32_t id : checked) ++first[static_cast<std::size_t>(id) + 1];
    for (std::size_t r = 0; r < rows; ++r) first[r + 1] += first[r];
    std::vector<std::uint32_t> next(first.begin(), first.end() - 1);
    for (std::size_t p = 0; p < checked.size(); ++p)
      order[next[static_cast<std::size_t>(checked[p])]++] = static_cast<std::uint32_t>(p);
    struct row_lists {
      typename B::template buffer<std::uint32_t> first, order;
    };
    auto lists = std::make_shared<row_lists>(
        row_lists{B::template from_host<std::uint32_t>(std::span<const std::uint32_t>(first)),
                  B::template from_host<std::uint32_t>(std::span<const std::uint32_t>(order))});
    table.owner().record([tn = table.node(), on = out.node(), lists, width] {
      if (!on->grad) return;
      grad_at_t g(tn->value.mesh(), tn->value.extents(), grad_at_t::uninitialized);
      B::for_each(g.local_count(), kernels::embedding_scatter<T>{
                                       std::as_const(*on->grad).local().data(), lists->first.data(),
                                       lists->order.data(), g.local().data(), width});
      tn->accumulate(redistribute_to<dual(Table::layout)>(std::move(g)));
    });
  }
  return out;
}

template <char V, sharded_tensor L, sharded_tensor Targets>
auto generic_cross_entropy(const variable<L>& logits, const Targets& targets) {
  using T = typename L::value_type;
  using B = typename L::backend_type;
  constexpr layout_value targets_at = splits_of(L::layout, view_of<Targets::dims>);
  constexpr layout_value scalar_layout = scalar_sum_layout(L::layout);
  using s_t = basic_tensor<T, typename L::mesh_type, no_dims, scalar_layout>;
  const L& lv = logits.value();
  check_extents<"cross_entropy">(lv, targets, "logits", "targets");
  std::size_t count = 1;
  for (std::size_t k = 0; k < L::rank; ++k) count *= k == L::dim_index(V) ? 1 : lv.extents()[k];
  if (count == 0) {
    throw shape_error(zest::detail::message("zest: cross_entropy: the logits \"", view_of<L::dims>,
                                            "\" have no token positions to average over"));
  }
  const auto& tv = at_layout<targets_at>(targets);
  const rows_along rows = rows_of(lv.local_extents(), L::dim_index(V));
  const kernels::row_walk walk = row_walk_of(rows);
  const auto checked = tv.local_to_host();
  for (std::size_t row = 0; row < rows.count(); ++row) {
    const std::int32_t target = checked[row];
    if (target < 0 || static_cast<std::size_t>(target) >= rows.n) {
      bad_index<"cross_entropy">(tv, row, target, rows.n, "target");
    }
  }
  typename B::template buffer<T> lse(rows.count());
  const T* px = lv.local().data();
  B::for_each(rows.count(), kernels::log_sum_exp_rows<T>{px, lse.data(), walk});
  const double total = B::sum(
      rows.count(), kernels::cross_entropy_terms<T>{px, lse.data(), tv.local().data(), walk});
  auto out = make_result(
      logits.owner(), scalar_of<s_t>(lv.mesh(), static_cast<T>(total / static_cast<double>(count))),
      logits.requires_grad());
  if (out.requires_grad()) {
    logits.owner().record([ln = logits.node(), on = out.node(), walk, count, lse = std::move(lse),
                           picked = tv.storage()] {
      if (!on->grad) return;
      const T scale =
          static_cast<T>(static_cast<double>(scalar_value(*on->grad)) / static_cast<double>(count));
      dual_tensor<L> dx(ln->value.mesh(), ln->value.extents(), dual_tensor<L>::uninitialized);
      B::for_each(dx.local_count(), kernels::cross_entropy_backward<T>{
                                        std::as_const(ln->value).local().data(), lse.data(),
                                        picked.data(), dx.local().data(), walk, scale});
      ln->accumulate(std::move(dx));
    });
  }
  return out;
}

template <fixed_string OutDims, sharded_tensor X>
auto generic_reduce_sum(const variable<X>& x) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  constexpr layout_value out_layout = summed_layout(X::layout, view_of<OutDims>);
  using out_t = basic_tensor<T, typename X::mesh_type, OutDims, out_layout>;
  const X& xv = x.value();
  typename out_t::extents_type extents{};
  for (std::size_t k = 0; k < out_t::rank; ++k) extents[k] = xv.extent(OutDims[k]);
  out_t y(xv.mesh(), extents, out_t::uninitialized);
  const kernels::broadcast_map map =
      broadcast_map_of(walk_of(view_of<X::dims>, view_of<OutDims>, xv.local_extents()));
  run_broadcast_sum<B>(xv.local().data(), static_cast<const T*>(nullptr), y.local().data(),
                       y.local_count(), map);
  auto out = make_result(x.owner(), std::move(y), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), map] {
      if (!on->grad) return;
      dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
      B::for_each(dx.local_count(),
                  kernels::broadcast_expand<T>{std::as_const(*on->grad).local().data(),
                                               dx.local().data(), map});
      xn->accumulate(std::move(dx));
    });
  }
  return out;
}

template <sharded_tensor X>
auto generic_mean(const variable<X>& x) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  constexpr layout_value scalar_layout = scalar_sum_layout(X::layout);
  using s_t = basic_tensor<T, typename X::mesh_type, no_dims, scalar_layout>;
  const std::size_t count = x.value().size();
  const auto local = x.value().local();
  const double total = B::sum(local.size(), kernels::element<T>{local.data()});
  auto out = make_result(
      x.owner(),
      scalar_of<s_t>(x.value().mesh(), static_cast<T>(total / static_cast<double>(count))),
      x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), count] {
      if (!on->grad) return;
      dual_tensor<X> g(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
      const T seed =
          static_cast<T>(static_cast<double>(scalar_value(*on->grad)) / static_cast<double>(count));
      B::fill(g.local().data(), g.local_count(), seed);
      xn->accumulate(std::move(g));
    });
  }
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Broadcasting.

// x + y, y's dims some of x's (same order), y repeated over the others: a bias "m" added to
// activations "btm". Neither may be partial. The result has x's type; y is used in the
// layout that splits its dims as x does (a local slice of a replicated y), and its gradient,
// the sum over the dims it lacks, is pending on the axes that split those dims.
template <sharded_tensor X, sharded_tensor Y>
auto broadcast_add(const variable<X>& x, const variable<Y>& y) {
  if constexpr (!detail::check_broadcast<"broadcast_add", X, Y>()) {
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_broadcast_apply<"broadcast_add", false>(x, y);
  } else {
    return detail::broadcast_apply<"broadcast_add", false>(x, y);
  }
}

// x * y with y broadcast as in broadcast_add; y's gradient is the sum of dz * x over the dims
// it lacks.
template <sharded_tensor X, sharded_tensor Y>
auto broadcast_multiply(const variable<X>& x, const variable<Y>& y) {
  if constexpr (!detail::check_broadcast<"broadcast_multiply", X, Y>()) {
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_broadcast_apply<"broadcast_multiply", true>(x, y);
  } else {
    return detail::broadcast_apply<"broadcast_multiply", true>(x, y);
  }
}

// ---------------------------------------------------------------------------------------
// Elementwise.

// GPT-2's gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Any layout but partial.
template <sharded_tensor X>
auto gelu(const variable<X>& x) {
  if constexpr (!detail::check_operand<"gelu", X>()) {
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_gelu(x);
  } else {
    const X& xv = x.value();
    X y(xv.mesh(), xv.extents(), X::uninitialized);
    detail::gelu_forward(xv.local().data(), y.local().data(), xv.local_count());
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node()] {
        if (!on->grad) return;
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        detail::gelu_backward(std::as_const(xn->value).local().data(),
                              std::as_const(*on->grad).local().data(), dx.local().data(),
                              xn->value.local_count());
        xn->accumulate(std::move(dx));
      });
    }
    return out;
  }
}

// Keeps each element with probability 1 - p and scales it by 1 / (1 - p). Whether element i
// is kept is a pure function of (seed, i), i its row-major index in the global tensor, so the
// result does not depend on the number of ranks or the layout. Linear in x, so x may be
// partial. p == 0 returns x itself; p outside [0, 1) throws zest::shape_error.
template <sharded_tensor X>
auto dropout(const variable<X>& x, double p, std::uint64_t seed) {
  if constexpr (!detail::check_real_operand<"dropout", X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    if (!(p >= 0 && p < 1)) {
      throw shape_error(zest::detail::message("zest: dropout: the drop probability p = ", p,
                                              " is outside [0, 1)"));
    }
    if (p == 0) return x;
    const detail::dropout_mask mask(p, seed);
    const T scale = static_cast<T>(1 / (1 - p));
    X y(x.value().mesh(), x.value().extents(), X::uninitialized);
    detail::apply_dropout(x.value(), y, mask, scale);
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), mask, scale] {
        if (!on->grad) return;
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        detail::apply_dropout(*on->grad, dx, mask, scale);
        xn->accumulate(std::move(dx));
      });
    }
    return out;
  }
}

// ---------------------------------------------------------------------------------------
// Along one dim.

// Softmax along D (whole on every rank; x not partial). Entries of -infinity (masked) get 0;
// a row of only -infinity is not expected.
template <char D, sharded_tensor X>
auto softmax(const variable<X>& x) {
  if constexpr (!detail::check_operand<"softmax", X>()) {
    return 0;
  } else if constexpr (!detail::check_whole_dim<"softmax", D, X>()) {
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_softmax_along<false, D, 0, 0>(x);
  } else {
    return detail::softmax_along<false, D, 0, 0>(x);
  }
}

// log(softmax(x)) along D, computed stably (x - max - log(sum(exp(x - max)))).
template <char D, sharded_tensor X>
auto log_softmax(const variable<X>& x) {
  if constexpr (!detail::check_operand<"log_softmax", X>()) {
    return 0;
  } else if constexpr (!detail::check_whole_dim<"log_softmax", D, X>()) {
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_softmax_along<true, D, 0, 0>(x);
  } else {
    return detail::softmax_along<true, D, 0, 0>(x);
  }
}

// x with -infinity where the global index along K exceeds the global index along Q (the
// future of a query); right under any split of Q and K. The gradient passes where x was kept.
template <char Q, char K, sharded_tensor X>
auto causal_mask(const variable<X>& x) {
  if constexpr (!detail::check_operand<"causal_mask", X>()) {
    return 0;
  } else if constexpr (!X::dims.contains(Q)) {
    (void)autodiff_error::missing_dim<"causal_mask", Q, X>{};
    return 0;
  } else if constexpr (!X::dims.contains(K)) {
    (void)autodiff_error::missing_dim<"causal_mask", K, X>{};
    return 0;
  } else if constexpr (Q == K) {
    (void)autodiff_error::causal_dims<Q, K, K, X>{};
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_causal_mask<Q, K>(x);
  } else {
    using T = typename X::value_type;
    const X& xv = x.value();
    X y(xv.mesh(), xv.extents(), X::uninitialized);
    const detail::causal_rows causal = detail::causal_rows_of<K, Q, K>(xv);
    const auto pass = [causal](const T* in, T* out, T fill) {
      detail::for_each_row(causal.rows, [&](std::size_t row, std::size_t first, auto s) {
        const std::size_t hi = causal.kept(row).second;
        for (std::size_t j = 0; j < hi; ++j) out[first + j * s] = in[first + j * s];
        for (std::size_t j = hi; j < causal.rows.n; ++j) out[first + j * s] = fill;
      });
    };
    pass(xv.local().data(), y.local().data(), detail::minus_infinity<T>);
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), pass] {
        if (!on->grad) return;
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        pass(std::as_const(*on->grad).local().data(), dx.local().data(), T(0));
        xn->accumulate(std::move(dx));
      });
    }
    return out;
  }
}

// softmax<D>(causal_mask<Q, K>(x)) in one pass, without the -infinity tensor: the attention
// weights of scores "bhqk" are causal_softmax<'q', 'k'>(scores). D (K or Q) must be whole.
template <char Q, char K, char D = K, sharded_tensor X>
auto causal_softmax(const variable<X>& x) {
  if constexpr (!detail::check_operand<"causal_softmax", X>()) {
    return 0;
  } else if constexpr (!X::dims.contains(Q)) {
    (void)autodiff_error::missing_dim<"causal_softmax", Q, X>{};
    return 0;
  } else if constexpr (!X::dims.contains(K)) {
    (void)autodiff_error::missing_dim<"causal_softmax", K, X>{};
    return 0;
  } else if constexpr (Q == K || (D != Q && D != K)) {
    (void)autodiff_error::causal_dims<Q, K, D, X>{};
    return 0;
  } else if constexpr (!detail::check_whole_dim<"causal_softmax", D, X>()) {
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_softmax_along<false, D, Q, K>(x);
  } else {
    return detail::softmax_along<false, D, Q, K>(x);
  }
}

// Layer normalisation along D (whole; x not partial): y = (x - mean) / sqrt(var + eps) * gamma
// + beta, with gamma and beta 1-D tensors along D. They are used replicated (gathered if
// stored otherwise); their gradients, sums over all rows, are pending on every axis and
// reach them in their dual layouts. Mean and 1/sqrt(var + eps) of each row are kept for the
// backward step.
template <char D, sharded_tensor X, sharded_tensor G>
auto layer_norm(const variable<X>& x, const variable<G>& gamma, const variable<G>& beta,
                double eps = 1e-5) {
  if constexpr (!detail::check_operand<"layer_norm", X>()) {
    return 0;
  } else if constexpr (!detail::check_whole_dim<"layer_norm", D, X>()) {
    return 0;
  } else if constexpr (!detail::check_same_kind<"layer_norm", X, G>()) {
    return 0;
  } else if constexpr (G::rank != 1 || G::dims[0] != D) {
    (void)autodiff_error::norm_parameter<D, G>{};
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_layer_norm<D>(x, gamma, beta, eps);
  } else {
    using T = typename X::value_type;
    constexpr layout_value whole = detail::whole_layout<typename X::mesh_type>;
    static constexpr layout_value pending = dual(whole);  // sums over rows, pending on every axis
    using param_grad_t = typename detail::relayout<G, pending>::type;
    detail::check_extents<"layer_norm">(x.value(), gamma.value(), "x", "gamma");
    detail::check_extents<"layer_norm">(x.value(), beta.value(), "x", "beta");
    const X& xv = x.value();
    const auto& gv = detail::at_layout<whole>(gamma.value());
    const auto& bv = detail::at_layout<whole>(beta.value());
    const detail::rows_along rows = detail::rows_of(xv.local_extents(), X::dim_index(D));
    std::vector<T> row_mean(rows.count()), row_rstd(rows.count());
    X y(xv.mesh(), xv.extents(), X::uninitialized);
    {
      const T* px = xv.local().data();
      const T* pg = gv.local().data();
      const T* pb = bv.local().data();
      T* py = y.local().data();
      const T e = static_cast<T>(eps);
      detail::for_each_row(rows, [&](std::size_t row, std::size_t first, auto s) {
        std::tie(row_mean[row], row_rstd[row]) =
            detail::layer_norm_row(px + first, py + first, rows.n, s, pg, pb, e);
      });
    }
    const bool params = gamma.requires_grad() || beta.requires_grad();
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad() || params);
    if (!out.requires_grad()) return out;
    x.owner().record([xn = x.node(), gn = gamma.node(), bn = beta.node(), on = out.node(), rows,
                      row_mean = std::move(row_mean), row_rstd = std::move(row_rstd)] {
      if (!on->grad) return;
      const bool want_x = xn->requires_grad;
      const bool want_params = gn->requires_grad || bn->requires_grad;
      const auto& gv = detail::at_layout<detail::whole_layout<typename X::mesh_type>>(gn->value);
      std::optional<dual_tensor<X>> dx;
      std::optional<param_grad_t> dgamma, dbeta;
      if (want_x) dx.emplace(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
      if (want_params) {
        dgamma.emplace(gn->value.mesh(), gn->value.extents());
        dbeta.emplace(bn->value.mesh(), bn->value.extents());
      }
      const T* px = xn->value.local().data();
      const T* pg = gv.local().data();
      const T* dz = std::as_const(*on->grad).local().data();
      T* pdx = want_x ? dx->local().data() : nullptr;
      T* pdg = want_params ? dgamma->local().data() : nullptr;
      T* pdb = want_params ? dbeta->local().data() : nullptr;
      detail::for_each_row(rows, [&](std::size_t row, std::size_t first, auto s) {
        detail::layer_norm_backward_row(px + first, dz + first, pdx ? pdx + first : nullptr, rows.n,
                                        s, pg, row_mean[row], row_rstd[row], pdg, pdb);
      });
      if (want_x) xn->accumulate(std::move(*dx));
      if (gn->requires_grad) gn->accumulate(redistribute_to<dual(G::layout)>(std::move(*dgamma)));
      if (bn->requires_grad) bn->accumulate(redistribute_to<dual(G::layout)>(std::move(*dbeta)));
    });
    return out;
  }
}

// ---------------------------------------------------------------------------------------
// Lookups and the loss.

// Rows of `table` (dims rows then features, e.g. "vm") picked by int32_t `ids` (a plain tensor,
// dims e.g. "bt", not partial): the result has dims OutDims = ids' dims + the feature dim,
// split as the ids are on their dims and as the table is on the feature dim (an axis both
// use goes to the ids; the table is gathered on it). The table's rows are whole and it is
// not partial. The gradient adds each output row into its table row; it is pending on the
// axes that split the ids. An id outside [0, rows) throws zest::shape_error.
template <fixed_string OutDims, sharded_tensor Ids, sharded_tensor Table>
auto embedding(const Ids& ids, const variable<Table>& table) {
  if constexpr (!detail::check_operand<"embedding", Table>()) {
    return 0;
  } else if constexpr (!std::is_same_v<typename Ids::value_type, std::int32_t>) {
    (void)autodiff_error::not_int32<"embedding", Ids>{};
    return 0;
  } else if constexpr (Ids::layout.any_partial()) {
    (void)autodiff_error::partial_operand<"embedding", Ids>{};
    return 0;
  } else if constexpr (!std::is_same_v<typename Ids::mesh_type, typename Table::mesh_type>) {
    (void)autodiff_error::operand_mismatch<"embedding", Ids, Table>{};
    return 0;
  } else if constexpr (Table::rank != 2) {
    (void)autodiff_error::table_shape<Table>{};
    return 0;
  } else if constexpr (Table::layout.split_count(Table::dims[0]) != 0) {
    (void)autodiff_error::table_rows_split<Table>{};
    return 0;
  } else if constexpr (!detail::embedding_dims_ok<OutDims, Ids, Table>()) {
    (void)autodiff_error::embedding_dims<OutDims, Ids, Table>{};
    return 0;
  } else if constexpr (!detail::on_host<Table>) {
    return detail::generic_embedding<OutDims>(ids, table);
  } else {
    using T = typename Table::value_type;
    constexpr char feature = Table::dims[1];
    constexpr layout_value table_at = detail::release_axes(Table::layout, Ids::layout);
    constexpr layout_value out_layout = detail::embedding_layout(Ids::layout, table_at, feature);
    using out_t = basic_tensor<T, typename Table::mesh_type, OutDims, out_layout>;
    using grad_at_t = typename detail::relayout<Table, dual(table_at)>::type;
    const auto& tv = detail::at_layout<table_at>(table.value());
    const std::size_t rows = tv.extents()[0];
    const std::size_t width = tv.local_extents()[1];
    typename out_t::extents_type extents{};
    for (std::size_t k = 0; k < Ids::rank; ++k) extents[k] = ids.extents()[k];
    extents[Ids::rank] = tv.extents()[1];
    out_t y(tv.mesh(), extents, out_t::uninitialized);
    const auto local_ids = ids.local();
    {
      const T* pt = tv.local().data();
      T* py = y.local().data();
      for (std::size_t p = 0; p < local_ids.size(); ++p) {
        const std::int32_t id = local_ids[p];
        if (id < 0 || static_cast<std::size_t>(id) >= rows) {
          detail::bad_index<"embedding">(ids, p, id, rows, "id");
        }
        std::copy_n(pt + static_cast<std::size_t>(id) * width, width, py + p * width);
      }
    }
    auto out = detail::make_result(table.owner(), std::move(y), table.requires_grad());
    if (out.requires_grad()) {
      table.owner().record([tn = table.node(), on = out.node(),
                            picked = std::vector<std::int32_t>(local_ids.begin(), local_ids.end()),
                            width] {
        if (!on->grad) return;
        grad_at_t g(tn->value.mesh(), tn->value.extents());
        T* pg = g.local().data();
        const T* dz = std::as_const(*on->grad).local().data();
        for (std::size_t p = 0; p < picked.size(); ++p) {
          T* row = pg + static_cast<std::size_t>(picked[p]) * width;
          const T* d = dz + p * width;
          for (std::size_t j = 0; j < width; ++j) row[j] += d[j];
        }
        tn->accumulate(redistribute_to<dual(Table::layout)>(std::move(g)));
      });
    }
    return out;
  }
}

// The mean over all global token positions of -log softmax(logits)[target], softmax along
// V (whole; logits not partial): a scalar, pending on every axis that splits the logits
// (each rank adds its rows' losses divided by the global token count), replicated on the
// others. `targets` is a plain int32_t tensor with the logits' dims without V; it is used
// split as the logits are. Fused and stable (max subtracted); the gradient is
// (softmax - onehot(target)) * g / count. A target outside [0, extent of V) throws
// zest::shape_error.
template <char V, sharded_tensor L, sharded_tensor Targets>
auto cross_entropy(const variable<L>& logits, const Targets& targets) {
  constexpr auto dims_match = [] {
    std::size_t j = 0;
    for (std::size_t i = 0; i < L::rank; ++i) {
      if (L::dims[i] == V) continue;
      if (j >= Targets::rank || Targets::dims[j] != L::dims[i]) return false;
      ++j;
    }
    return j == Targets::rank;
  }();
  if constexpr (!detail::check_operand<"cross_entropy", L>()) {
    return 0;
  } else if constexpr (!detail::check_whole_dim<"cross_entropy", V, L>()) {
    return 0;
  } else if constexpr (!std::is_same_v<typename Targets::value_type, std::int32_t>) {
    (void)autodiff_error::not_int32<"cross_entropy", Targets>{};
    return 0;
  } else if constexpr (Targets::layout.any_partial()) {
    (void)autodiff_error::partial_operand<"cross_entropy", Targets>{};
    return 0;
  } else if constexpr (!std::is_same_v<typename Targets::mesh_type, typename L::mesh_type>) {
    (void)autodiff_error::operand_mismatch<"cross_entropy", L, Targets>{};
    return 0;
  } else if constexpr (!dims_match) {
    (void)autodiff_error::target_dims<V, L, Targets>{};
    return 0;
  } else if constexpr (!detail::on_host<L>) {
    return detail::generic_cross_entropy<V>(logits, targets);
  } else {
    using T = typename L::value_type;
    constexpr layout_value targets_at = detail::splits_of(L::layout, view_of<Targets::dims>);
    constexpr layout_value scalar_layout = detail::scalar_sum_layout(L::layout);
    using s_t = basic_tensor<T, typename L::mesh_type, detail::no_dims, scalar_layout>;
    const L& lv = logits.value();
    detail::check_extents<"cross_entropy">(lv, targets, "logits", "targets");
    std::size_t count = 1;
    for (std::size_t k = 0; k < L::rank; ++k) count *= k == L::dim_index(V) ? 1 : lv.extents()[k];
    if (count == 0) {
      throw shape_error(zest::detail::message("zest: cross_entropy: the logits \"",
                                              view_of<L::dims>,
                                              "\" have no token positions to average over"));
    }
    const auto& tv = detail::at_layout<targets_at>(targets);
    const detail::rows_along rows = detail::rows_of(lv.local_extents(), L::dim_index(V));
    std::vector<T> lse(rows.count());
    double total = 0;
    {
      const T* px = lv.local().data();
      const std::int32_t* pt = tv.local().data();
      detail::for_each_row(rows, [&](std::size_t row, std::size_t first, auto s) {
        const std::int32_t target = pt[row];
        if (target < 0 || static_cast<std::size_t>(target) >= rows.n) {
          detail::bad_index<"cross_entropy">(tv, row, target, rows.n, "target");
        }
        const T* xr = px + first;
        const T l = detail::log_sum_exp(xr, s, 0, rows.n);
        lse[row] = l;
        total += static_cast<double>(l - xr[static_cast<std::size_t>(target) * s]);
      });
    }
    s_t loss(lv.mesh(), {});
    loss.local()[0] = static_cast<T>(total / static_cast<double>(count));
    auto out = detail::make_result(logits.owner(), std::move(loss), logits.requires_grad());
    if (out.requires_grad()) {
      logits.owner().record([ln = logits.node(), on = out.node(), rows, count, lse = std::move(lse),
                             picked =
                                 std::vector<std::int32_t>(tv.local().begin(), tv.local().end())] {
        if (!on->grad) return;
        const T scale = static_cast<T>(static_cast<double>(std::as_const(*on->grad).local()[0]) /
                                       static_cast<double>(count));
        dual_tensor<L> dx(ln->value.mesh(), ln->value.extents(), dual_tensor<L>::uninitialized);
        const T* px = ln->value.local().data();
        T* pdx = dx.local().data();
        detail::for_each_row(rows, [&](std::size_t row, std::size_t first, auto s) {
          detail::cross_entropy_backward_row(px + first, pdx + first, rows.n, s, lse[row],
                                             static_cast<std::size_t>(picked[row]), scale);
        });
        ln->accumulate(std::move(dx));
      });
    }
    return out;
  }
}

// ---------------------------------------------------------------------------------------
// Reductions (linear: x may be partial).

// The sum over the dims of x not in OutDims (some of x's dims, in x's order): pending on the
// axes that split a summed dim and on x's pending axes, split as x on the kept dims. Its
// gradient repeats the output's gradient over the summed dims.
template <fixed_string OutDims, sharded_tensor X>
auto reduce_sum(const variable<X>& x) {
  if constexpr (!detail::check_real_operand<"reduce_sum", X>()) {
    return 0;
  } else if constexpr (!detail::is_subsequence(view_of<OutDims>, view_of<X::dims>)) {
    (void)autodiff_error::reduce_dims<OutDims, X>{};
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_reduce_sum<OutDims>(x);
  } else {
    using T = typename X::value_type;
    constexpr layout_value out_layout = detail::summed_layout(X::layout, view_of<OutDims>);
    using out_t = basic_tensor<T, typename X::mesh_type, OutDims, out_layout>;
    const X& xv = x.value();
    typename out_t::extents_type extents{};
    for (std::size_t k = 0; k < out_t::rank; ++k) extents[k] = xv.extent(OutDims[k]);
    out_t y(xv.mesh(), extents);
    const detail::broadcast_walk w =
        detail::walk_of(view_of<X::dims>, view_of<OutDims>, xv.local_extents());
    {
      const T* px = xv.local().data();
      T* py = y.local().data();
      detail::for_each_run(w, [&](std::size_t b, std::size_t s, auto step) {
        detail::sum_run(px + b, static_cast<const T*>(nullptr), py + s, w.run, step);
      });
    }
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), w] {
        if (!on->grad) return;
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        const T* dz = std::as_const(*on->grad).local().data();
        T* pdx = dx.local().data();
        detail::for_each_run(w, [&](std::size_t b, std::size_t s, auto step) {
          detail::expand_run(dz + s, pdx + b, w.run, step);
        });
        xn->accumulate(std::move(dx));
      });
    }
    return out;
  }
}

// The mean of all elements, a scalar laid out as sum(x)'s: pending on every axis that splits
// x or is pending in it, replicated on the others.
template <sharded_tensor X>
auto mean(const variable<X>& x) {
  if constexpr (!detail::check_real_operand<"mean", X>()) {
    return 0;
  } else if constexpr (!detail::on_host<X>) {
    return detail::generic_mean(x);
  } else {
    using T = typename X::value_type;
    constexpr layout_value scalar_layout = detail::scalar_sum_layout(X::layout);
    using s_t = basic_tensor<T, typename X::mesh_type, detail::no_dims, scalar_layout>;
    const std::size_t count = x.value().size();
    s_t s(x.value().mesh(), {});
    double total = 0;
    for (T v : x.value().local()) total += static_cast<double>(v);
    s.local()[0] = static_cast<T>(total / static_cast<double>(count));
    auto out = detail::make_result(x.owner(), std::move(s), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), count] {
        if (!on->grad) return;
        dual_tensor<X> g(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        const T seed = static_cast<T>(static_cast<double>(std::as_const(*on->grad).local()[0]) /
                                      static_cast<double>(count));
        for (T& v : g.local()) v = seed;
        xn->accumulate(std::move(g));
      });
    }
    return out;
  }
}

}  // namespace zest::autodiff
