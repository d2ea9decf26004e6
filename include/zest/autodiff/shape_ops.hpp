// zest/autodiff/shape_ops.hpp — slicing, concatenation, gathering, merging and splitting dims.
//
//   auto h = autodiff::narrow<'t'>(x, 2, 5);          // x "btm": t in [2, 7)
//   auto c = autodiff::concat<'m'>(a, b);             // and concat<'m'>(a, b, c, ...)
//   auto g = autodiff::index_select<'t'>(x, ids);     // ids "r" int32_t: x's t = ids[r]
//   auto k = autodiff::merge_dims<"bk">(x3);          // x3 "bsh": k = s * extent(h) + h
//   auto s = autodiff::split_dim<"bsh">(k, 4);        // back: extent(s) = 4
//   auto y = zest::narrow<'t'>(xv, 2, 5);             // the same on plain tensors (no tape)
//
// Each is defined once (zest/autodiff/op.hpp): the layout rule, the checks and the backward
// step here, the loops as the function objects of namespace kernels below, which every backend
// runs (the host backend their host members: contiguous block copies). The tape ops are
// autodiff::custom ops whose backward computes the gradient with the same kernels.
//
// Layouts. Every result has its input's layout (concat: the operands' common layout), at the
// result's extents. The ops are linear, so partial inputs are accepted and stay pending.
//
// Along a dim D that the layout splits, the op first brings x to the layout that keeps D
// whole (x's layout with the axes that split D replicated: an all-gather of D over those
// axes, the redistribute that the two layouts imply), runs locally there, and then takes
// each rank's block of the result (replicated -> split: a local copy, no communication).
// Why not a local slice of each shard: a layout names, for each extent, which block of D each
// rank holds (zest/layout/shard.hpp's block ranges, uneven when the extent does not divide).
// The ranks' pieces of a slice (or of a concatenation, or of a gather) are not those blocks
// for the result's extent: narrow<'t'>(x, 1, 4) of t = 8 split over 2 ranks leaves 3 rows on
// rank 0 and 1 row on rank 1, which no layout describes, and a gather picks rows from every
// rank. Gathering D keeps the result an ordinary tensor of x's layout for any extents, uneven
// ones included; along a whole dim nothing is sent. The backward does the same with the
// gradient: it is gathered along D (in the dual of the whole-D layout), scattered locally, and
// redistributed to the input's gradient layout (again a local pick of each rank's block).
// To avoid the gather, keep D whole: split another dim.
//
// merge_dims and split_dim ("bsh" <-> "bk", k = s * extent(h) + h) keep the storage as it is
// (row-major, so the merged index is the pair's flat index). The axes that split s or h split
// k (s's axes major), and the axes that split k split s. With the dims involved whole nothing
// is sent; split, they are gathered first and each rank keeps its block of the result, for the
// same reason: a rank's block of s, times all of h, is not its block of k when the extents do
// not divide evenly.
//
// Checks. Compile time: D a dim of the tensor; concat's operands of one tensor type; the new
// dims of merge_dims / split_dim the old ones with one adjacent pair merged / one dim split;
// index_select's ids an int32_t tensor of one dim, replicated, on x's mesh. Run time
// (zest::shape_error naming the op, the dim and the extents): a narrow range outside the
// dim, concat operands whose other extents differ, an id outside [0, extent of D) (with its
// position among the ids), a dim that split_dim's outer extent does not divide.
//
// index_select's backward is a deterministic scatter-add without atomics: the ids are
// sorted by row on the host where they are checked (a stable counting sort), and each element
// of the gradient sums its positions in order, as embedding's does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/diagnostics.hpp"
#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/op.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/autodiff/walks.hpp"
#include "zest/backend/backend.hpp"
#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

// ---------------------------------------------------------------------------------------
// Kernels: a local shard seen as [outer][n][inner] around the dim D, which is whole there.

namespace autodiff::kernels {

// y = x[:, start : start + len, :]: one call per element of y ([outer][len][inner]).
template <class T>
struct narrow_copy {
  const T* x;
  T* y;
  std::size_t n, start, len, inner;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t o = i / (len * inner), j = (i / inner) % len, k = i % inner;
    y[i] = x[(o * n + start + j) * inner + k];
  }
  void host(std::size_t count) const {
    const std::size_t block = len * inner;
    if (block == 0) return;
    for (std::size_t o = 0; o < count / block; ++o)
      std::copy_n(x + (o * n + start) * inner, block, y + o * block);
  }
};

