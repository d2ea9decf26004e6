// zest/nn/tensor_parallel.hpp — Megatron's tensor and sequence parallelism, as layouts.
//
// On a mesh with an axis named "tp", zest's layers split their weights over it the way
// Megatron-LM does, and on any other mesh the same layers are the plain ones (every name
// below is then the replicated layout, and every redistribute a no-op):
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
// No layer names a collective: the layouts imply every one, forward and backward.
#pragma once

#include <cstddef>
#include <type_traits>

#include "zest/autodiff/tape.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/layout_of.hpp"
#include "zest/layout/placement.hpp"
#include "zest/tensor/tensor.hpp"
#include "zest/zero/stage.hpp"

namespace zest {

// Whether the mesh has the tensor-parallel axis "tp".
template <class Mesh>
inline constexpr bool has_tensor_axis = detail::axis_index_of<Mesh>("tp") < Mesh::axis_count;

// layout<split<D, "tp">> on a mesh with "tp", layout<> on any other: a weight's Base.
template <class Mesh, char D>
using split_over_tp =
    std::conditional_t<has_tensor_axis<Mesh>, layout<split<D, "tp">>, layout<>>;

namespace detail {
template <class Mesh>
constexpr layout_value released_tp(layout_value v) {
  constexpr std::size_t tp = axis_index_of<Mesh>("tp");
  if constexpr (tp < Mesh::axis_count) {
    if (v.is_split(tp)) {
      // Nested splits inside tp's lose their blocks too: only tp's own is released here, so
      // a layout that nests another axis inside tp is refused.
      for (std::size_t a = 0; a < v.axis_count; ++a) {
        if (a != tp && v.splits(a, v.axes[tp].dim) && v.axes[a].order > v.axes[tp].order)
          throw "zest tensor_parallel: an axis is nested inside tp's split";
      }
      v.axes[tp] = axis_placement{};
    }
  }
  return v;
}
}  // namespace detail

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

// X's layout, whole on tp: what a tensor-parallel region takes in. From a sequence-parallel
// stream (split(t:tp)) it is an all-gather over tp; otherwise X's own layout. X is a tensor
// type or an autodiff variable.
template <class X, class T = typename detail::tensor_of<X>::type>
using tp_region_input =
    layout_of_t<with_layout<T, detail::released_tp<typename T::mesh_type>(T::layout)>>;

// y in layout L (a layout type), y itself when it has it already.
template <class L, sharded_tensor Y>
auto in_layout(const autodiff::variable<Y>& y) {
  if constexpr (layout_value_of<typename Y::mesh_type, Y::dims, L> == Y::layout) {
    return y;
  } else {
    return autodiff::redistribute<L>(y);
  }
}

// x brought whole on tp (tp_region_input): an all-gather from a sequence-parallel stream,
// x itself otherwise (no copy, no tape step).
template <sharded_tensor X>
auto whole_on_tp(const autodiff::variable<X>& x) {
  return in_layout<tp_region_input<X>>(x);
}

}  // namespace zest
