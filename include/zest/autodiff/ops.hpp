// zest/autodiff/ops.hpp — nonlinear, broadcasting and row operations of the tape.
//
//   auto h = autodiff::broadcast_add(x, bias);              // "btm" + "m"
//   auto a = autodiff::gelu(h);                             // and exp, silu, ... (elementwise.hpp)
//   auto p = autodiff::causal_softmax<'q', 'k'>(scores);    // "bhqk": mask and softmax, one pass
//   auto n = autodiff::layer_norm<'m'>(x, gamma, beta);     // or rms_norm<'m'>(x, gamma)
//   auto e = autodiff::embedding<"btm">(ids, wte);          // ids "bt" int32_t, wte "vm"
//   auto loss = autodiff::cross_entropy<'v'>(logits, targets);
//
// Like tape.hpp's operations, each computes its value on the local shard and records one
// backward step; a gradient reaches its input in the dual of the input's layout. Each is
// defined once (zest/autodiff/op.hpp): its layout rule, checks and backward step here, its
// loops as the function objects of zest/autodiff/kernels.hpp, which every backend runs (the
// host backend their Eigen members where they have one).
//
// Layouts. A nonlinear operation needs whole values (f(a + b) is not f(a) + f(b)), so its
// operands may not be partial; the result keeps the operand's layout. An operation along a
// dim (softmax, layer_norm, rms_norm, variance, cross_entropy) needs that dim whole on every
// rank. A small operand that meets a large one (a bias, layer_norm's gain, an embedding table)
// is used in the layout that splits its dims as the large one does; its gradient, a local sum
// over the dims it lacks, is then pending on the axes that split those dims:
//
//   x "btm" split(b:dp) + bias "m" replicated   ->  bias gradient partial(dp), no collective
//   reduce_sum<"m">(x "btm" split(b:dp))        ->  "m" partial(dp)
//   mean<'m'>(x "btm" split(m:tp))              ->  "bt" partial(tp): a sum is linear
//   cross_entropy<'v'>(logits "btv" split(b:dp)) ->  scalar partial(dp)
//
// Kernels see a local shard as [outer][n][inner] around the dim they work along (row-major),
// so a row is n elements `inner` apart.
//
// Run-time checks (extents, ids, targets, p) throw zest::shape_error. Ids and targets are
// checked on the local shard (copied to the host), so with split ids only the ranks that hold
// a bad one throw.
#pragma once

#include <algorithm>
#include <cmath>
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
#include "zest/autodiff/elementwise.hpp"
#include "zest/autodiff/kernels.hpp"
#include "zest/autodiff/op.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/autodiff/walks.hpp"
#include "zest/backend/backend.hpp"
#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/random.hpp"
#include "zest/core/source_site.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

