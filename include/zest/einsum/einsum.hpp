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
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/einsum/plan.hpp"
#include "zest/einsum/policy.hpp"
#include "zest/einsum/spec.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

namespace einsum_error {
template <class>
inline constexpr bool always_false = false;
template <fixed_string Spec>
struct bad_spec_missing_arrow {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: the spec has no \"->\". Fix: name the output, e.g. einsum<\"ik,kj->ij\">.");
};
template <fixed_string Spec>
struct bad_spec_character {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: the spec has a character that is not a dim letter (a-z, A-Z), ',' or "
                "\"->\". Fix: one letter per dim, e.g. \"bsm,mh->bsh\".");
};
template <fixed_string Spec>
struct bad_spec_repeated_letter {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: a letter repeats within one term of the spec; a tensor has each dim "
                "once. Fix: give the dims distinct letters (traces are not supported).");
};
template <fixed_string Spec>
struct bad_spec_unknown_output_letter {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: an output letter appears in no operand. Fix: every output dim must "
                "come from an operand.");
};
template <fixed_string Spec>
struct bad_spec_size {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: the spec has no operand, or more operands or dims than "
                "zest::max_operands / zest::max_dims allow.");
};
template <fixed_string Spec, std::size_t SpecOperands, std::size_t Given>
struct operand_count_mismatch {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: the spec names a different number of operands than were passed "
                "(both counts are shown above). Fix: pass one tensor per term before \"->\".");
};
template <fixed_string Spec, std::size_t Operand, fixed_string TensorDims>
struct operand_dims_mismatch {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: an operand's dims differ from its term in the spec (operand index "
                "and its dims are shown above). Fix: write the term with the tensor's dims in "
                "their stored order.");
};
template <class Mesh0, class MeshI>
struct mesh_mismatch {
  static_assert(always_false<Mesh0>,
                "zest einsum: operands live on different mesh types. Fix: build them on one mesh.");
};
template <class T0, class TI>
struct element_type_mismatch {
  static_assert(always_false<T0>,
                "zest einsum: operands have different element types. Fix: convert one first.");
};
template <fixed_string Spec, class Mesh, std::size_t Axis>
struct partial_twice {
  static_assert(always_false<decltype(Spec)>,
                "zest einsum: two operands are partial sums over the same mesh axis; the product "
                "of sums is not the sum of products. Fix: reduce one first, e.g. "
                "redistribute<layout<...>>(t) to replicate or split on that axis.");
};
template <class Policy>
struct communication_forbidden {
  static_assert(always_false<Policy>,
                "zest einsum: this einsum needs a collective before its contraction, but the policy "
                "no_communication forbids it. Fix: redistribute the operands first (explain<spec>(...) "
                "shows which), or choose another policy.");
};
template <class Option>
struct unknown_option {
  static_assert(always_false<Option>,
                "zest einsum: an option is neither a policy (gather_weights, keep_weights, "
                "no_communication<>) nor an output layout zest::layout<...>.");
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
  using pick_policy = std::conditional_t<einsum_policy<A>, A, std::conditional_t<einsum_policy<B>, B, gather_weights>>;
  template <class A, class B>
  using pick_layout = std::conditional_t<is_layout_type<A>::value, A, std::conditional_t<is_layout_type<B>::value, B, void>>;

  using policy = pick_policy<O1, O2>;
  using forced_layout = pick_layout<O1, O2>;
  static constexpr bool ok = known<O1> && known<O2>;
};

template <fixed_string Spec>
inline constexpr einsum_spec parsed_spec = parse_einsum(Spec.view());

