// zest/nn/linear.hpp — y = x W (+ b) as one einsum, for any dims and placements.
//
//   zest::linear<P, "btm,mh->bth", "mh", "h"> fc(engine, "mlp.fc", {m, h}, {h});
//   auto y = fc(x);                         // x: variable of "btm"; y: "bth"
//
// The spec says which dims the weight contracts and which it adds; Bias names the bias's
// dims (a suffix of the output's, "" for none). WBase and BBase place the weight and bias on
// mesh axes other than the data axis (the ZeRO stage owns that one): a Megatron
// column-parallel layer is linear<P, "btm,mh->bth", "mh", "h", layout<split<'h', "tp">>,
// layout<split<'h', "tp">>>, see examples/custom_layer.cpp. The einsum then derives every
// collective, forward and backward.
//
// EinsumPolicy (zest/einsum/policy.hpp, docs/einsum-policies.md) is the product's policy:
// gather_weights by default; zest::no_communication<> guards the layer, so that an input
// whose layout would make the product move the weight (a sequence-split stream fed to a
// column-parallel layer: an all-gather of the weight over tp) does not compile.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>

#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/source_site.hpp"
#include "zest/nn/tensor_parallel.hpp"
#include "zest/zero/parameter.hpp"

namespace zest {

template <training_policy_type P, fixed_string Spec, fixed_string WDims, fixed_string BDims = "",
          class WBase = layout<>, class BBase = layout<>,
          einsum_policy EinsumPolicy = gather_weights>
class linear {
 public:
  using einsum_policy_type = EinsumPolicy;
  static constexpr bool has_bias = BDims.size() > 0;
  using weight_type = parameter<P, WDims, WBase>;
  using bias_type = std::conditional_t<has_bias, parameter<P, BDims, BBase>, weight_type>;

  // Weight ~ N(0, init_std), bias 0.
  linear(zero_engine<P>& engine, const std::string& name,
         const typename weight_type::extents_type& weight_extents,
         const typename bias_type::extents_type& bias_extents = {}, double init_std = 0.02)
      : weight_(engine, name + ".weight", weight_extents, init::normal{init_std}) {
    if constexpr (has_bias) {
      bias_.emplace(engine, name + ".bias", bias_extents, init::constant{0.0}, /*decay=*/false);
    }
  }

  template <sharded_tensor X>
  auto operator()(const autodiff::variable<X>& x, source_site at = source_site::current()) const {
    return into<void>(x, at);
  }

  // The product, computed where the operands are, then brought to layout Out before the bias
  // is added: a row-parallel layer's pending sum over "tp" reduced into the residual stream's
  // layout (an all-reduce, or a reduce-scatter into a sequence-split stream;
  // zest/nn/tensor_parallel.hpp). Out = void: the einsum's own layout. (Forcing the einsum's
  // layout instead would let its planner gather the operands over tp, fewer bytes than the
  // reduction but every tp rank computing the whole product.)
  template <class Out, sharded_tensor X>
  auto into(const autodiff::variable<X>& x, source_site at = source_site::current()) const {
    const user_call user(at);
    auto y = [&] {
      if constexpr (std::is_void_v<Out>) {
        return autodiff::einsum<Spec, EinsumPolicy>(x, weight_.value());
      } else {
        return autodiff::redistribute<Out>(
            autodiff::einsum<Spec, EinsumPolicy>(x, weight_.value()));
      }
    }();
    if constexpr (has_bias) {
      return autodiff::broadcast_add(y, bias_->value());
    } else {
      return y;
    }
  }

  const weight_type& weight() const { return weight_; }
  const bias_type& bias() const requires has_bias { return *bias_; }

 private:
  weight_type weight_;
  std::optional<bias_type> bias_;
};

}  // namespace zest