namespace detail {

// Terms per partial sum of a two-pass sum over many rows: all of them on a backend that runs
// host loops (their host members add whole rows, vectorised along the row), kernels::sum_chunk
// elsewhere (a GPU then runs chunks x columns calls, not columns).
template <class B>
std::size_t sum_chunk_of(std::size_t terms) {
  if constexpr (zest::detail::runs_host_loops<B>()) {
    return std::max<std::size_t>(terms, 1);
  } else {
    return kernels::sum_chunk;
  }
}

// small = the sums of kernels::broadcast_sum: one pass, or two (chunks of terms, then the
// chunks in order) when each small element sums more terms than a chunk.
template <class B, class T>
void run_broadcast_sum(const T* big, const T* weight, T* small, std::size_t smalls,
                       const kernels::broadcast_map& map) {
  const std::size_t chunk = sum_chunk_of<B>(map.absent_count);
  if (map.absent_count <= chunk) {
    for_each_kernel<B>(smalls, kernels::broadcast_sum<T>{big, weight, small, map});
    return;
  }
  const std::size_t chunks = (map.absent_count + chunk - 1) / chunk;
  typename B::template buffer<T> partial(chunks * smalls);
  for_each_kernel<B>(chunks * smalls,
                     kernels::broadcast_sum<T>{big, weight, partial.data(), map, chunk, smalls});
  for_each_kernel<B>(smalls, kernels::add_chunks<T>{partial.data(), small, smalls, chunks});
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

// x (+ or *) y, y broadcast over the dims it lacks.
template <fixed_string Op, bool Multiply, sharded_tensor X, sharded_tensor Y>
variable<X> broadcast_apply(const variable<X>& x, const variable<Y>& y) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  constexpr layout_value y_at = splits_of(X::layout, view_of<Y::dims>);
  using y_grad_t =
      typename zest::with_layout_for<Y, dual(y_at)>::type;  // pending where x's extra dims split
  check_extents<Op>(x.value(), y.value(), "x", "y");
  const X& xv = x.value();
  constexpr bool moved = Y::layout != y_at;  // y used through a copy in layout y_at
  decltype(auto) yu = at_layout<y_at>(y.value());
  const kernels::broadcast_map map =
      broadcast_map_of(walk_of(view_of<X::dims>, view_of<Y::dims>, xv.local_extents()));
  X z(xv.mesh(), xv.extents(), X::uninitialized);
  for_each_kernel<B>(z.local_count(),
                     kernels::broadcast_combine<T, Multiply>{xv.local().data(), yu.local().data(),
                                                             z.local().data(), map});
  auto out = make_result(x.owner(), std::move(z), x.requires_grad() || y.requires_grad());
  if (!out.requires_grad()) return out;
  // y as used, for the product's gradient of x: y's own node unless it was moved.
  auto y_used = detail::keep_if < Multiply && moved > (std::move(yu));
  x.owner().record(
      [xn = x.node(), yn = y.node(), on = out.node(), map, y_used = std::move(y_used)] {
        (void)y_used;  // used in one branch of an if constexpr only
        if (!on->grad) return;
        const T* dz = std::as_const(*on->grad).local().data();
        if (yn->requires_grad) {  // first: x's gradient may take dz over
          y_grad_t dy(yn->value.mesh(), yn->value.extents(), y_grad_t::uninitialized);
          const T* weight = Multiply ? std::as_const(xn->value).local().data() : nullptr;
          run_broadcast_sum<B>(dz, weight, dy.local().data(), dy.local_count(), map);
          yn->accumulate(redistribute_to<dual(Y::layout)>(std::move(dy)));
        }
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
            for_each_kernel<B>(dx.local_count(),
                               kernels::broadcast_combine<T, true>{dz, py, dx.local().data(), map});
            xn->accumulate(std::move(dx));
          } else {
            pass_gradient(*xn, on, true);
          }
        }
      });
  return out;
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
  for_each_kernel<typename In::backend_type>(
      out.local_count(), kernels::dropout_apply<T>{
                             in.local().data(), out.local().data(),
                             global_index_of(in.extents(), in.local_extents(), in.local_offsets()),
                             mask.key, mask.threshold, scale});
}

// A normalisation along D of x with a 1-D parameter G along D.
template <fixed_string Op, char D, class X, class G>
constexpr bool check_norm() {
  if constexpr (!check_operand<Op, X>()) {
    return false;
  } else if constexpr (!check_whole_dim<Op, D, X>()) {
    return false;
  } else if constexpr (!check_same_kind<Op, X, G>()) {
    return false;
  } else if constexpr (G::rank != 1 || G::dims[0] != D) {
    (void)autodiff_error::norm_parameter<D, G>{};
    return false;
  } else {
    return true;
  }
}

// Dims without dim D.
template <fixed_string Dims, char D>
constexpr auto without_dim() {
  fixed_string<Dims.size()> out;
  std::size_t k = 0;
  for (std::size_t i = 0; i < Dims.size(); ++i) {
    if (Dims[i] != D) out.set(k++, Dims[i]);
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
  } else {
    return detail::broadcast_apply<"broadcast_multiply", true>(x, y);
  }
}

// ---------------------------------------------------------------------------------------
// Elementwise.