template <fixed_string Spec>
constexpr bool diagnose_spec() {
  constexpr einsum_spec s = parsed_spec<Spec>;
  using enum spec_problem;
  if constexpr (s.problem == missing_arrow) {
    (void)einsum_error::bad_spec_missing_arrow<Spec>{};
  } else if constexpr (s.problem == bad_character) {
    (void)einsum_error::bad_spec_character<Spec>{};
  } else if constexpr (s.problem == repeated_in_term) {
    (void)einsum_error::bad_spec_repeated_letter<Spec>{};
  } else if constexpr (s.problem == output_letter_not_in_operands) {
    (void)einsum_error::bad_spec_unknown_output_letter<Spec>{};
  } else if constexpr (s.problem != none) {
    (void)einsum_error::bad_spec_size<Spec>{};
  }
  return s.ok();
}

template <fixed_string Spec, std::size_t I, class X>
constexpr bool diagnose_operand() {
  constexpr einsum_spec s = parsed_spec<Spec>;
  if constexpr (s.inputs[I].view() != X::dims.view()) {
    (void)einsum_error::operand_dims_mismatch<Spec, I, X::dims>{};
    return false;
  }
  return true;
}

template <fixed_string Spec, class X0, class... X>
constexpr bool diagnose_operands() {
  constexpr einsum_spec s = parsed_spec<Spec>;
  constexpr std::size_t given = 1 + sizeof...(X);
  if constexpr (s.operand_count != given) {
    (void)einsum_error::operand_count_mismatch<Spec, s.operand_count, given>{};
    return false;
  } else if constexpr (!(std::is_same_v<typename X0::mesh_type, typename X::mesh_type> && ...)) {
    (void)einsum_error::mesh_mismatch<typename X0::mesh_type, void>{};
    return false;
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (diagnose_operand<Spec, I, std::tuple_element_t<I, std::tuple<X0, X...>>>() && ...);
    }(std::make_index_sequence<given>{});
  }
}

template <fixed_string Spec, std::size_t N>
constexpr auto output_dims() {
  constexpr einsum_spec s = parsed_spec<Spec>;
  fixed_string<N + 1> out;
  for (std::size_t i = 0; i < N; ++i) out.data[i] = s.output.letters[i];
  return out;
}

// Everything einsum<Spec, O1, O2>(X...) decides at compile time.
template <fixed_string Spec, class O1, class O2, class... X>
struct einsum_traits {
  using options = einsum_options<O1, O2>;
  using first = std::tuple_element_t<0, std::tuple<X...>>;
  using mesh_type = typename first::mesh_type;
  using value_type = typename first::value_type;
  static constexpr einsum_spec spec = parsed_spec<Spec>;

  static constexpr bool valid_input = [] {
    if constexpr (!options::ok) {
      (void)einsum_error::unknown_option<std::conditional_t<options::template known<O1>, O2, O1>>{};
      return false;
    } else if constexpr (!diagnose_spec<Spec>()) {
      return false;
    } else if constexpr (!diagnose_operands<Spec, X...>()) {
      return false;
    } else if constexpr (!(std::is_same_v<value_type, typename X::value_type> && ...)) {
      (void)einsum_error::element_type_mismatch<value_type, void>{};
      return false;
    } else {
      return true;
    }
  }();

  static constexpr einsum_plan compute_plan() {
    if constexpr (!valid_input) {
      return einsum_plan{};
    } else {
      std::array<layout_value, max_operands> in{};
      std::size_t i = 0;
      ((in[i++] = X::layout), ...);
      using forced_t = typename options::forced_layout;
      if constexpr (std::is_void_v<forced_t>) {
        return plan_einsum(spec, in, options::policy::ranking(sizeof...(X)));
      } else {
        constexpr layout_value forced =
            layout_value_of<mesh_type, output_dims<Spec, parsed_spec<Spec>.output.size>(), forced_t>;
        return plan_einsum(spec, in, options::policy::ranking(sizeof...(X)), &forced);
      }
    }
  }
  static constexpr einsum_plan plan = compute_plan();

