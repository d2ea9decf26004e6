// zest/einsum/einsum.hpp — einsum over sharded tensors.
//
//   auto y = zest::einsum<"bsm,mh->bsh">(x, w);                      // layout deduced
//   auto z = zest::einsum<"bsm,mh->bsh", zest::keep_weights>(x, w);  // Megatron-style
//   auto r = zest::einsum<"bsm,mh->bsh", zest::layout<zest::split<'b', "dp">>>(x, w);  // forced
//
// Evaluation: each operand is redistributed to the layout the plan gives it (the only
// communication before the contraction), the local shards are contracted on the host
// backend, and, if the caller named an output layout, the result is redistributed to it.
// The spec is parsed at compile time; each operand's dims must be the spec's letters for
// that operand, in the stored order (so "ki,kj->ij" names a transposed first operand).
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "zest/backend/host/contract.hpp"
#include "zest/comm/checked.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/source_site.hpp"
#include "zest/einsum/plan.hpp"
#include "zest/einsum/policy.hpp"
#include "zest/einsum/spec.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

namespace einsum_error {
using detail::always_false;
// Instantiated with the operand's index and dims, so that both show on the line above the
// message.
template <fixed_string Spec, std::size_t Operand, fixed_string OperandDims>
struct operand_dims_mismatch {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: an operand's dims differ from its term in the spec (operand index "
                "and its dims are shown above). Fix: write the term with the tensor's dims in "
                "their stored order.");
};
template <class FirstOperand, std::size_t Operand, class OtherOperand>
struct mesh_mismatch {
  static_assert(always_false<FirstOperand>,
                "zest einsum: operands live on different mesh types (shown above). Fix: build them "
                "on one mesh.");
};
template <class FirstType, std::size_t Operand, class OtherType>
struct element_type_mismatch {
  static_assert(
      always_false<FirstType>,
      "zest einsum: operands have different element types (shown above). Fix: convert one "
      "first.");
};
template <fixed_string Spec, class Mesh, std::size_t Axis>
struct partial_twice {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: two operands are partial sums over the same mesh axis (its index is "
                "shown above); the product of sums is not the sum of products. Fix: reduce one "
                "first, e.g. redistribute<layout<...>>(t) to replicate or split on that axis.");
};
}  // namespace einsum_error

namespace detail {

template <class O>
struct is_layout_type : std::false_type {};
template <class... P>
struct is_layout_type<layout<P...>> : std::true_type {};

// Sorts einsum<Spec, O1, O2>'s options into a policy and an optional forced layout.
template <class O1, class O2>
struct einsum_options {
  template <class O>
  static constexpr bool known = std::is_void_v<O> || einsum_policy<O> || is_layout_type<O>::value;
  template <class A, class B>
  using pick_policy = std::conditional_t<einsum_policy<A>, A,
                                         std::conditional_t<einsum_policy<B>, B, gather_weights>>;
  template <class A, class B>
  using pick_layout = std::conditional_t<is_layout_type<A>::value, A,
                                         std::conditional_t<is_layout_type<B>::value, B, void>>;