// dx = dy placed at [start, start + len) along the dim, zeros elsewhere: one call per element
// of dx ([outer][n][inner]).
template <class T>
struct narrow_pad {
  const T* dy;
  T* dx;
  std::size_t n, start, len, inner;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t o = i / (n * inner), j = (i / inner) % n, k = i % inner;
    dx[i] = (j >= start && j - start < len) ? dy[(o * len + j - start) * inner + k] : T(0);
  }
  void host(std::size_t count) const {
    const std::size_t block = n * inner;
    if (block == 0) return;
    for (std::size_t o = 0; o < count / block; ++o) {
      T* row = dx + o * block;
      std::fill(row, row + start * inner, T(0));
      std::copy_n(dy + o * len * inner, len * inner, row + start * inner);
      std::fill(row + (start + len) * inner, row + block, T(0));
    }
  }
};

// y = the N parts one after the other along the dim: part q covers [offset[q], offset[q + 1]).
// One call per element of y ([outer][offset[N]][inner]).
template <class T, std::size_t N>
struct concat_copy {
  const T* parts[N];
  std::size_t offset[N + 1];
  std::size_t inner;
  T* y;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t n = offset[N];
    const std::size_t o = i / (n * inner), j = (i / inner) % n, k = i % inner;
    std::size_t q = 0;
    while (j >= offset[q + 1]) ++q;
    const std::size_t len = offset[q + 1] - offset[q];
    y[i] = parts[q][(o * len + j - offset[q]) * inner + k];
  }
  void host(std::size_t count) const {
    const std::size_t block = offset[N] * inner;
    if (block == 0) return;
    for (std::size_t o = 0; o < count / block; ++o) {
      for (std::size_t q = 0; q < N; ++q) {
        const std::size_t part = (offset[q + 1] - offset[q]) * inner;
        std::copy_n(parts[q] + o * part, part, y + o * block + offset[q] * inner);
      }
    }
  }
};

// y[o][r][k] = x[o][ids[r]][k] (ids already checked): one call per element of y.
template <class T>
struct index_gather {
  const T* x;
  const std::int32_t* ids;
  T* y;
  std::size_t n, m, inner;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t o = i / (m * inner), r = (i / inner) % m, k = i % inner;
    y[i] = x[(o * n + static_cast<std::size_t>(ids[r])) * inner + k];
  }
  void host(std::size_t count) const {
    if (inner == 0) return;
    for (std::size_t row = 0; row < count / inner; ++row) {
      const std::size_t o = row / m, r = row % m;
      std::copy_n(x + (o * n + static_cast<std::size_t>(ids[r])) * inner, inner, y + row * inner);
    }
  }
};

// dx[o][j][k] = the sum of dy[o][r][k] over the positions r whose id is j, in order: one call
// per element of dx. The positions of j are order[first[j]] .. order[first[j + 1] - 1].
template <class T>
struct index_scatter {
  const T* dy;
  const std::size_t* first;
  const std::size_t* order;
  T* dx;
  std::size_t n, m, inner;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t o = i / (n * inner), j = (i / inner) % n, k = i % inner;
    T total = 0;
    for (std::size_t p = first[j]; p < first[j + 1]; ++p)
      total += dy[(o * m + order[p]) * inner + k];
    dx[i] = total;
  }
};

}  // namespace autodiff::kernels

// ---------------------------------------------------------------------------------------
// Layouts and checks.

namespace autodiff::autodiff_error {
template <fixed_string Operation, class First, class... Rest>
struct concat_operands {
  static_assert(always_false<First>,
                "zest concat: the operands need one tensor type: the same dims, element type, "
                "mesh and layout (operands shown above). Fix: redistribute<layout<...>>(x) the "
                "operands to one layout, and convert them to one element type.");
};
template <fixed_string Operation, class Ids>
struct index_ids {
  static_assert(always_false<Ids>,
                "zest index_select: the ids are a tensor of int32_t with one dim, replicated "
                "(not split, not partial), on x's mesh (ids shown above). Fix: give them one "
                "dim, e.g. tensor<std::int32_t, mesh_t, \"r\">, and redistribute<layout<>>(ids).");
};
template <fixed_string From, fixed_string To>
struct merge_dims_pattern {
  static_assert(always_false<decltype(From)>,
                "zest merge_dims<NewDims>: NewDims must be the tensor's dims with two adjacent "
                "dims written as one new letter, e.g. \"bk\" for \"bsh\" (k = s * extent(h) + "
                "h); both shown above. Fix: keep the other dims and their order.");
};
template <fixed_string From, fixed_string To>
struct split_dim_pattern {
  static_assert(always_false<decltype(From)>,
                "zest split_dim<NewDims>: NewDims must be the tensor's dims with one dim written "
                "as two new letters, outer then inner, e.g. \"bsh\" for \"bk\"; both shown "
                "above. Fix: keep the other dims and their order.");
};
}  // namespace autodiff::autodiff_error

