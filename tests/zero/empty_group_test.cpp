// Engine groups that hold no parameters (a custom layer with none, entered like any other):
// under every ZeRO stage and rank count a model with empty groups first, between and last
// trains exactly as the same model without them (losses, parameters, and the collectives:
// an empty group communicates nothing). Under ZeRO-3 on 2 ranks entering one used to throw
// an internal all_gather count error.
//
// And the slip that leads to empty groups: a layer that declares its group member after its
// sub-layers (members are constructed in declaration order, so the sub-layers' parameters are
// registered before begin_group, each as a group of its own). Using it throws, on every rank
// and stage, an error that names the slip and the fix.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/mpi_test.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/linear.hpp"
#include "zest/train/train_step.hpp"
#include "zest/zero/engine.hpp"
#include "zest/zero/parameter.hpp"

namespace {
using namespace zest;
namespace ad = zest::autodiff;

using mesh_t = mesh<"dp">;
using x_t = tensor<float, mesh_t, "btm", layout<split<'b', "dp">>>;
constexpr std::size_t batch = 8, time = 3, width = 6, hidden = 10;

// A layer with a group and no parameters: gelu, or x passed through.
template <class P>
class parameterless_layer {
 public:
  parameterless_layer(zero_engine<P>& engine, const std::string& name, bool gelu)
      : engine_(&engine), group_(engine.begin_group(name)), gelu_(gelu) {
    engine.end_group();
  }
  template <sharded_tensor X>
  ad::variable<X> operator()(ad::tape& t, const ad::variable<X>& x) const {
    auto in_scope = engine_->use(t, group_);
    if (gelu_) return ad::gelu(x);
    return x;
  }

 private:
  zero_engine<P>* engine_;
  std::size_t group_;
  bool gelu_;
};

// A linear layer (no bias) in a group of its own, the group member declared first.
template <class P, fixed_string Spec, fixed_string WDims>
class dense_layer {
 public:
  using linear_type = linear<P, Spec, WDims>;
  dense_layer(zero_engine<P>& engine, const std::string& name,
              const typename linear_type::weight_type::extents_type& extents)
      : engine_(&engine), group_(engine.begin_group(name)), fc_(engine, name, extents, {}, 0.3) {
    engine.end_group();
  }
  template <sharded_tensor X>
  auto operator()(ad::tape& t, const ad::variable<X>& x) const {
    auto in_scope = engine_->use(t, group_);
    return fc_(x);
  }

 private:
  zero_engine<P>* engine_;
  std::size_t group_;
  linear_type fc_;
};

template <class P>
std::optional<parameterless_layer<P>> maybe_layer(zero_engine<P>& e, bool make,
                                                  const std::string& name, bool gelu) {
  if (!make) return std::nullopt;
  return std::optional<parameterless_layer<P>>(std::in_place, e, name, gelu);
}

// up, gelu, down. With empty groups: one first (passes x), gelu in one between up and down,
// one last (passes y); without: gelu in no group. The groups are made in member order.
template <class P>
struct model {
  std::optional<parameterless_layer<P>> first;
  dense_layer<P, "btm,mh->bth", "mh"> up;
  std::optional<parameterless_layer<P>> middle;
  dense_layer<P, "bth,hm->btm", "hm"> down;
  std::optional<parameterless_layer<P>> last;

  model(zero_engine<P>& e, bool empty_groups)
      : first(maybe_layer(e, empty_groups, "first", false)),
        up(e, "up", {width, hidden}),
        middle(maybe_layer(e, empty_groups, "middle", true)),
        down(e, "down", {hidden, width}),
        last(maybe_layer(e, empty_groups, "last", false)) {}