// GPT-2's gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Any layout but partial.
template <sharded_tensor X>
auto gelu(const variable<X>& x) {
  return unary<"gelu">(x, kernels::gelu_fn{});
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

// Softmax along D (any dim, whole on every rank; x not partial). Entries of -infinity
// (masked) get 0; a row of only -infinity is not expected.
template <char D, sharded_tensor X>
auto softmax(const variable<X>& x) {
  return rowwise<D, "softmax">(x, kernels::softmax_fn<false>{});
}

// log(softmax(x)) along D, computed stably (x - max - log(sum(exp(x - max)))).
template <char D, sharded_tensor X>
auto log_softmax(const variable<X>& x) {
  return rowwise<D, "log_softmax">(x, kernels::softmax_fn<true>{});
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
  } else {
    using T = typename X::value_type;
    using B = typename X::backend_type;
    const X& xv = x.value();
    X y(xv.mesh(), xv.extents(), X::uninitialized);
    const shard_rows walk = rows_around(xv.local_extents(), X::dim_index(K));
    const kernels::causal_window window = detail::causal_window_of<K, Q, K>(xv);
    const std::size_t count = walk.count();
    for_each_kernel<B>(
        count, kernels::causal_mask_rows<T>{xv.local().data(), y.local().data(), walk, window,
                                            detail::minus_infinity<T>});
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), count, walk, window] {
        if (!on->grad) return;
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        for_each_kernel<B>(count,
                           kernels::causal_mask_rows<T>{std::as_const(*on->grad).local().data(),
                                                        dx.local().data(), walk, window, T(0)});
        xn->accumulate(std::move(dx));
      });
    }
    return out;
  }
}

namespace detail {
// causal_softmax's operand checks, shared by its forms with and without a mask.
template <char Q, char K, char D, class X>
constexpr bool check_causal() {
  if constexpr (!check_operand<"causal_softmax", X>()) {
    return false;
  } else if constexpr (!X::dims.contains(Q)) {
    (void)autodiff_error::missing_dim<"causal_softmax", Q, X>{};
    return false;
  } else if constexpr (!X::dims.contains(K)) {
    (void)autodiff_error::missing_dim<"causal_softmax", K, X>{};
    return false;
  } else if constexpr (Q == K || (D != Q && D != K)) {
    (void)autodiff_error::causal_dims<Q, K, D, X>{};
    return false;
  } else {
    return check_whole_dim<"causal_softmax", D, X>();
  }
}
}  // namespace detail

// softmax<D>(causal_mask<Q, K>(x)) in one pass, without the -infinity tensor: the attention
// weights of scores "bhqk" are causal_softmax<'q', 'k'>(scores). D (K or Q) must be whole.
template <char Q, char K, char D = K, sharded_tensor X>
auto causal_softmax(const variable<X>& x) {
  if constexpr (!detail::check_causal<Q, K, D, X>()) {
    return 0;
  } else {
    return detail::rows_op<D, Q, K>(x, kernels::softmax_fn<false>{});
  }
}

namespace autodiff_error {
template <class Mask, class X>
struct softmax_mask {
  static_assert(always_false<Mask>,
                "zest autodiff masked_softmax: the mask needs arithmetic elements (nonzero "
                "keeps an entry), x's mesh, no partial axis, and dims that are some of x's in "
                "x's order (mask and x shown above). Fix: e.g. a tensor<std::uint8_t, Mesh, "
                "\"ts\"> for scores \"bhts\"; it is broadcast over the dims it lacks.");
};
}  // namespace autodiff_error

namespace detail {

template <fixed_string Op, class X, class M>
constexpr bool check_softmax_mask() {
  if constexpr (!std::is_arithmetic_v<typename M::value_type> ||
                !std::is_same_v<typename M::mesh_type, typename X::mesh_type> ||
                M::layout.any_partial() || !is_subsequence(view_of<M::dims>, view_of<X::dims>)) {
    (void)autodiff_error::softmax_mask<M, X>{};
    return false;
  } else {
    return true;
  }
}

// Softmax along D over the entries that the mask (and, with Q != 0, the causal window of the
// pair Q, K) keeps. The mask is used split as x splits its dims (a local slice of a
// replicated mask) and read through a broadcast map; the backward is softmax's.
template <fixed_string Op, char D, char Q, char K, sharded_tensor X, sharded_tensor M>
variable<X> masked_rows_op(const variable<X>& x, const M& mask) {
  using T = typename X::value_type;
  using C = typename M::value_type;
  using B = typename X::backend_type;
  constexpr layout_value mask_at = splits_of(X::layout, view_of<M::dims>);
  const X& xv = x.value();
  check_extents<Op>(xv, mask, "x", "mask");
  decltype(auto) mu = at_layout<mask_at>(mask);
  const kernels::broadcast_map map =
      broadcast_map_of(walk_of(view_of<X::dims>, view_of<M::dims>, xv.local_extents()));
  const shard_rows rows = rows_around(xv.local_extents(), X::dim_index(D));
  const shard_rows walk = rows;
  kernels::causal_window window;
  window.n = rows.n;
  if constexpr (Q != 0) window = causal_window_of<D, Q, K>(xv);
  X y(xv.mesh(), xv.extents(), X::uninitialized);
  for_each_kernel<B>(rows.count(),
                     kernels::masked_softmax_rows<T, C>{xv.local().data(), mu.local().data(),
                                                        y.local().data(), walk, window, map});
  auto out = make_result(x.owner(), std::move(y), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), count = rows.count(), walk] {
      if (!on->grad) return;
      dual_tensor<X> dx(on->value.mesh(), on->value.extents(), dual_tensor<X>::uninitialized);
      for_each_kernel<B>(count, kernels::row_backward<T, kernels::softmax_fn<false>>{
                                    std::as_const(xn->value).local().data(),
                                    std::as_const(on->value).local().data(),
                                    std::as_const(*on->grad).local().data(), dx.local().data(),
                                    walk, kernels::softmax_fn<false>{}});
      xn->accumulate(std::move(dx));
    });
  }
  return out;
}

}  // namespace detail

