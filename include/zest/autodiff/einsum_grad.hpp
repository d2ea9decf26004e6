// zest/autodiff/einsum_grad.hpp — the gradients of an einsum are einsums, derived at
// compile time from the forward spec.
//
//   forward             gradient of operand 0        gradient of operand 1
//   "bsm,mh->bsh"       "bsh,mh->bsm"                "bsm,bsh->mh"
//   "A,B->C"            "C,B->A"                     "A,C->B"
//   "bsm->msb"          "msb->bsm"
//
// The incoming gradient takes the place of the operand; the other operand keeps its
// position, so the convention "activations first, weights last" that einsum's policies
// rely on still holds. A letter of the operand that appears in neither the output nor the
// other operand (a dim summed out of that operand alone, e.g. j in "ij->i") is not in the
// gradient einsum's inputs: the gradient einsum yields the reduced term ("i->i"), and a
// second einsum with a tensor of ones over the missing letters broadcasts it back
// ("i,j->ij").
//
// Each gradient is evaluated with its output layout forced to the dual of the operand's
// layout (zest/autodiff/dual.hpp): a ZeRO-3 weight stored split(m:dp) and gathered on use
// gets "bsm,bsh->mh" -> partial(dp), forced to split(m:dp): one reduce-scatter.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

#include "zest/autodiff/dual.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/einsum/einsum.hpp"
#include "zest/einsum/policy.hpp"
#include "zest/einsum/spec.hpp"
#include "zest/layout/layout_of.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

// Spec text built at compile time, then frozen into a fixed_string of the exact size.
struct spec_text {
  std::array<char, 4 * (max_dims + 1) + 2> chars{};
  std::size_t size = 0;
  constexpr void push(char c) { chars[size++] = c; }
  constexpr void push(std::string_view s) {
    for (char c : s) push(c);
  }
  constexpr std::string_view view() const { return {chars.data(), size}; }
};

// The letters of operand i that the gradient einsum can produce: those in the output or in
// another operand, in the operand's order.
constexpr einsum_term reduced_term(const einsum_spec& s, std::size_t i) {
  einsum_term out{};
  const einsum_term& t = s.inputs[i];
  for (std::size_t k = 0; k < t.size; ++k) {
    const char c = t.letters[k];
    if (s.output.has(c) || s.operands_with(c) > 1) out.letters[out.size++] = c;
  }
  return out;
}

// The letters of operand i summed out of it alone: broadcast back in its gradient.
constexpr einsum_term broadcast_term(const einsum_spec& s, std::size_t i) {
  einsum_term out{};
  const einsum_term& t = s.inputs[i];
  const einsum_term kept = reduced_term(s, i);
  for (std::size_t k = 0; k < t.size; ++k) {
    if (!kept.has(t.letters[k])) out.letters[out.size++] = t.letters[k];
  }
  return out;
}

// "A,B->C", i = 0: "C,B->A'"; i = 1: "A,C->B'"; "A->C": "C->A'" (A' = reduced_term).
constexpr spec_text gradient_spec_text(const einsum_spec& s, std::size_t i) {
  spec_text out;
  for (std::size_t j = 0; j < s.operand_count; ++j) {
    if (j) out.push(',');
    out.push(j == i ? s.output.view() : s.inputs[j].view());
  }
  out.push("->");
  out.push(reduced_term(s, i).view());
  return out;
}

// "A',O->A": the reduced gradient times ones over the broadcast letters.
constexpr spec_text broadcast_spec_text(const einsum_spec& s, std::size_t i) {
  spec_text out;
  out.push(reduced_term(s, i).view());
  out.push(',');
  out.push(broadcast_term(s, i).view());
  out.push("->");
  out.push(s.inputs[i].view());
  return out;
}

namespace detail {
template <std::size_t N>
constexpr auto freeze(const spec_text& t) {
  fixed_string<N + 1> out;
  for (std::size_t k = 0; k < N; ++k) out.set(k, t.chars[k]);
  return out;
}
constexpr spec_text term_text(const einsum_term& t) {
  spec_text out;
  out.push(t.view());
  return out;
}
}  // namespace detail

// Everything about the gradient of einsum<Spec> with respect to operand I, at compile time.
template <fixed_string Spec, std::size_t I>
struct einsum_gradient {
  static constexpr einsum_spec forward = parse_einsum(view_of<Spec>);
  static_assert(
      forward.ok(),
      "zest autodiff: the forward einsum spec does not parse (see zest::einsum's message)");
  static_assert(I < forward.operand_count, "zest autodiff: no such operand in the einsum");

  static constexpr spec_text text = gradient_spec_text(forward, I);
  // The gradient einsum, e.g. "bsh,mh->bsm".
  static constexpr auto spec = detail::freeze<text.size>(text);
  // Letters broadcast back after it ("" when none), and the einsum that does it.
  static constexpr bool broadcasts = broadcast_term(forward, I).size != 0;
  static constexpr spec_text ones_text = detail::term_text(broadcast_term(forward, I));
  static constexpr auto ones_dims = detail::freeze<ones_text.size>(ones_text);
  static constexpr spec_text broadcast_text = broadcast_spec_text(forward, I);
  static constexpr auto broadcast_spec = detail::freeze<broadcast_text.size>(broadcast_text);
  static constexpr spec_text reduced_text = detail::term_text(reduced_term(forward, I));
  static constexpr auto reduced_dims = detail::freeze<reduced_text.size>(reduced_text);
};