namespace detail {

// `v` with the axes that split dim d replicated: the layout in which every rank holds d whole.
constexpr layout_value whole_along(layout_value v, char d) {
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (v.splits(a, d)) v.axes[a] = axis_placement{};
  }
  return v;
}

// X with dim D whole, and the layout its gradient is scattered in (the dual of X's layout
// with D whole).
template <class X, char D>
struct along_whole {
  static constexpr layout_value layout = whole_along(X::layout, D);
  static constexpr layout_value grad_layout = whole_along(autodiff::dual(X::layout), D);
  using type = typename with_layout_for<X, layout>::type;
  using grad_type = typename with_layout_for<X, grad_layout>::type;
};

template <fixed_string Op, char D, class X>
constexpr bool check_shape_dim() {
  if constexpr (!X::dims.contains(D)) {
    (void)autodiff::autodiff_error::missing_dim<Op, D, X>{};
    return false;
  } else {
    return true;
  }
}

// narrow's range check, in x's global extents.
template <char D, sharded_tensor X>
void check_narrow_range(const X& x, std::size_t start, std::size_t length) {
  const std::size_t n = x.extents()[X::dim_index(D)];
  if (start > n || length > n - start) {
    throw shape_error(message("zest: narrow<'", D, "'>: start ", start, " and length ", length,
                              " leave dim '", D, "' (extent ", n, ") of \"", view_of<X::dims>,
                              "\": the range [start, start + length) must lie in [0, ", n, ")"));
  }
}

// The local narrow of a tensor Z whose dim D is whole on every rank.
template <char D, sharded_tensor Z>
Z narrow_whole(const Z& z, std::size_t start, std::size_t length) {
  using T = typename Z::value_type;
  using B = typename Z::backend_type;
  constexpr std::size_t d = Z::dim_index(D);
  auto extents = z.extents();
  extents[d] = length;
  Z y(z.mesh(), extents, Z::uninitialized);
  const shard_rows r = rows_around(z.local_extents(), d);
  for_each_kernel<B>(y.local_count(),
                     autodiff::kernels::narrow_copy<T>{z.local().data(), y.local().data(), r.n,
                                                       start, length, r.inner});
  return y;
}

// The local concatenation of tensors of type Z whose dim D is whole on every rank.
template <char D, sharded_tensor Z, class... Rest>
Z concat_whole(const Z& first, const Rest&... rest) {
  using T = typename Z::value_type;
  using B = typename Z::backend_type;
  constexpr std::size_t d = Z::dim_index(D);
  constexpr std::size_t n_parts = 1 + sizeof...(Rest);
  const Z* parts[n_parts] = {&first, &rest...};
  autodiff::kernels::concat_copy<T, n_parts> k{};
  auto extents = first.extents();
  k.offset[0] = 0;
  for (std::size_t q = 0; q < n_parts; ++q) {
    const auto& e = parts[q]->extents();
    for (std::size_t i = 0; i < Z::rank; ++i) {
      if (i != d && e[i] != extents[i]) {
        throw shape_error(message("zest: concat<'", D, "'>: operand ", q, " of \"",
                                  view_of<Z::dims>, "\" has extent ", e[i], " along dim '",
                                  Z::dims[i], "', operand 0 has ", extents[i],
                                  ": the operands may differ only along '", D, "'"));
      }
    }
    k.parts[q] = parts[q]->local().data();
    k.offset[q + 1] = k.offset[q] + e[d];
  }
  extents[d] = k.offset[n_parts];
  Z y(first.mesh(), extents, Z::uninitialized);
  k.inner = rows_around(y.local_extents(), d).inner;
  k.y = y.local().data();
  for_each_kernel<B>(y.local_count(), k);
  return y;
}