// Softmax along D (whole; x not partial) over the entries where `mask` is nonzero; the others
// get 0, and a row the mask drops whole is all zeros (not NaN). The mask is a plain tensor
// (any arithmetic element type, not partial, on x's mesh) whose dims are some of x's in x's
// order, broadcast over the others: "ts" for scores "bhts", "bts" for a per-sequence padding
// mask. Its extents must equal x's on its dims (zest::shape_error otherwise). The gradient is
// softmax's, 0 at the dropped entries.
template <char D, sharded_tensor X, sharded_tensor M>
auto masked_softmax(const variable<X>& x, const M& mask) {
  if constexpr (!detail::check_operand<"masked_softmax", X>()) {
    return 0;
  } else if constexpr (!detail::check_whole_dim<"masked_softmax", D, X>()) {
    return 0;
  } else if constexpr (!detail::check_softmax_mask<"masked_softmax", X, M>()) {
    return 0;
  } else {
    return detail::masked_rows_op<"masked_softmax", D, 0, 0>(x, mask);
  }
}

// causal_softmax<Q, K, D>(x) over the entries the mask also keeps (masked_softmax's mask): an
// entry counts where global K <= global Q and the mask is nonzero; a row with none is zeros.
template <char Q, char K, char D = K, sharded_tensor X, sharded_tensor M>
auto causal_softmax(const variable<X>& x, const M& mask) {
  if constexpr (!detail::check_causal<Q, K, D, X>()) {
    return 0;
  } else if constexpr (!detail::check_softmax_mask<"causal_softmax", X, M>()) {
    return 0;
  } else {
    return detail::masked_rows_op<"causal_softmax", D, Q, K>(x, mask);
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
  if constexpr (!detail::check_norm<"layer_norm", D, X, G>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using B = typename X::backend_type;
    constexpr layout_value whole = detail::whole_layout<typename X::mesh_type>;
    static constexpr layout_value pending = dual(whole);  // sums over rows, pending on every axis
    using param_grad_t = typename zest::with_layout_for<G, pending>::type;
    detail::check_extents<"layer_norm">(x.value(), gamma.value(), "x", "gamma");
    detail::check_extents<"layer_norm">(x.value(), beta.value(), "x", "beta");
    const X& xv = x.value();
    const auto& gv = zest::at_layout<whole>(gamma.value());
    const auto& bv = zest::at_layout<whole>(beta.value());
    const shard_rows rows = rows_around(xv.local_extents(), X::dim_index(D));
    const shard_rows walk = rows;
    typename B::template buffer<T> row_mean(rows.count()), row_rstd(rows.count());
    X y(xv.mesh(), xv.extents(), X::uninitialized);
    for_each_kernel<B>(
        rows.count(), kernels::layer_norm_rows<T>{
                          xv.local().data(), gv.local().data(), bv.local().data(), y.local().data(),
                          row_mean.data(), row_rstd.data(), walk, static_cast<T>(eps)});
    const bool params = gamma.requires_grad() || beta.requires_grad();
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad() || params);
    if (!out.requires_grad()) return out;
    x.owner().record([xn = x.node(), gn = gamma.node(), bn = beta.node(), on = out.node(), rows,
                      walk, row_mean = std::move(row_mean), row_rstd = std::move(row_rstd)] {
      if (!on->grad) return;
      const T* px = std::as_const(xn->value).local().data();
      const T* dz = std::as_const(*on->grad).local().data();
      if (xn->requires_grad) {
        const auto& gv = zest::at_layout<detail::whole_layout<typename X::mesh_type>>(gn->value);
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        for_each_kernel<B>(rows.count(), kernels::layer_norm_backward_rows<T>{
                                             px, dz, gv.local().data(), row_mean.data(),
                                             row_rstd.data(), dx.local().data(), walk});
        xn->accumulate(std::move(dx));
      }
      if (gn->requires_grad || bn->requires_grad) {
        param_grad_t dgamma(gn->value.mesh(), gn->value.extents(), param_grad_t::uninitialized);
        param_grad_t dbeta(bn->value.mesh(), bn->value.extents(), param_grad_t::uninitialized);
        // One pass over all rows per column, or chunks of rows first where the backend wants.
        const std::size_t n = rows.n, count = rows.count();
        const std::size_t chunk = detail::sum_chunk_of<B>(count);
        const std::size_t chunks = std::max<std::size_t>(1, (count + chunk - 1) / chunk);
        if (chunks == 1) {
          for_each_kernel<B>(n, kernels::layer_norm_parameter_grads<T>{
                                    px, dz, row_mean.data(), row_rstd.data(), dgamma.local().data(),
                                    dbeta.local().data(), walk, count, n, chunk});
        } else {
          typename B::template buffer<T> pg(chunks * n), pb(chunks * n);
          for_each_kernel<B>(chunks * n, kernels::layer_norm_parameter_grads<T>{
                                             px, dz, row_mean.data(), row_rstd.data(), pg.data(),
                                             pb.data(), walk, count, n, chunk});
          for_each_kernel<B>(n,
                             kernels::add_chunks<T>{pg.data(), dgamma.local().data(), n, chunks});
          for_each_kernel<B>(n, kernels::add_chunks<T>{pb.data(), dbeta.local().data(), n, chunks});
        }
        if (gn->requires_grad) gn->accumulate(redistribute_to<dual(G::layout)>(std::move(dgamma)));
        if (bn->requires_grad) bn->accumulate(redistribute_to<dual(G::layout)>(std::move(dbeta)));
      }
    });
    return out;
  }
}