  template <sharded_tensor X>
  auto loss(ad::tape& t, const X& inputs, const X& targets, std::uint64_t) const {
    auto x = t.constant(inputs);
    if (first) x = (*first)(t, x);
    auto h = up(t, x);
    h = middle ? (*middle)(t, h) : ad::gelu(h);
    auto y = down(t, h);
    if (last) y = (*last)(t, y);
    auto d = y - t.constant(targets);
    return ad::scale(ad::sum(d * d), 1.0F / static_cast<float>(inputs.size()));
  }
};

// Step k's batch, the same global values on every mesh.
std::pair<x_t, x_t> make_batch(const mesh_t& m, std::int64_t step) {
  const auto seed = static_cast<std::uint64_t>(step) + 11;
  auto at = [&](const auto& i) { return ((i[0] * time + i[1]) * width + i[2]); };
  auto x = x_t::generate(m, {batch, time, width},
                         [&](const auto& i) { return float(init::normal{1.0}(seed, at(i))); });
  auto y = x_t::generate(m, {batch, time, width}, [&](const auto& i) {
    return std::tanh(float(init::normal{1.0}(seed, at(i))));
  });
  return {std::move(x), std::move(y)};
}

struct run_result {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> parameters;
  std::vector<std::uint64_t> calls, bytes;  // per step, over the data axis
  std::size_t groups = 0, peak_live = 0;
};

template <int Stage>
run_result train(bool empty_groups, std::size_t max_live_groups = 2) {
  using P = training_policy<mesh_t, zero_stage<Stage>>;
  const mesh_t m(MPI_COMM_WORLD, {testing::world().size});
  zero_engine<P> engine(m, {.seed = 5, .max_live_groups = max_live_groups});
  const model<P> net(engine, empty_groups);
  run_result r;
  r.groups = engine.group_count();
  for (std::int64_t k = 0; k < 3; ++k) {
    const auto [in, tg] = make_batch(m, k);
    const auto s = train_step(engine, net, in, tg, 0.05, static_cast<std::uint64_t>(k));
    r.losses.push_back(s.loss);
    r.calls.push_back(s.traffic.calls());
    r.bytes.push_back(s.traffic.bytes_sent());
  }
  for (const auto* p : engine.parameters()) r.parameters[p->name()] = p->whole_value();
  r.peak_live = engine.peak_live_groups();
  return r;
}

template <int Stage>
void check_stage() {
  CAPTURE(Stage);
  const run_result with = train<Stage>(true);
  const run_result without = train<Stage>(false);
  CHECK(with.groups == 5);
  CHECK(without.groups == 2);
  REQUIRE(with.losses.size() == without.losses.size());
  for (std::size_t k = 0; k < with.losses.size(); ++k) {
    CAPTURE(k);
    CHECK(with.losses[k] == doctest::Approx(without.losses[k]).epsilon(1e-12));
  }
  CHECK(with.losses.back() < with.losses.front());  // it trains
  CHECK(with.parameters == without.parameters);
  // An empty group communicates nothing, and is never a live (gathered) group.
  CHECK(with.calls == without.calls);
  CHECK(with.bytes == without.bytes);
  CHECK(with.peak_live == without.peak_live);
  // The bound on live groups still holds with the empty groups in between.
  const run_result one = train<Stage>(true, 1);
  CHECK(one.losses == with.losses);
  if constexpr (Stage == 3) CHECK(one.peak_live == 1);
}

// ---- The slip: the group member declared after the sub-layers ------------------------------
// (With the initialiser list in the other order, -Wreorder warns; in this order, nothing does.)
template <class P>
class slipped_layer {
 public:
  slipped_layer(zero_engine<P>& engine, const std::string& name)
      : engine_(&engine),
        fc_(engine, name + ".fc", {width, hidden}, {}, 0.3),
        group_(engine.begin_group(name)) {  // too late: fc_ is made, outside any group
    engine.end_group();
  }
  template <sharded_tensor X>
  auto operator()(ad::tape& t, const ad::variable<X>& x) const {
    auto in_scope = engine_->use(t, group_);
    return fc_(x);
  }

 private:
  zero_engine<P>* engine_;
  linear<P, "btm,mh->bth", "mh"> fc_;  // constructed before group_: the slip
  std::size_t group_;
};

template <int Stage>
void check_slip() {
  CAPTURE(Stage);
  using P = training_policy<mesh_t, zero_stage<Stage>>;
  const mesh_t m(MPI_COMM_WORLD, {testing::world().size});
  zero_engine<P> engine(m, {.seed = 5});
  const slipped_layer<P> layer(engine, "mlp");
  // The parameter went into a group of its own; "mlp" is empty.
  REQUIRE(engine.group_count() == 2);
  CHECK(engine.group_name(0) == "mlp.fc.weight");
  CHECK(engine.group_name(1) == "mlp");
  const auto [in, tg] = make_batch(m, 0);
  std::string message;
  try {
    ad::tape t;
    (void)layer(t, t.constant(in));
  } catch (const std::logic_error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("zest parameter 'mlp.fc.weight': used outside its group's scope") !=
        std::string::npos);
  CHECK(message.find("made before begin_group(\"mlp\")") != std::string::npos);
  CHECK(message.find("declared before the sub-layers") != std::string::npos);
  CHECK(message.find("Fix:") != std::string::npos);
  engine.discard_forward();
}

}  // namespace

TEST_CASE("empty engine groups train like the same model without them, every stage") {
  check_stage<0>();
  check_stage<1>();
  check_stage<2>();
  check_stage<3>();
}

TEST_CASE("a group member declared after its sub-layers: an error that names the slip") {
  check_slip<0>();
  check_slip<1>();
  check_slip<2>();
  check_slip<3>();
}