// index_select's checks: every id in [0, n); the ids on the host.
template <char D, sharded_tensor X, sharded_tensor Ids>
host_vector<std::int32_t> checked_ids(const X& x, const Ids& ids) {
  const std::size_t n = x.extents()[X::dim_index(D)];
  auto host = ids.local_to_host();
  for (std::size_t p = 0; p < host.size(); ++p) {
    const std::int32_t id = host[p];
    if (id < 0 || static_cast<std::size_t>(id) >= n) {
      throw shape_error(message("zest: index_select<'", D, "'>: id ", id, " at position ", p,
                                " of the ids \"", view_of<Ids::dims>, "\" is outside [0, ", n,
                                "), the extent of dim '", D, "' of \"", view_of<X::dims>, "\""));
    }
  }
  return host;
}

template <char D, sharded_tensor Z, sharded_tensor Ids>
Z index_select_whole(const Z& z, const Ids& ids, std::size_t count) {
  using T = typename Z::value_type;
  using B = typename Z::backend_type;
  constexpr std::size_t d = Z::dim_index(D);
  auto extents = z.extents();
  extents[d] = count;
  Z y(z.mesh(), extents, Z::uninitialized);
  const shard_rows r = rows_around(z.local_extents(), d);
  for_each_kernel<B>(y.local_count(),
                     autodiff::kernels::index_gather<T>{z.local().data(), ids.local().data(),
                                                        y.local().data(), r.n, count, r.inner});
  return y;
}

template <fixed_string Op, class X, class Ids>
constexpr bool check_ids() {
  if constexpr (!std::is_same_v<typename Ids::value_type, std::int32_t> || Ids::rank != 1 ||
                !Ids::layout.all_replicate() ||
                !std::is_same_v<typename Ids::mesh_type, typename X::mesh_type>) {
    (void)autodiff::autodiff_error::index_ids<Op, Ids>{};
    return false;
  } else {
    return true;
  }
}

// merge_dims<To> of From: the position p at which From's dims p and p + 1 became To's dim p,
// or npos when To is not From so merged.
template <fixed_string From, fixed_string To>
constexpr std::size_t merged_at() {
  if (To.size() + 1 != From.size()) return std::string_view::npos;
  for (std::size_t p = 0; p < To.size(); ++p) {
    bool same = true;
    for (std::size_t i = 0; i < p; ++i) same = same && To[i] == From[i];
    for (std::size_t i = p + 1; i < To.size(); ++i) same = same && To[i] == From[i + 1];
    // The merged dim's letter is a new one: "bs" for "bts" could read (b t) -> b or
    // (t s) -> s, so a letter of the unmerged dims is refused rather than one reading picked.
    if (same && !From.contains(To[p])) return p;
  }
  return std::string_view::npos;
}

// The layout of the merged tensor: the axes that split From[p] or From[p + 1] split the new
// dim, outer dim's axes major.
template <fixed_string From, fixed_string To>
constexpr layout_value merged_layout(layout_value v) {
  constexpr std::size_t p = merged_at<From, To>();
  const std::size_t outer_splits = v.split_count(From[p]);
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (v.splits(a, From[p])) {
      v.axes[a].dim = To[p];
    } else if (v.splits(a, From[p + 1])) {
      v.axes[a].dim = To[p];
      v.axes[a].order = static_cast<std::uint8_t>(v.axes[a].order + outer_splits);
    }
  }
  return v;
}

template <class X, fixed_string To>
struct merged {
  static constexpr std::size_t p = merged_at<X::dims, To>();
  static constexpr layout_value whole =
      whole_along(whole_along(X::layout, X::dims[p]), X::dims[p + 1]);
  static constexpr layout_value layout = merged_layout<X::dims, To>(X::layout);
  static constexpr layout_value grad_whole = whole_along(autodiff::dual(layout), To[p]);
  using whole_type = basic_tensor<typename X::value_type, typename X::mesh_type, To, whole>;
  using type = basic_tensor<typename X::value_type, typename X::mesh_type, To, layout>;
  using grad_type =
      basic_tensor<typename X::value_type, typename X::mesh_type, X::dims, grad_whole>;
};