// ---------------------------------------------------------------------------------------
// Lookups and the loss.

// Rows of `table` (dims rows then features, e.g. "vm") picked by int32_t `ids` (a plain tensor,
// dims e.g. "bt", not partial): the result has dims OutDims = ids' dims + the feature dim,
// split as the ids are on their dims and as the table is on the feature dim (an axis both
// use goes to the ids; the table is gathered on it). The table is not partial. Its rows may
// be split over axes that do not split the ids (a vocabulary-parallel table, Megatron's
// embedding): each rank then looks up the ids its block of rows holds, zeros for the others,
// and the result is pending on those axes; one reduction (all-reduce, or reduce-scatter into
// a sequence-split layout) gives the rows. The gradient adds each output row into its table
// row; it is pending on the axes that split the ids. An id outside [0, rows) throws
// zest::shape_error.
//
//   ids "bt" split(b:dp), table "vm" split(v:tp)  ->  "btm" split(b:dp) partial(tp)
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
  } else if constexpr (!detail::embedding_dims_ok<OutDims, Ids, Table>()) {
    (void)autodiff_error::embedding_dims<OutDims, Ids, Table>{};
    return 0;
  } else {
    using T = typename Table::value_type;
    using B = typename Table::backend_type;
    constexpr char feature = Table::dims[1];
    constexpr layout_value table_at = detail::release_axes(Table::layout, Ids::layout);
    constexpr layout_value out_layout =
        detail::embedding_layout(Ids::layout, table_at, Table::dims[0], feature);
    using out_t = basic_tensor<T, typename Table::mesh_type, OutDims, out_layout>;
    using grad_at_t = typename zest::with_layout_for<Table, dual(table_at)>::type;
    const auto& tv = zest::at_layout<table_at>(table.value());
    const std::size_t rows = tv.extents()[0];
    const std::size_t width = tv.local_extents()[1];
    // This rank's block of rows: all of them unless the rows are split.
    const std::size_t first_row = tv.local_offsets()[0], local_rows = tv.local_extents()[0];
    typename out_t::extents_type extents{};
    for (std::size_t k = 0; k < Ids::rank; ++k) extents[k] = ids.extents()[k];
    extents[Ids::rank] = tv.extents()[1];
    out_t y(tv.mesh(), extents, out_t::uninitialized);
    const auto checked = ids.local_to_host();
    for (std::size_t p = 0; p < checked.size(); ++p) {
      const std::int32_t id = checked[p];
      if (id < 0 || static_cast<std::size_t>(id) >= rows)
        detail::bad_index<"embedding">(ids, p, id, rows, "id");
    }
    for_each_kernel<B>(y.local_count(), kernels::embedding_gather<T>{
                                            tv.local().data(), ids.local().data(), y.local().data(),
                                            width, first_row, local_rows});
    auto out = detail::make_result(table.owner(), std::move(y), table.requires_grad());
    if (out.requires_grad()) {
      // For the gradient: the positions of each of this rank's table rows, in order (a stable
      // counting sort of the checked ids in its block), so that one call per table element
      // sums its positions.
      const auto local_row = [&](std::int32_t id) {
        const auto r = static_cast<std::size_t>(id);
        return r >= first_row && r - first_row < local_rows ? r - first_row : local_rows;
      };
      std::vector<std::size_t> first(local_rows + 2, 0), order(checked.size());
      for (const std::int32_t id : checked) ++first[local_row(id) + 1];
      for (std::size_t r = 0; r <= local_rows; ++r) first[r + 1] += first[r];
      first.pop_back();  // the ids of other ranks' rows sort last and are never read
      std::vector<std::size_t> next(first.begin(), first.end() - 1);
      for (std::size_t p = 0; p < checked.size(); ++p) {
        const std::size_t r = local_row(checked[p]);
        if (r < local_rows) order[next[r]++] = p;
      }
      struct row_lists {
        typename B::template buffer<std::size_t> first, order;
      };
      auto lists = std::make_shared<row_lists>(
          row_lists{B::template from_host<std::size_t>(std::span<const std::size_t>(first)),
                    B::template from_host<std::size_t>(std::span<const std::size_t>(order))});
      table.owner().record([tn = table.node(), on = out.node(), lists, width] {
        if (!on->grad) return;
        grad_at_t g(tn->value.mesh(), tn->value.extents(), grad_at_t::uninitialized);
        for_each_kernel<B>(g.local_count(),
                           kernels::embedding_scatter<T>{std::as_const(*on->grad).local().data(),
                                                         lists->first.data(), lists->order.data(),
                                                         g.local().data(), width});
        tn->accumulate(redistribute_to<dual(Table::layout)>(std::move(g)));
      });
    }
    return out;
  }
}