  using policy = pick_policy<O1, O2>;
  using forced_layout = pick_layout<O1, O2>;
  static constexpr bool ok = known<O1> && known<O2>;
};

template <fixed_string Spec>
inline constexpr einsum_spec parsed_spec = parse_einsum(view_of<Spec>);

enum class einsum_input_problem : std::uint8_t {
  none,
  unknown_option,
  spec_missing_arrow,
  spec_bad_character,
  spec_repeated_letter,
  spec_output_letter,
  spec_size,
  operand_count,
  too_many_operands,
  mesh_mismatch,
  element_type_mismatch,
  dims_mismatch,
};

struct einsum_input_check {
  einsum_input_problem problem = einsum_input_problem::none;
  std::size_t operand = 0;
};

template <std::size_t N>
constexpr bool same_letters(const einsum_term& t, const fixed_string<N>& dims) {
  if (t.size != dims.size()) return false;
  for (std::size_t i = 0; i < t.size; ++i) {
    if (t.letters[i] != dims[i]) return false;
  }
  return true;
}

// Everything wrong with einsum<Spec, O1, O2>(X...) that the types show, as data: plain
// constexpr code, so that a diagnostic is one short instantiation away from the user's line.
template <fixed_string Spec, class O1, class O2, class... X>
constexpr einsum_input_check check_einsum_input() {
  using enum einsum_input_problem;
  using options = einsum_options<O1, O2>;
  if (!options::ok) return {unknown_option, 0};
  constexpr einsum_spec s = parsed_spec<Spec>;
  switch (s.problem) {
    case spec_problem::none: break;
    case spec_problem::missing_arrow: return {spec_missing_arrow, 0};
    case spec_problem::bad_character: return {spec_bad_character, 0};
    case spec_problem::repeated_in_term: return {spec_repeated_letter, 0};
    case spec_problem::output_letter_not_in_operands: return {spec_output_letter, 0};
    default: return {spec_size, 0};
  }
  if (s.operand_count != sizeof...(X)) return {operand_count, 0};
  if (sizeof...(X) > 2) return {too_many_operands, 0};
  using first = std::tuple_element_t<0, std::tuple<X...>>;
  constexpr std::array<bool, sizeof...(X)> same_mesh{
      std::is_same_v<typename first::mesh_type, typename X::mesh_type>...};
  constexpr std::array<bool, sizeof...(X)> same_type{
      std::is_same_v<typename first::value_type, typename X::value_type>...};
  for (std::size_t i = 0; i < sizeof...(X); ++i) {
    if (!same_mesh[i]) return {mesh_mismatch, i};
  }
  for (std::size_t i = 0; i < sizeof...(X); ++i) {
    if (!same_type[i]) return {element_type_mismatch, i};
  }
  std::array<bool, sizeof...(X)> matches{};
  std::size_t k = 0;
  ((matches[k] = same_letters(s.inputs[k], X::dims), ++k), ...);
  for (std::size_t i = 0; i < sizeof...(X); ++i) {
    if (!matches[i]) return {dims_mismatch, i};
  }
  return {none, 0};
}

template <fixed_string Spec, std::size_t N>
constexpr auto output_dims() {
  constexpr einsum_spec s = parsed_spec<Spec>;
  fixed_string<N + 1> out;
  for (std::size_t i = 0; i < N; ++i) out.set(i, s.output.letters[i]);
  return out;
}

// Everything einsum<Spec, O1, O2>(X...) decides at compile time. Only instantiated for
// inputs that check_einsum_input accepts.
template <fixed_string Spec, class O1, class O2, class... X>
struct einsum_traits {
  using options = einsum_options<O1, O2>;
  using first = std::tuple_element_t<0, std::tuple<X...>>;
  using mesh_type = typename first::mesh_type;
  using value_type = typename first::value_type;
  static constexpr einsum_spec spec = parsed_spec<Spec>;

  static constexpr einsum_plan compute_plan() {
    std::array<layout_value, max_operands> in{};
    std::size_t i = 0;
    ((in[i++] = X::layout), ...);
    using forced_t = typename options::forced_layout;
    if constexpr (std::is_void_v<forced_t>) {
      return plan_einsum(spec, in, options::policy::ranking(sizeof...(X)));
    } else {
      constexpr layout_value forced =
          layout_value_of<mesh_type, output_dims<Spec, spec.output.size>(), forced_t>;
      return plan_einsum(spec, in, options::policy::ranking(sizeof...(X)), &forced);
    }
  }
  static constexpr einsum_plan plan = compute_plan();