// The same storage under other dims and extents (the layouts keep the changed dims whole).
template <class Z, sharded_tensor Y>
Z reinterpret(Y&& y, const typename Z::extents_type& extents) {
  if constexpr (!std::is_lvalue_reference_v<Y> && !std::is_const_v<std::remove_reference_t<Y>>) {
    return Z(y.mesh(), extents, std::move(y.storage()));
  } else {
    return Z(y.mesh(), extents, typename Z::storage_type(y.storage()));
  }
}

// split_dim<To> of From: the position p whose dim became To's dims p and p + 1, or npos.
template <fixed_string From, fixed_string To>
constexpr std::size_t split_at() {
  return merged_at<To, From>();
}

template <class X, fixed_string To>
struct unmerged {
  static constexpr std::size_t p = split_at<X::dims, To>();
  static constexpr layout_value whole = whole_along(X::layout, X::dims[p]);
  // The axes that split the dim split its outer part.
  static constexpr layout_value layout = [] {
    layout_value v = X::layout;
    for (std::size_t a = 0; a < v.axis_count; ++a) {
      if (v.splits(a, X::dims[p])) v.axes[a].dim = To[p];
    }
    return v;
  }();
  static constexpr layout_value grad_whole =
      whole_along(whole_along(autodiff::dual(layout), To[p]), To[p + 1]);
  using whole_type = basic_tensor<typename X::value_type, typename X::mesh_type, To, whole>;
  using type = basic_tensor<typename X::value_type, typename X::mesh_type, To, layout>;
  using grad_type =
      basic_tensor<typename X::value_type, typename X::mesh_type, X::dims, grad_whole>;
};

template <fixed_string To, sharded_tensor X>
typename unmerged<X, To>::type::extents_type split_extents(const X& x, std::size_t outer) {
  constexpr std::size_t p = unmerged<X, To>::p;
  const std::size_t n = x.extents()[p];
  if (outer == 0 || n % outer != 0) {
    throw shape_error(message("zest: split_dim<\"", view_of<To>, "\">: dim '", X::dims[p],
                              "' of \"", view_of<X::dims>, "\" has extent ", n,
                              ", not a multiple of ", outer, ", the extent given for '", To[p],
                              "'"));
  }
  typename unmerged<X, To>::type::extents_type e{};
  for (std::size_t i = 0; i < p; ++i) e[i] = x.extents()[i];
  e[p] = outer;
  e[p + 1] = n / outer;
  for (std::size_t i = p + 1; i < X::rank; ++i) e[i + 1] = x.extents()[i];
  return e;
}