namespace detail {
// cross_entropy's rows when the classes V are split over mesh axes: this rank holds classes
// [first_class, first_class + walk.n) of each row. Fills lse with every row's global
// log-sum-exp and returns the sum over the rows of lse - x[target], the same on every rank
// of the axes that split V. Collectives over those axes (of size > 1): the row maxima, the
// sums of exponentials and the target logits (each from the rank that holds it), one value per
// row each: 3 b·s values, never the b·s·V logits.
template <char V, sharded_tensor L, class B>
double split_class_loss(const L& lv, const std::int32_t* targets, const shard_rows& walk,
                        std::size_t first_class,
                        typename B::template buffer<typename L::value_type>& lse) {
  using T = typename L::value_type;
  const std::size_t rows = lse.size();
  const T* px = lv.local().data();
  const auto over_class_axes = [&](T* values, reduce_op op) {
    for (std::size_t a = 0; a < L::mesh_type::axis_count; ++a) {
      if (L::layout.splits(a, V) && lv.mesh().size(a) > 1)
        lv.mesh().axis(a).all_reduce(std::span<T>(values, rows), op);
    }
  };
  typename B::template buffer<T> row_max(rows), picked(rows);
  for_each_kernel<B>(rows, kernels::row_max<T>{px, row_max.data(), walk});
  over_class_axes(row_max.data(), reduce_op::max);
  for_each_kernel<B>(rows, kernels::sum_exp_rows<T>{px, row_max.data(), lse.data(), walk});
  over_class_axes(lse.data(), reduce_op::sum);
  for_each_kernel<B>(rows, kernels::max_plus_log<T>{row_max.data(), lse.data()});
  for_each_kernel<B>(rows, kernels::target_logit<T>{px, targets, picked.data(), walk, first_class});
  over_class_axes(picked.data(), reduce_op::sum);
  return sum_kernel<B>(rows, kernels::difference<T>{lse.data(), picked.data()});
}
}  // namespace detail

