// zest/nn/mlp.hpp — the transformer's feed-forward layer: GELU(x W1 + b1) W2 + b2.
#pragma once

#include <string>

#include "zest/autodiff/ops.hpp"
#include "zest/nn/linear.hpp"

namespace zest {

template <training_policy_type P>
class mlp {
 public:
  mlp(zero_engine<P>& engine, const std::string& name, std::size_t width, std::size_t hidden,
      double residual_std = 0.02)
      : fc_(engine, name + ".fc", {width, hidden}, {hidden}),
        proj_(engine, name + ".proj", {hidden, width}, {width}, residual_std) {}

  template <sharded_tensor X>
  auto operator()(const autodiff::variable<X>& x) const {
    return proj_(autodiff::gelu(fc_(x)));
  }

 private:
  linear<P, "btm,mh->bth", "mh", "h"> fc_;
  linear<P, "bth,hm->btm", "hm", "m"> proj_;
};

}  // namespace zest
