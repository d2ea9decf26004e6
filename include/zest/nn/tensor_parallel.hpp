// zest/nn/tensor_parallel.hpp — Megatron's tensor and sequence parallelism, as layouts.
//
// On a mesh with a tensor-parallel axis (the policy's: training_policy's axis_roles, by
// default the axis named "tp"), zest's layers split their weights over it the way Megatron-LM
// does, and on any other mesh the same layers are the plain ones (every name below is then
// the replicated layout, and every redistribute a no-op). Written with "tp" for that axis:
//
//   attention   W_q, W_k, W_v "mnd" split(n:tp)   column-parallel: each rank its heads
//               W_o "ndm" split(n:tp)             row-parallel: the output pending over tp
//   MLP         W_1 "mh", b_1 "h" split(h:tp)     column-parallel
//               W_2 "hm" split(h:tp)              row-parallel
//   embedding   "vm" split(v:tp)                  each rank a block of the vocabulary
//   head        "mv" split(v:tp)                  logits split(v:tp), into cross_entropy
//
// A tensor-parallel region takes its input whole on tp (tp_region_input) and gives its
// output in the residual stream's own layout (the row-parallel einsum's forced layout). The
// residual stream's layout is the caller's choice, through the token ids' layout:
//
//   ids split(b:dp)            stream "btm" split(b:dp): each region ends in an all-reduce
//                              over tp (and its backward in another): Megatron's TP
//   ids split(b:dp) split(t:tp) stream split(b:dp) split(t:tp): norms, dropout and residuals
//                              on 1/tp of the tokens; a region starts with an all-gather over
//                              tp and ends in a reduce-scatter: Megatron's sequence
//                              parallelism, the same bytes as the all-reduce
//
// On a mesh with a sequence-parallel axis (by default "sp", written sp here) the attention
// is DeepSpeed-Ulysses' instead: the stream split over sp on the sequence (ids split(t:sp)),
// weights whole on sp, and around the attention core one all-to-all each way per tensor
// (across_sp): q, k and v from the sequence split to a heads split, its output back; every
// other layer works on its block of the sequence. The weights' gradients, partial over sp,
// are reduced over it. sp and tp can be combined (heads split over tp, then over sp inside
// it).
//
// No layer names a collective: the layouts imply every one, forward and backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "zest/autodiff/tape.hpp"
#include "zest/core/source_site.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/layout_of.hpp"
#include "zest/layout/placement.hpp"
#include "zest/tensor/tensor.hpp"
#include "zest/zero/training_policy.hpp"

namespace zest {

namespace detail {
// Dim d split over mesh axis x alone; replicated for x = axis_count (no such axis).
constexpr layout_value split_on_axis(std::size_t axes, char d, std::size_t x) {
  layout_value v = replicated_layout(axes);
  if (x < axes) v.axes[x] = axis_placement{placement_kind::split, d, 0};
  return v;
}
// v with mesh axis x's split released (replicated there); v itself for x = axis_count (no
// such axis). Only the innermost split of a dim can be released: a layout that nests another
// axis inside it is refused.
constexpr layout_value released_axis(layout_value v, std::size_t x) {
  if (x < v.axis_count && v.is_split(x)) {
    for (std::size_t a = 0; a < v.axis_count; ++a) {
      if (a != x && v.splits(a, v.axes[x].dim) && v.axes[a].order > v.axes[x].order)
        throw "zest tensor_parallel: an axis is nested inside the released axis's split";
    }
    v.axes[x] = axis_placement{};
  }
  return v;
}
}  // namespace detail

// split(D) over policy P's tensor-parallel axis where it has one, replicated otherwise: a
// weight's Base (as a layout value: see layout_like below).
template <training_policy_type P, char D>
using split_over_tp =
    typename layout_type_for<typename P::mesh_type, detail::split_on_axis(P::mesh_type::axis_count,
                                                                          D, P::tensor_axis)>::type;

namespace detail {
template <class X>
struct tensor_of {
  using type = X;
};
template <class X>
requires requires { typename X::tensor_type; }
struct tensor_of<X> {
  using type = typename X::tensor_type;
};
}  // namespace detail

namespace detail {
// v with mesh axis sp's split moved from dim From to dim To, nested inside To's other splits;
// v itself for sp = axis_count (no such axis).
template <char From, char To>
constexpr layout_value moved_over_sp(layout_value v, std::size_t sp) {
  if (sp < v.axis_count) {
    if (v.splits(sp, From)) {
      for (std::size_t a = 0; a < v.axis_count; ++a) {
        if (a != sp && v.splits(a, From) && v.axes[a].order > v.axes[sp].order)
          throw "zest across_sp: an axis is nested inside the sequence-parallel axis's split";
      }
      v.axes[sp] =
          axis_placement{placement_kind::split, To, static_cast<std::uint8_t>(v.split_count(To))};
    }
  }
  return v;
}
}  // namespace detail

// Layouts as types (layout<...>, built from their values by layout_type_for), for
// autodiff::redistribute<L> and einsum's forced layout. X is a tensor type or an autodiff
// variable.
//
// X's own layout: for another tensor laid out alike (dims that X splits, some of its own).
template <class X>
using layout_like = typename layout_type_for<typename detail::tensor_of<X>::type::mesh_type,
                                             detail::tensor_of<X>::type::layout>::type;
// X's layout, whole on policy P's tensor-parallel axis: what a tensor-parallel region takes
// in. From a sequence-parallel stream (split(t:tp)) it is an all-gather over tp; otherwise
// X's own layout.
template <training_policy_type P, class X, class T = typename detail::tensor_of<X>::type>
using tp_region_input =
    typename layout_type_for<typename T::mesh_type,
                             detail::released_axis(T::layout, P::tensor_axis)>::type;
// X's layout, whole on P's tensor- and sequence-parallel axes (tp nests inside sp on the
// sequence): what a layer that needs every token of a sequence takes in (the experts:
// capacity is counted along a sequence).
template <training_policy_type P, class X, class T = typename detail::tensor_of<X>::type>
using sequence_whole =
    typename layout_type_for<typename T::mesh_type,
                             detail::released_axis(detail::released_axis(T::layout, P::tensor_axis),
                                                   P::sequence_axis)>::type;

// x brought whole on P's tensor-parallel axis (tp_region_input): an all-gather from a
// sequence-parallel stream, x itself otherwise (no copy, no tape step).
template <training_policy_type P, sharded_tensor X>
auto whole_on_tp(const autodiff::variable<X>& x, source_site at = source_site::current()) {
  return autodiff::redistribute<tp_region_input<P, X>>(x, at);
}

// Ulysses' all-to-all: x's split over P's sequence-parallel axis moved from dim From (the
// sequence) to dim To (the heads), or back; x itself where that axis does not split From (or
// P has none).
//
//   q "btnd" split(t:sp)  -> across_sp<P, 't', 'n'>(q) -> split(n:sp): every query of its heads
template <training_policy_type P, char From, char To, sharded_tensor X>
auto across_sp(const autodiff::variable<X>& x, source_site at = source_site::current()) {
  return autodiff::redistribute<detail::moved_over_sp<From, To>(layout_value(X::layout),
                                                                P::sequence_axis)>(x, at);
}

}  // namespace zest