// The mean over all global token positions of -log softmax(logits)[target], softmax along
// V (logits not partial): a scalar, pending on every axis that splits the logits' other dims
// (each rank adds its rows' losses divided by the global token count), replicated on the
// others. `targets` is a plain int32_t tensor with the logits' dims without V; it is used
// split as the logits are. Fused and stable (max subtracted); the gradient is
// (softmax - onehot(target)) * g / count. A target outside [0, extent of V) throws
// zest::shape_error.
//
// V may be split (vocabulary-parallel logits, Megatron's cross-entropy): the logits are never
// gathered. Over the axes that split V, the row maxima are all-reduced (max), then the sums
// of exponentials (sum) and the target logits (sum, each from the rank that holds it), one
// value per row each; every rank of those axes then holds the same loss, and the gradient is its own
// block's (softmax - onehot) * g / count, with no collective:
//
//   logits "btv" split(b:dp) split(v:tp)  ->  scalar partial(dp), replicated on tp
template <char V, sharded_tensor L, sharded_tensor Targets>
auto cross_entropy(const variable<L>& logits, const Targets& targets,
                   source_site at = source_site::current()) {
  const user_call user(at);
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
  } else if constexpr (!L::dims.contains(V)) {
    (void)autodiff_error::missing_dim<"cross_entropy", V, L>{};
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
  } else {
    using T = typename L::value_type;
    using B = typename L::backend_type;
    constexpr layout_value targets_at = detail::splits_of(L::layout, view_of<Targets::dims>);
    constexpr layout_value scalar_layout =
        detail::scalar_sum_layout(detail::splits_of(L::layout, view_of<Targets::dims>));
    using s_t = basic_tensor<T, typename L::mesh_type, detail::no_dims, scalar_layout>;
    const L& lv = logits.value();
    detail::check_extents<"cross_entropy">(lv, targets, "logits", "targets");
    const std::size_t vi = L::dim_index(V);
    std::size_t count = 1;
    for (std::size_t k = 0; k < L::rank; ++k) count *= k == vi ? 1 : lv.extents()[k];
    if (count == 0) {
      throw shape_error(zest::detail::message("zest: cross_entropy: the logits \"",
                                              view_of<L::dims>,
                                              "\" have no token positions to average over"));
    }
    const auto& tv = zest::at_layout<targets_at>(targets);
    const shard_rows rows = rows_around(lv.local_extents(), vi);
    const shard_rows walk = rows;
    const std::size_t classes = lv.extents()[vi], first_class = lv.local_offsets()[vi];
    const auto checked = tv.local_to_host();
    for (std::size_t row = 0; row < rows.count(); ++row) {
      const std::int32_t target = checked[row];
      if (target < 0 || static_cast<std::size_t>(target) >= classes) {
        detail::bad_index<"cross_entropy">(tv, row, target, classes, "target");
      }
    }
    typename B::template buffer<T> lse(rows.count());
    const T* px = lv.local().data();
    double total = 0;
    if (rows.n == classes) {  // every class here (V whole, or split over axes of size 1)
      for_each_kernel<B>(rows.count(), kernels::log_sum_exp_rows<T>{px, lse.data(), walk});
      total = sum_kernel<B>(
          rows.count(), kernels::cross_entropy_terms<T>{px, lse.data(), tv.local().data(), walk});
    } else {
      total = detail::split_class_loss<V, L, B>(lv, tv.local().data(), walk, first_class, lse);
    }
    auto out = detail::make_result(
        logits.owner(),
        detail::scalar_of<s_t>(lv.mesh(), static_cast<T>(total / static_cast<double>(count))),
        logits.requires_grad());
    if (out.requires_grad()) {
      // Where V is split, each rank's gradient is its block's whole gradient, not a summand:
      // the loss's gradient, pending there (the dual of replicated), is summed first.
      static constexpr char classes_dim[] = {V};
      static constexpr layout_value grad_at = detail::release_axes(
          dual(scalar_layout), detail::splits_of(L::layout, std::string_view(classes_dim, 1)));
      logits.owner().record([ln = logits.node(), on = out.node(), walk, count, first_class,
                             lse = std::move(lse), picked = tv.storage()] {
        if (!on->grad) return;
        const T scale = static_cast<T>(
            static_cast<double>(detail::scalar_value(redistribute_to<grad_at>(*on->grad))) /
            static_cast<double>(count));
        dual_tensor<L> dx(ln->value.mesh(), ln->value.extents(), dual_tensor<L>::uninitialized);
        for_each_kernel<B>(dx.local_count(),
                           kernels::cross_entropy_backward<T>{
                               std::as_const(ln->value).local().data(), lse.data(), picked.data(),
                               dx.local().data(), walk, scale, first_class});
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
  } else {
    using T = typename X::value_type;
    using B = typename X::backend_type;
    constexpr layout_value out_layout = detail::summed_layout(X::layout, view_of<OutDims>);
    using out_t = basic_tensor<T, typename X::mesh_type, OutDims, out_layout>;
    const X& xv = x.value();
    typename out_t::extents_type extents{};
    for (std::size_t k = 0; k < out_t::rank; ++k) extents[k] = xv.extent(OutDims[k]);
    out_t y(xv.mesh(), extents, out_t::uninitialized);
    const kernels::broadcast_map map = detail::broadcast_map_of(
        detail::walk_of(view_of<X::dims>, view_of<OutDims>, xv.local_extents()));
    detail::run_broadcast_sum<B>(xv.local().data(), static_cast<const T*>(nullptr),
                                 y.local().data(), y.local_count(), map);
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), map] {
        if (!on->grad) return;
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        for_each_kernel<B>(dx.local_count(),
                           kernels::broadcast_expand<T>{std::as_const(*on->grad).local().data(),
                                                        dx.local().data(), map});
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
  } else {
    using T = typename X::value_type;
    using B = typename X::backend_type;
    constexpr layout_value scalar_layout = detail::scalar_sum_layout(X::layout);
    using s_t = basic_tensor<T, typename X::mesh_type, detail::no_dims, scalar_layout>;
    const std::size_t count = x.value().size();
    const auto local = x.value().local();
    const double total = sum_kernel<B>(local.size(), kernels::element<T>{local.data()});
    auto out = detail::make_result(
        x.owner(),
        detail::scalar_of<s_t>(x.value().mesh(),
                               static_cast<T>(total / static_cast<double>(count))),
        x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), count] {
        if (!on->grad) return;
        dual_tensor<X> g(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        const T seed = static_cast<T>(static_cast<double>(detail::scalar_value(*on->grad)) /
                                      static_cast<double>(count));
        B::fill(g.local().data(), g.local_count(), seed);
        xn->accumulate(std::move(g));
      });
    }
    return out;
  }
}

