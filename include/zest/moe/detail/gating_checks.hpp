// zest/moe/detail/gating_checks.hpp — the compile-time checks of gating's logits (dims
// "gse", not partial, s and e not split), each failure one static_assert whose message says
// the fix.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/ops.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::moe {

// ---------------------------------------------------------------------------------------
// Diagnostics: each is instantiated with the operation's name and the logits' type, which
// the compiler prints on the line above the message.

namespace moe_error {
using zest::detail::always_false;
template <fixed_string Operation, class Logits>
struct logits_dims {
  static_assert(always_false<Logits>,
                "zest moe gating: the gate logits have dims \"gse\" (group, token, expert); "
                "these have others (operation and logits shown above). Fix: "
                "autodiff::einsum<\"gsm,me->gse\">(x, w_gate).");
};
template <fixed_string Operation, class Logits>
struct partial_logits {
  static_assert(always_false<Logits>,
                "zest moe gating: the gate logits are a pending sum over a mesh axis (operation "
                "and logits shown above); softmax and top-k need whole values. Fix: reduce "
                "first, e.g. autodiff::redistribute<layout<split<'g', \"dp\">>>(logits).");
};
template <fixed_string Operation, class Logits>
struct split_tokens {
  static_assert(always_false<Logits>,
                "zest moe gating: the gate logits split the token dim s (operation and logits "
                "shown above); slots are counted along s within a group, so a rank needs whole "
                "groups. Fix: split only the group dim, layout<split<'g', \"dp\", \"ep\">>, "
                "e.g. autodiff::redistribute<layout<split<'g', \"dp\">>>(logits).");
};
template <fixed_string Operation, class Logits>
struct split_experts {
  static_assert(always_false<Logits>,
                "zest moe gating: the gate logits split the expert dim e (operation and logits "
                "shown above); softmax and top-k run along e, so a rank needs every expert's "
                "logit. Fix: split only the group dim, layout<split<'g', \"dp\", \"ep\">>, e.g. "
                "autodiff::redistribute<layout<split<'g', \"dp\">>>(logits).");
};
}  // namespace moe_error

namespace detail {

template <fixed_string Op, class L>
constexpr bool check_logits() {
  if constexpr (!autodiff::detail::check_real_operand<Op, L>()) {
    return false;
  } else if constexpr (!(L::dims == fixed_string("gse"))) {
    (void)moe_error::logits_dims<Op, L>{};
    return false;
  } else if constexpr (L::layout.any_partial()) {
    (void)moe_error::partial_logits<Op, L>{};
    return false;
  } else if constexpr (L::layout.split_count('s') != 0) {
    (void)moe_error::split_tokens<Op, L>{};
    return false;
  } else if constexpr (L::layout.split_count('e') != 0) {
    (void)moe_error::split_experts<Op, L>{};
    return false;
  } else {
    return true;
  }
}

}  // namespace detail

}  // namespace zest::moe
