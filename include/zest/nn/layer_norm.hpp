// zest/nn/layer_norm.hpp — layer normalisation over the model dim, with gain and bias.
#pragma once

#include <string>

#include "zest/autodiff/ops.hpp"
#include "zest/core/source_site.hpp"
#include "zest/zero/parameter.hpp"

namespace zest {

template <training_policy_type P, char D = 'm', class Base = layout<>>
class layer_norm_layer {
  static constexpr fixed_string<2> dims = [] {
    fixed_string<2> s;
    s.set(0, D);
    return s;
  }();

 public:
  using parameter_type = parameter<P, dims, Base>;

  layer_norm_layer(zero_engine<P>& engine, const std::string& name, std::size_t width,
                   double eps = 1e-5)
      : gain_(engine, name + ".weight", {width}, init::constant{1.0}, /*decay=*/false),
        bias_(engine, name + ".bias", {width}, init::constant{0.0}, /*decay=*/false),
        eps_(eps) {}

  template <sharded_tensor X>
  auto operator()(const autodiff::variable<X>& x, source_site at = source_site::current()) const {
    const user_call user(at);
    return autodiff::layer_norm<D>(x, gain_.value(), bias_.value(), eps_);
  }

 private:
  parameter_type gain_, bias_;
  double eps_;
};

}  // namespace zest