  static constexpr bool valid = [] {
    if constexpr (!valid_input) {
      return false;
    } else if constexpr (plan.problem == einsum_problem::partial_twice) {
      (void)einsum_error::partial_twice<Spec, mesh_type, plan.problem_axis>{};
      return false;
    } else if constexpr (!options::policy::allows_communication && plan.input_collectives() != 0) {
      (void)einsum_error::communication_forbidden<typename options::policy>{};
      return false;
    } else {
      return true;
    }
  }();

  static constexpr fixed_string out_dims = output_dims<Spec, spec.output.size>();
  using contraction_type = basic_tensor<value_type, mesh_type, out_dims, plan.contraction_output>;
  using result_type = basic_tensor<value_type, mesh_type, out_dims, plan.result>;
};

// The operand as the plan needs it: the tensor itself when its layout already fits.
template <layout_value L, class X>
decltype(auto) in_layout(const X& x) {
  if constexpr (X::layout == L) {
    return (x);
  } else {
    return redistribute_to<L>(x);
  }
}

template <fixed_string Spec, class... X>
void check_extents(const X&... xs) {
  static constexpr const einsum_spec& s = parsed_spec<Spec>;
  std::array<std::size_t, 128> extent{};
  std::array<int, 128> seen_in{};
  seen_in.fill(-1);
  int operand = 0;
  auto visit = [&](const auto& x) {
    const auto& term = s.inputs[static_cast<std::size_t>(operand)];
    for (std::size_t k = 0; k < term.size; ++k) {
      const auto u = static_cast<unsigned char>(term.letters[k]);
      const std::size_t e = x.extents()[k];
      if (seen_in[u] < 0) {
        seen_in[u] = operand;
        extent[u] = e;
      } else if (extent[u] != e) {
        throw shape_error(detail::message("zest: einsum \"", Spec.view(), "\": dim '", term.letters[k],
                                          "' has extent ", extent[u], " in operand ", seen_in[u], " but ", e,
                                          " in operand ", operand));
      }
    }
    ++operand;
  };
  (visit(xs), ...);
}

}  // namespace detail

// The compile-time plan of einsum<Spec, Options...> for operand types X...
template <fixed_string Spec, class O1, class O2, class... X>
inline constexpr einsum_plan einsum_plan_of = detail::einsum_traits<Spec, O1, O2, X...>::plan;

template <fixed_string Spec, class O1 = void, class O2 = void, sharded_tensor... X>
auto einsum(const X&... xs) {
  static_assert(sizeof...(X) > 0, "zest einsum: pass at least one tensor");
  using traits = detail::einsum_traits<Spec, O1, O2, X...>;
  if constexpr (!traits::valid) {
    return 0;  // the diagnostic above is the error; nothing useful to return
  } else {
    using value_type = typename traits::value_type;
    using contraction_t = typename traits::contraction_type;
    detail::check_extents<Spec>(xs...);

    const auto& mesh = std::get<0>(std::forward_as_tuple(xs...)).mesh();
    // Global extent of each output dim, from the first operand that has it.
    typename contraction_t::extents_type out_extents{};
    {
      std::size_t operand = 0;
      auto visit = [&](const auto& x) {
        const auto& term = traits::spec.inputs[operand++];
        for (std::size_t k = 0; k < traits::spec.output.size; ++k) {
          if (term.has(traits::spec.output.letters[k])) out_extents[k] = x.extents()[term.index(traits::spec.output.letters[k])];
        }
      };
      (visit(xs), ...);
    }

    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      // Bring every operand to its planned layout (the plan's collectives happen here).
      std::tuple<decltype(detail::in_layout<traits::plan.operand_layouts[I]>(xs))...> ready{
          detail::in_layout<traits::plan.operand_layouts[I]>(xs)...};
      contraction_t out(mesh, out_extents, contraction_t::uninitialized);
      const std::array<host::operand_view<value_type>, sizeof...(X)> views{host::operand_view<value_type>{
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
    }(std::index_sequence_for<X...>{});
  }
}

}  // namespace zest
