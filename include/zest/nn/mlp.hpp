// zest/nn/mlp.hpp — the transformer's feed-forward layer: GELU(x W1 + b1) W2 + b2.
//
// On a mesh with "tp" the hidden dim is split over it (zest/nn/tensor_parallel.hpp): W1 and
// b1 column-parallel, W2 row-parallel, its output reduced into x's layout before b2.
// EinsumPolicy is its linears' (zest/nn/linear.hpp): no_communication<> guards them.
#pragma once

#include <string>

#include "zest/autodiff/ops.hpp"
#include "zest/core/source_site.hpp"
#include "zest/nn/linear.hpp"
#include "zest/nn/tensor_parallel.hpp"

namespace zest {

template <training_policy_type P, einsum_policy EinsumPolicy = gather_weights>
class mlp {
 public:
  mlp(zero_engine<P>& engine, const std::string& name, std::size_t width, std::size_t hidden,
      double residual_std = 0.02)
      : fc_(engine, name + ".fc", {width, hidden}, {hidden}),
        proj_(engine, name + ".proj", {hidden, width}, {width}, residual_std) {}

  // x "btm"; the result has x's layout.
  template <sharded_tensor X>
  auto operator()(const autodiff::variable<X>& x, source_site at = source_site::current()) const {
    const user_call user(at);
    const auto whole = whole_on_tp<P>(x);
    return proj_.template into<layout_like<X>>(autodiff::gelu(fc_(whole)));
  }

 private:
  using hidden_split = split_over_tp<P, 'h'>;
  linear<P, "btm,mh->bth", "mh", "h", hidden_split, hidden_split, EinsumPolicy> fc_;
  linear<P, "bth,hm->btm", "hm", "m", hidden_split, layout<>, EinsumPolicy> proj_;
};

}  // namespace zest