// The mean over dim D: x's dims without D, laid out as reduce_sum's (linear: where D is split
// the result is pending on that axis, each rank's share of the sum; redistribute to reduce).
template <char D, sharded_tensor X>
auto mean(const variable<X>& x) {
  if constexpr (!X::dims.contains(D)) {
    (void)autodiff_error::missing_dim<"mean", D, X>{};
    return 0;
  } else {
    using T = typename X::value_type;
    auto s = reduce_sum<detail::without_dim<X::dims, D>()>(x);
    const std::size_t n = x.value().extent(D);
    return scale(s, n == 0 ? T(0) : static_cast<T>(T(1) / static_cast<T>(n)));
  }
}

// The population variance over dim D (whole; x not partial): mean<D>((x - mean<D>(x))^2),
// x's dims without D, split as x on them.
template <char D, sharded_tensor X>
auto variance(const variable<X>& x) {
  if constexpr (!detail::check_operand<"variance", X>()) {
    return 0;
  } else if constexpr (!detail::check_whole_dim<"variance", D, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    auto centered = broadcast_add(x, scale(mean<D>(x), T(-1)));
    return mean<D>(centered * centered);
  }
}

// RMS normalisation along D (whole; x not partial): y = x / sqrt(mean<D>(x^2) + eps) * gamma,
// gamma a 1-D tensor along D used as layer_norm's (its gradient, a sum over rows, pending on
// the axes that split x's other dims, reaches it in its dual layout).
template <char D, sharded_tensor X, sharded_tensor G>
auto rms_norm(const variable<X>& x, const variable<G>& gamma, double eps = 1e-6) {
  if constexpr (!detail::check_norm<"rms_norm", D, X, G>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    auto r = rsqrt(shift(mean<D>(x * x), static_cast<T>(eps)));
    return broadcast_multiply(broadcast_multiply(x, r), gamma);
  }
}

}  // namespace zest::autodiff
