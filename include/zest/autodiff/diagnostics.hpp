// zest/autodiff/diagnostics.hpp — the compile-time checks of autodiff's operations.
//
//   if constexpr (!detail::check_operand<"gelu", X>()) return 0;   // one static_assert, then stop
//
// Each diagnostic is a class template instantiated with the operation's name and the
// offending types or dims, which the compiler prints on the line above the message; its
// message says what is wrong and how to fix it. A check function returns false after it
// instantiated its diagnostic, so that the operation stops there (one error, not a cascade).
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "zest/autodiff/tape.hpp"
#include "zest/core/fixed_string.hpp"
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
                "zest autodiff: layer_norm<D>'s gamma and beta and rms_norm<D>'s gamma are 1-D "
                "tensors whose one dim is D (dim and parameter shown above). Fix: make them "
                "tensors with dims \"D\", e.g. \"m\" for layer_norm<'m'>.");
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

}  // namespace detail
}  // namespace zest::autodiff