  static constexpr fixed_string out_dims = output_dims<Spec, spec.output.size>();
  using contraction_type = basic_tensor<value_type, mesh_type, out_dims, plan.contraction_output>;
  using result_type = basic_tensor<value_type, mesh_type, out_dims, plan.result>;
};

// Checks einsum<Spec, O1, O2>(X...) and, on a problem, fails with the one static_assert that
// explains it. The instantiation line above the message shows Spec, the options and X.
template <fixed_string Spec, class O1, class O2, class... X>
constexpr bool einsum_valid() {
  constexpr einsum_input_check in = check_einsum_input<Spec, O1, O2, X...>();
  using enum einsum_input_problem;
  using operand = std::tuple_element_t<in.operand, std::tuple<X...>>;
  using first = std::tuple_element_t<0, std::tuple<X...>>;
  if constexpr (in.problem == unknown_option) {
    static_assert(einsum_error::always_false<O1, O2>,
                  "zest einsum: an option is neither a policy (gather_weights, keep_weights, "
                  "no_communication<>) nor an output layout zest::layout<...>.");
  } else if constexpr (in.problem == spec_missing_arrow) {
    static_assert(
        einsum_error::always_false<O1, O2>,
        "zest einsum: the spec has no \"->\". Fix: name the output, e.g. einsum<\"ik,kj->ij\">.");
  } else if constexpr (in.problem == spec_bad_character) {
    static_assert(
        einsum_error::always_false<O1, O2>,
        "zest einsum: the spec has a character that is not a dim letter (a-z, A-Z), ',' or "
        "\"->\". Fix: one letter per dim, e.g. \"bsm,mh->bsh\".");
  } else if constexpr (in.problem == spec_repeated_letter) {
    static_assert(
        einsum_error::always_false<O1, O2>,
        "zest einsum: a letter repeats within one term of the spec; a tensor has each dim "
        "once. Fix: give the dims distinct letters (traces are not supported).");
  } else if constexpr (in.problem == spec_output_letter) {
    static_assert(einsum_error::always_false<O1, O2>,
                  "zest einsum: an output letter appears in no operand. Fix: every output dim must "
                  "come from an operand.");
  } else if constexpr (in.problem == spec_size) {
    static_assert(einsum_error::always_false<O1, O2>,
                  "zest einsum: the spec has no operand, or more operands or dims than "
                  "zest::max_operands / zest::max_dims allow.");
  } else if constexpr (in.problem == operand_count) {
    static_assert(einsum_error::always_false<O1, O2>,
                  "zest einsum: the spec names a different number of operands than were passed. "
                  "Fix: pass one tensor per term before \"->\".");
  } else if constexpr (in.problem == too_many_operands) {
    static_assert(einsum_error::always_false<O1, O2>,
                  "zest einsum: an einsum takes one or two operands. Fix: split it into a chain of "
                  "two-operand einsums (which also makes each step's collectives explicit).");
  } else if constexpr (in.problem == mesh_mismatch) {
    (void)einsum_error::mesh_mismatch<typename first::mesh_type, in.operand,
                                      typename operand::mesh_type>{};
  } else if constexpr (in.problem == element_type_mismatch) {
    (void)einsum_error::element_type_mismatch<typename first::value_type, in.operand,
                                              typename operand::value_type>{};
  } else if constexpr (in.problem == dims_mismatch) {
    (void)einsum_error::operand_dims_mismatch<Spec, in.operand, operand::dims>{};
  } else {
    using traits = einsum_traits<Spec, O1, O2, X...>;
    constexpr einsum_plan plan = traits::plan;
    if constexpr (plan.problem == einsum_problem::partial_twice) {
      (void)einsum_error::partial_twice<Spec, typename traits::mesh_type, plan.problem_axis>{};
      return false;
    } else if constexpr (!traits::options::policy::allows_communication &&
                         plan.input_collectives() != 0) {
      static_assert(einsum_error::always_false<O1, O2>,
                    "zest einsum: this einsum needs a collective before its contraction, but the "
                    "policy no_communication forbids it. Fix: redistribute the operands first "
                    "(explain<spec>(...) shows which), or choose another policy.");
      return false;
    } else {
      return true;
    }
  }
  return false;
}

// One operand as the extents check sees it: null extents for a tensor that was moved from.
struct operand_extents {
  const std::size_t* extents;
};

// Checks that every operand holds a value (not moved from) and every letter has one extent
// across the operands (throws shape_error naming the spec, the operand, the dim and both
// extents) and writes the output's global extents to `out`. One function for every einsum.
inline void check_einsum_extents(const einsum_spec& s, std::string_view spec,
                                 std::span<const operand_extents> operands, std::size_t* out) {
  std::array<std::size_t, 128> extent{};
  std::array<int, 128> seen_in{};
  seen_in.fill(-1);
  for (std::size_t i = 0; i < operands.size(); ++i) {
    const int operand = static_cast<int>(i);
    const auto& term = s.inputs[i];
    if (operands[i].extents == nullptr) [[unlikely]] {
      throw shape_error(detail::message("zest: einsum \"", spec, "\": operand ", operand, " (\"",
                                        term.view(),
                                        "\") is a tensor that was moved from; it holds nothing. "
                                        "Fix: pass the tensor it was moved into"));
    }
    for (std::size_t k = 0; k < term.size; ++k) {
      const auto u = static_cast<unsigned char>(term.letters[k]);
      const std::size_t e = operands[i].extents[k];
      if (seen_in[u] < 0) {
        seen_in[u] = operand;
        extent[u] = e;
      } else if (extent[u] != e) {
        throw shape_error(detail::message("zest: einsum \"", spec, "\": dim '", term.letters[k],
                                          "' has extent ", extent[u], " in operand ", seen_in[u],
                                          " but ", e, " in operand ", operand));
      }
    }
  }
  for (std::size_t k = 0; k < s.output.size; ++k)
    out[k] = extent[static_cast<unsigned char>(s.output.letters[k])];
}

template <fixed_string Spec, class... X>
std::array<std::size_t, parsed_spec<Spec>.output.size> checked_output_extents(const X&... xs) {
  const std::array<operand_extents, sizeof...(X)> operands{
      operand_extents{xs.is_moved_from() ? nullptr : xs.extents().data()}...};
  std::array<std::size_t, parsed_spec<Spec>.output.size> out{};
  check_einsum_extents(parsed_spec<Spec>, view_of<Spec>, operands, out.data());
  return out;
}

}  // namespace detail

