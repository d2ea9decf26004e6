// A Megatron-style tensor-parallel MLP built from zest's parameters and linears, as a user
// would (examples/custom_layer.cpp explains it step by step), and a regression task for it.
//
//   x "btm" split(b:dp) -> W1 "mh", b1 "h" split(h:tp) -> GELU -> W2 "hm" split(h:tp)
//   -> "btm" partial(tp) -> all-reduce over tp -> + b2 "m" (replicated)
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/nn/linear.hpp"
#include "zest/zero/engine.hpp"
#include "zest/zero/parameter.hpp"

namespace zest::testing {

template <training_policy_type P>
class tp_mlp {
 public:
  using on_tp = layout<split<'h', "tp">>;
  using fc_type = linear<P, "btm,mh->bth", "mh", "h", on_tp, on_tp>;  // column-parallel
  using proj_type = linear<P, "bth,hm->btm", "hm", "", on_tp>;        // row-parallel
  using bias_type = parameter<P, "m">;                                // replicated

  tp_mlp(zero_engine<P>& engine, const std::string& name, std::size_t width, std::size_t hidden)
      : engine_(&engine),
        group_(engine.begin_group(name)),
        fc_(engine, name + ".fc", {width, hidden}, {hidden}, 0.3),
        proj_(engine, name + ".proj", {hidden, width}, {}, 0.15),
        bias_(engine, name + ".proj.bias", {width}, init::constant{0.0}, /*decay=*/false) {
    engine.end_group();
  }

  // x "btm" split(b:dp), whole on tp; so is the result.
  template <sharded_tensor X>
  auto operator()(autodiff::tape& t, const autodiff::variable<X>& x) const {
    auto in_scope = engine_->use(t, group_);
    auto partial_sum = proj_(autodiff::gelu(fc_(x)));
    return autodiff::broadcast_add(autodiff::redistribute<layout<split<'b', "dp">>>(partial_sum),
                                   bias_.value());
  }

 private:
  zero_engine<P>* engine_;
  std::size_t group_;
  fc_type fc_;
  proj_type proj_;
  bias_type bias_;
};

struct tp_sizes {
  std::size_t batch = 8, time = 4, width = 16, hidden = 64;
};

// Mean squared error of the MLP against a fixed nonlinear target.
template <training_policy_type P>
struct tp_regression {
  tp_mlp<P> mlp;
  tp_regression(zero_engine<P>& engine, const tp_sizes& s)
      : mlp(engine, "mlp", s.width, s.hidden) {}

  template <sharded_tensor X>
  auto loss(autodiff::tape& t, const X& inputs, const X& targets, std::uint64_t) const {
    auto d = mlp(t, t.constant(inputs)) - t.constant(targets);
    return autodiff::scale(autodiff::sum(d * d), 1.0F / static_cast<float>(inputs.size()));
  }
};

// Step k's inputs (N(0, 1)) and targets, functions of the global index: "btm" split(b:dp).
template <class Mesh>
auto tp_batch(const Mesh& mesh, const tp_sizes& s, std::int64_t step) {
  using x_t = tensor<float, Mesh, "btm", layout<split<'b', "dp">>>;
  const auto seed = static_cast<std::uint64_t>(step) + 100;
  auto x_at = [&](std::size_t b, std::size_t t, std::size_t m) {
    return init::normal{1.0}(seed, (b * s.time + t) * s.width + m);
  };
  const typename x_t::extents_type e{s.batch, s.time, s.width};
  auto x = x_t::generate(mesh, e, [&](const auto& i) { return x_at(i[0], i[1], i[2]); });
  auto y = x_t::generate(mesh, e, [&](const auto& i) {
    return std::tanh(x_at(i[0], i[1], i[2])) + 0.5 * x_at(i[0], i[1], (i[2] + 1) % s.width);
  });
  return std::pair{std::move(x), std::move(y)};
}

}  // namespace zest::testing