template <fixed_string To, sharded_tensor X>
typename merged<X, To>::type::extents_type merge_extents(const X& x) {
  constexpr std::size_t p = merged<X, To>::p;
  typename merged<X, To>::type::extents_type e{};
  for (std::size_t i = 0; i < p; ++i) e[i] = x.extents()[i];
  e[p] = x.extents()[p] * x.extents()[p + 1];
  for (std::size_t i = p + 1; i < To.size(); ++i) e[i] = x.extents()[i + 1];
  return e;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// On plain tensors.

// x's elements with index in [start, start + length) along D; x's layout (see the top).
template <char D, sharded_tensor X>
auto narrow(const X& x, std::size_t start, std::size_t length) {
  if constexpr (!detail::check_shape_dim<"narrow", D, X>()) {
    return 0;
  } else {
    using W = detail::along_whole<X, D>;
    detail::check_narrow_range<D>(x, start, length);
    return redistribute_to<X::layout>(
        detail::narrow_whole<D>(zest::at_layout<W::layout>(x), start, length));
  }
}

// The operands one after the other along D; one tensor type, the other extents equal.
template <char D, sharded_tensor X, sharded_tensor... Rest>
auto concat(const X& first, const Rest&... rest) {
  if constexpr (!detail::check_shape_dim<"concat", D, X>()) {
    return 0;
  } else if constexpr (!(std::is_same_v<X, Rest> && ...)) {
    (void)autodiff::autodiff_error::concat_operands<"concat", X, Rest...>{};
    return 0;
  } else {
    using W = detail::along_whole<X, D>;
    return redistribute_to<X::layout>(detail::concat_whole<D>(zest::at_layout<W::layout>(first),
                                                              zest::at_layout<W::layout>(rest)...));
  }
}

// y[..., r, ...] = x[..., ids[r], ...] along D; ids int32_t, one dim, replicated.
template <char D, sharded_tensor X, sharded_tensor Ids>
auto index_select(const X& x, const Ids& ids) {
  if constexpr (!detail::check_shape_dim<"index_select", D, X>()) {
    return 0;
  } else if constexpr (!detail::check_ids<"index_select", X, Ids>()) {
    return 0;
  } else {
    using W = detail::along_whole<X, D>;
    const auto host = detail::checked_ids<D>(x, ids);
    return redistribute_to<X::layout>(
        detail::index_select_whole<D>(zest::at_layout<W::layout>(x), ids, host.size()));
  }
}

// Two adjacent dims as one: merge_dims<"bk">(x "bsh") has k = s * extent(h) + h (the storage
// unchanged, row-major). The axes that split s or h split k (s's major); with s and h whole
// nothing moves, else they are gathered first and each rank keeps its block of k.
template <fixed_string To, sharded_tensor X>
auto merge_dims(const X& x) {
  if constexpr (detail::merged_at<X::dims, To>() == std::string_view::npos) {
    (void)autodiff::autodiff_error::merge_dims_pattern<X::dims, To>{};
    return 0;
  } else {
    using Mg = detail::merged<X, To>;
    return redistribute_to<Mg::layout>(detail::reinterpret<typename Mg::whole_type>(
        zest::at_layout<Mg::whole>(x), detail::merge_extents<To>(x)));
  }
}

// One dim as two, outer then inner: split_dim<"bsh">(x "bk", s) with extent(k) = s * extent(h).
// The axes that split k split s; with k whole nothing moves, else k is gathered first.
template <fixed_string To, sharded_tensor X>
auto split_dim(const X& x, std::size_t outer) {
  if constexpr (detail::split_at<X::dims, To>() == std::string_view::npos) {
    (void)autodiff::autodiff_error::split_dim_pattern<X::dims, To>{};
    return 0;
  } else {
    using Sp = detail::unmerged<X, To>;
    const auto extents = detail::split_extents<To>(x, outer);
    return redistribute_to<Sp::layout>(
        detail::reinterpret<typename Sp::whole_type>(zest::at_layout<Sp::whole>(x), extents));
  }
}

// ---------------------------------------------------------------------------------------
// On the tape.

namespace autodiff {

// narrow<D>(x, start, length) recorded: its backward places the gradient at [start, start +
// length) along D in zeros of x's shape.
template <char D, sharded_tensor X>
auto narrow(const variable<X>& x, std::size_t start, std::size_t length) {
  if constexpr (!zest::detail::check_shape_dim<"narrow", D, X>()) {
    return 0;
  } else {
    using W = zest::detail::along_whole<X, D>;
    using G = typename W::grad_type;
    return custom<"narrow">(
        zest::narrow<D>(x.value(), start, length),
        [start, length](const auto& dy, const auto&, const X& xv) {
          using T = typename X::value_type;
          using B = typename X::backend_type;
          decltype(auto) dyw = zest::at_layout<W::grad_layout>(dy);
          G dx(xv.mesh(), xv.extents(), G::uninitialized);
          const shard_rows r = rows_around(dx.local_extents(), X::dim_index(D));
          for_each_kernel<B>(dx.local_count(),
                             kernels::narrow_pad<T>{dyw.local().data(), dx.local().data(), r.n,
                                                    start, length, r.inner});
          return dx;
        },
        x);
  }
}

// concat<D>(a, b, ...) recorded: each operand's gradient is its range of the result's.
template <char D, sharded_tensor X, sharded_tensor... Rest>
auto concat(const variable<X>& first, const variable<Rest>&... rest) {
  if constexpr (!zest::detail::check_shape_dim<"concat", D, X>()) {
    return 0;
  } else if constexpr (!(std::is_same_v<X, Rest> && ...)) {
    (void)autodiff_error::concat_operands<"concat", X, Rest...>{};
    return 0;
  } else {
    using W = zest::detail::along_whole<X, D>;
    return custom<"concat">(
        zest::concat<D>(first.value(), rest.value()...),
        [](const auto& dy, const auto&, const X& x0, const Rest&... xs) {
          decltype(auto) dyw = zest::at_layout<W::grad_layout>(dy);
          constexpr std::size_t d = X::dim_index(D);
          std::size_t start = 0;
          auto piece = [&](const auto& x) {
            const std::size_t len = x.extents()[d];
            auto g = zest::detail::narrow_whole<D>(dyw, start, len);
            start += len;
            return g;
          };
          // Braced initialisation evaluates the pieces in order.
          return std::tuple{piece(x0), piece(xs)...};
        },
        first, rest...);
  }
}

// index_select<D>(x, ids) recorded: x's gradient adds each position's gradient into its row
// (a deterministic scatter-add, see the top).
template <char D, sharded_tensor X, sharded_tensor Ids>
auto index_select(const variable<X>& x, const Ids& ids) {
  if constexpr (!zest::detail::check_shape_dim<"index_select", D, X>()) {
    return 0;
  } else if constexpr (!zest::detail::check_ids<"index_select", X, Ids>()) {
    return 0;
  } else {
    using B = typename X::backend_type;
    using W = zest::detail::along_whole<X, D>;
    using G = typename W::grad_type;
    const X& xv = x.value();
    const auto checked = zest::detail::checked_ids<D>(xv, ids);
    const std::size_t n = xv.extents()[X::dim_index(D)], m = checked.size();
    auto y = redistribute_to<X::layout>(
        zest::detail::index_select_whole<D>(zest::at_layout<W::layout>(xv), ids, m));
    // For the gradient: the positions of each row of x, in order (a stable counting sort of
    // the checked ids), on the backend.
    struct row_lists {
      typename B::template buffer<std::size_t> first, order;
    };
    std::shared_ptr<row_lists> lists;
    if (x.requires_grad()) {
      std::vector<std::size_t> first(n + 1, 0), order(m);
      for (const std::int32_t id : checked) ++first[static_cast<std::size_t>(id) + 1];
      for (std::size_t j = 0; j < n; ++j) first[j + 1] += first[j];
      std::vector<std::size_t> next(first.begin(), first.end() - 1);
      for (std::size_t p = 0; p < m; ++p) order[next[static_cast<std::size_t>(checked[p])]++] = p;
      lists = std::make_shared<row_lists>(
          row_lists{B::template from_host<std::size_t>(std::span<const std::size_t>(first)),
                    B::template from_host<std::size_t>(std::span<const std::size_t>(order))});
    }
    return custom<"index_select">(
        std::move(y),
        [lists, m](const auto& dy, const auto&, const X& xv) {
          using T = typename X::value_type;
          decltype(auto) dyw = zest::at_layout<W::grad_layout>(dy);
          G dx(xv.mesh(), xv.extents(), G::uninitialized);
          const shard_rows r = rows_around(dx.local_extents(), X::dim_index(D));
          for_each_kernel<B>(
              dx.local_count(),
              kernels::index_scatter<T>{dyw.local().data(), lists->first.data(),
                                        lists->order.data(), dx.local().data(), r.n, m, r.inner});
          return dx;
        },
        x);
  }
}

// merge_dims<To>(x) recorded: the gradient is split back (the storage unchanged).
template <fixed_string To, sharded_tensor X>
auto merge_dims(const variable<X>& x) {
  if constexpr (zest::detail::merged_at<X::dims, To>() == std::string_view::npos) {
    (void)autodiff_error::merge_dims_pattern<X::dims, To>{};
    return 0;
  } else {
    using Mg = zest::detail::merged<X, To>;
    return custom<"merge_dims">(
        zest::merge_dims<To>(x.value()),
        [](const auto& dy, const auto&, const X& xv) {
          return zest::detail::reinterpret<typename Mg::grad_type>(
              zest::at_layout<Mg::grad_whole>(dy), xv.extents());
        },
        x);
  }
}

// split_dim<To>(x, outer) recorded: the gradient is merged back.
template <fixed_string To, sharded_tensor X>
auto split_dim(const variable<X>& x, std::size_t outer) {
  if constexpr (zest::detail::split_at<X::dims, To>() == std::string_view::npos) {
    (void)autodiff_error::split_dim_pattern<X::dims, To>{};
    return 0;
  } else {
    using Sp = zest::detail::unmerged<X, To>;
    return custom<"split_dim">(
        zest::split_dim<To>(x.value(), outer),
        [](const auto& dy, const auto&, const X& xv) {
          return zest::detail::reinterpret<typename Sp::grad_type>(
              zest::at_layout<Sp::grad_whole>(dy), xv.extents());
        },
        x);
  }
}

}  // namespace autodiff

}  // namespace zest