// The compile-time plan of einsum<Spec, Options...> for operand types X...
template <fixed_string Spec, class O1, class O2, class... X>
inline constexpr einsum_plan einsum_plan_of = detail::einsum_traits<Spec, O1, O2, X...>::plan;

namespace detail {
// einsum<Spec, O1, O2>(xs...) called at `at` (the user's line, for the communicators' messages).
template <fixed_string Spec, class O1, class O2, sharded_tensor... X>
auto einsum_at(const source_site& at, const X&... xs) {
  static_assert(sizeof...(X) > 0, "zest einsum: pass at least one tensor");
  if constexpr (!einsum_valid<Spec, O1, O2, X...>()) {
    return 0;  // the diagnostic above is the error; nothing useful to return
  } else {
    const user_call user(at);
    using traits = detail::einsum_traits<Spec, O1, O2, X...>;
    using value_type = typename traits::value_type;
    using contraction_t = typename traits::contraction_type;
    const typename contraction_t::extents_type out_extents =
        detail::checked_output_extents<Spec>(xs...);
    const auto& mesh = std::get<0>(std::forward_as_tuple(xs...)).mesh();
    // The collectives below (operand plans, the output's reduction) are this einsum's: checked
    // mode compares the spec across ranks and names it in a mismatch or a timeout.
    const collective_context context("einsum",
                                     [](std::ostream& o) { o << '"' << view_of<Spec> << '"'; });

    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      // Bring every operand to its planned layout (the plan's collectives happen here).
      std::tuple<decltype(zest::at_layout<traits::plan.operand_layouts[I]>(xs))...> ready{
          zest::at_layout<traits::plan.operand_layouts[I]>(xs)...};
      contraction_t out(mesh, out_extents, contraction_t::uninitialized);
      const std::array<host::operand_view<value_type>, sizeof...(X)> views{
          host::operand_view<value_type>{
              std::get<I>(ready).local().data(), traits::spec.inputs[I].view(),
              std::span<const std::size_t>(std::get<I>(ready).local_extents())}...};
      backend_of<typename traits::mesh_type>::template contract<value_type>(
          std::span<const host::operand_view<value_type>>(views), traits::spec.output.view(),
          out.local().data(), std::span<const std::size_t>(out.local_extents()));
      if constexpr (traits::plan.output_steps.size() == 0) {
        return typename traits::result_type(mesh, out.extents(), std::move(out.storage()));
      } else {
        return redistribute_to<traits::plan.result>(std::move(out));
      }
    }
    (std::index_sequence_for<X...>{});
  }
}
}  // namespace detail

// einsum<Spec, Options...>(a) and (a, b): the user's line is where the call was written.
template <fixed_string Spec, class O1 = void, class O2 = void, sharded_tensor A>
auto einsum(const A& a, source_site at = source_site::current()) {
  return detail::einsum_at<Spec, O1, O2>(at, a);
}
template <fixed_string Spec, class O1 = void, class O2 = void, sharded_tensor A, sharded_tensor B>
auto einsum(const A& a, const B& b, source_site at = source_site::current()) {
  return detail::einsum_at<Spec, O1, O2>(at, a, b);
}
// Any other number of operands: einsum_at's checks name what is wrong.
template <fixed_string Spec, class O1 = void, class O2 = void, sharded_tensor... X>
requires(sizeof...(X) != 1 && sizeof...(X) != 2) auto einsum(const X&... xs) {
  return detail::einsum_at<Spec, O1, O2>(source_site::current(), xs...);
}

}  // namespace zest