// Gradient einsums may communicate even where the forward einsum did not (a ZeRO gradient is
// reduce-scattered), and rank operands as the forward policy did.
template <einsum_policy P>
struct backward_policy {
  static constexpr bool allows_communication = true;
  static constexpr auto ranking(std::size_t n) { return P::ranking(n); }
};

// The partial axes of every layout but in[skip], as a layout (the rest replicated).
template <std::size_t N>
constexpr layout_value partial_axes_of_others(const std::array<layout_value, N>& in,
                                              std::size_t skip) {
  layout_value v = replicated_layout(in[0].axis_count);
  for (std::size_t j = 0; j < N; ++j) {
    if (j == skip) continue;
    for (std::size_t a = 0; a < v.axis_count; ++a) {
      if (in[j].is_partial(a)) v.axes[a] = in[j].axes[a];
    }
  }
  return v;
}

// The gradient of einsum<Spec, Policy> with respect to operand I, given the incoming
// gradient `dy` (the dual of the output's layout) and the forward operands. The result has
// the dual layout of operand I.
template <fixed_string Spec, std::size_t I, class Policy, sharded_tensor DY, sharded_tensor... X>
auto einsum_operand_gradient(const DY& dy, const X&... xs) {
  using g = einsum_gradient<Spec, I>;
  using target_t = std::tuple_element_t<I, std::tuple<X...>>;
  using mesh_t = typename target_t::mesh_type;
  using value_t = typename target_t::value_type;
  constexpr layout_value want = dual(target_t::layout);
  using policy = backward_policy<Policy>;

  // Pending sums on an axis where another operand is partial too are reduced first.
  constexpr layout_value others_partial =
      partial_axes_of_others(std::array<layout_value, sizeof...(X)>{X::layout...}, I);
  // static: nvcc takes a constexpr local that a lambda names for captured run-time storage.
  static constexpr layout_value dy_layout = without_shared_partials(DY::layout, others_partial);
  decltype(auto) dy_ready = [&]() -> decltype(auto) {
    if constexpr (dy_layout == DY::layout) {
      return (dy);
    } else {
      return redistribute_to<dy_layout>(dy);
    }
  }();

  // The operands of the gradient einsum: dy in place of operand I.
  auto call = [&]<class Forced>(auto&&... ops) {
    return zest::einsum<g::spec, policy, Forced>(ops...);
  };
  auto operands = [&](auto&& f) {
    return [&]<std::size_t... J>(std::index_sequence<J...>) {
      const auto args = std::forward_as_tuple(xs...);
      return f([&]() -> decltype(auto) {
        if constexpr (J == I) {
          return (dy_ready);
        } else {
          return (std::get<J>(args));
        }
      }()...);
    }
    (std::index_sequence_for<X...>{});
  };

  if constexpr (!g::broadcasts) {
    return operands([&](const auto&... ops) {
      return call.template operator()<typename layout_type_for<mesh_t, want>::type>(ops...);
    });
  } else {
    const target_t& target = std::get<I>(std::forward_as_tuple(xs...));
    if constexpr (g::reduced_dims.size() == 0) {
      // Nothing of the operand survives but a scalar: "C->" then ",O->A" is a fill.
      auto scalar = [&]() -> decltype(auto) {
        if constexpr (sizeof...(X) == 1) {
          return (dy_ready);  // "A->": the incoming gradient is the scalar ("->" is no spec)
        } else {
          return operands(
              [&](const auto&... ops) { return call.template operator()<void>(ops...); });
        }
      }();
      // Each rank's summand (or copy) of the scalar goes to every element it holds.
      constexpr layout_value scalar_layout = std::remove_cvref_t<decltype(scalar)>::layout;
      using filled_t = typename zest::with_layout_for<target_t, scalar_layout>::type;
      filled_t filled(target.mesh(), target.extents());
      backend_of<mesh_t>::fill(filled.local().data(), filled.local_count(),
                               scalar.local_to_host()[0]);
      return redistribute_to<want>(std::move(filled));
    } else {
      using ones_t =
          basic_tensor<value_t, mesh_t, g::ones_dims, replicated_layout(mesh_t::axis_count)>;
      typename ones_t::extents_type ones_extents{};
      for (std::size_t k = 0; k < ones_t::rank; ++k)
        ones_extents[k] = target.extent(g::ones_dims[k]);
      const auto ones =
          ones_t::generate(target.mesh(), ones_extents, [](const auto&) { return value_t(1); });
      auto reduced =
          operands([&](const auto&... ops) { return call.template operator()<void>(ops...); });
      return zest::einsum<g::broadcast_spec, policy, typename layout_type_for<mesh_t, want>::type>(
          reduced, ones);
    }
  }
}

}  // namespace zest::autodiff
