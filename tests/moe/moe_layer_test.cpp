// The MoE layer (zest/moe/moe_layer.hpp) under the ZeRO engine on mesh<"dp", "ep">: the
// index path equals the einsum path; N ranks (each 2-D shape of the world size) equal one
// rank (the same mesh type over MPI_COMM_SELF), output and gradients of the input, gate and experts, under ZeRO stages
// 0 and 3, with even and uneven group counts (a rank without tokens); the all-to-all bytes
// of a forward and backward equal the layer's formula and the closed form; E that does not
// divide over the expert axis throws (the static case is tests/compile_fail/
// moe_experts_not_divisible.cpp).
#include <doctest/doctest.h>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/moe/moe_layer.hpp"

TEST_SUITE_BEGIN("moe_layer");
// One namespace per file: the files of this folder share one unity translation unit.
namespace moe_layer_tests {

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

using mesh2 = mesh<"dp", "ep">;
using tokens = layout<split<'b', "dp", "ep">>;

template <class Mesh, int Stage>
using policy_of = training_policy<Mesh, zero_stage<Stage>>;

// The layer's E check happens before any parameter exists, at compile time when both sizes
// are static; a consistent static pair compiles.
static_assert(sizeof(moe::moe_layer<policy_of<mesh2, 0>, "ep", 8, 4>) > 0);

struct setup {
  std::size_t batch = 4, time = 8, width = 8, hidden = 12, experts = 4;
  moe::gating_options gating{.top_k = 2, .capacity_factor = 1.0, .seed = 11};
  bool index_path = true;
  bool biases = true;
};

struct layer_result {
  std::vector<double> y, dx, aux, z;
  std::map<std::string, std::vector<double>> grads;
  std::int64_t dropped = 0, kept = 0;  // summed over ranks
  std::size_t capacity = 0;
  std::uint64_t all_to_all_forward = 0, all_to_all_step = 0;
  moe::all_to_all_volume formula;
};

template <class V>
std::vector<double> as_double(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

std::int64_t sum_over_world(std::int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

// One forward and backward of the layer; loss = sum(y * R) + 0.1 aux + 0.01 z.
template <int Stage, class Tokens = tokens, class Mesh>
layer_result run_layer(const Mesh& m, const setup& s, bool world) {
  using P = policy_of<Mesh, Stage>;
  using x_t = tensor<float, Mesh, "btm", Tokens>;
  using r_t = tensor<float, Mesh, "btm">;
  zero_engine<P> engine(m, {.seed = 5});
  const std::size_t group = engine.begin_group("moe");
  moe::moe_layer<P> layer(engine, "moe", s.width, s.hidden, s.experts, s.gating, s.index_path,
                          s.biases);
  engine.end_group();
  const std::array<std::size_t, 3> xe{s.batch, s.time, s.width};
  const auto xg = global_values(xe, 1);
  const auto rg = global_values(xe, 2);
  const std::vector<float> xv(xg.begin(), xg.end()), rv(rg.begin(), rg.end());
  ad::tape t;
  auto x = t.parameter(x_t::from_global(m, xe, std::span<const float>(xv)));
  m.reset_stats();
  layer_result out;
  auto [y, loss] = [&] {
    auto in_scope = engine.use(t, group);
    auto y = layer(x);
    static_assert(std::is_same_v<decltype(y), ad::variable<x_t>>);
    auto r = t.constant(r_t::from_global(m, xe, std::span<const float>(rv)));
    auto loss =
        ad::sum(y * r) + ad::scale(layer.aux_loss(), 0.1F) + ad::scale(layer.z_loss(), 0.01F);
    return std::pair{y, loss};
  }();
  out.all_to_all_forward = m.stats()[collective::all_to_all].bytes_sent;
  engine.backward(loss);
  out.all_to_all_step = m.stats()[collective::all_to_all].bytes_sent;
  out.formula = layer.last_all_to_all();
  out.capacity = layer.capacity();
  out.y = as_double(to_global(y.value()));
  out.dx = as_double(to_global(x.grad()));
  out.aux = as_double(to_global(layer.aux_loss().value()));
  out.z = as_double(to_global(layer.z_loss().value()));
  out.grads["gate"] = as_double(to_global(layer.gate().gradient_buffer_tensor()));
  out.grads["in_weight"] = as_double(to_global(layer.in_weight().gradient_buffer_tensor()));
  out.grads["out_weight"] = as_double(to_global(layer.out_weight().gradient_buffer_tensor()));
  if (s.biases) {
    out.grads["in_bias"] = as_double(to_global(layer.in_bias().gradient_buffer_tensor()));
    out.grads["out_bias"] = as_double(to_global(layer.out_bias().gradient_buffer_tensor()));
  }
  std::int64_t kept = 0;
  for (auto k : layer.stats().kept_per_expert) kept += k;
  // Each rank counts its groups; a replica over an axis that does not split the tokens
  // counts once.
  bool counts = true;
  for (std::size_t a = 0; a < Mesh::axis_count; ++a) {
    if (!x_t::layout.is_split(a) && m.coord(a) != 0) counts = false;
  }
  const std::int64_t dropped = counts ? layer.stats().dropped : 0;
  out.dropped = world ? sum_over_world(dropped) : dropped;
  out.kept = world ? sum_over_world(counts ? kept : 0) : kept;
  return out;
}

// Largest |a - b| over the largest |b|: relative to the tensor's own scale (the values and
// gradients here are far below 1), and b must not vanish.
double relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  if (a.size() != b.size()) return 1e30;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? worst / scale : 1e30;
}

void check_same(const layer_result& a, const layer_result& b, double tolerance) {
  CHECK(relative(a.y, b.y) < tolerance);
  CHECK(relative(a.dx, b.dx) < tolerance);
  CHECK(relative(a.aux, b.aux) < tolerance);
  CHECK(relative(a.z, b.z) < tolerance);
  REQUIRE(a.grads.size() == b.grads.size());
  for (const auto& [name, g] : b.grads) {
    CAPTURE(name);
    CHECK(relative(a.grads.at(name), g) < tolerance);
  }
  CHECK(a.capacity == b.capacity);
  CHECK(a.dropped == b.dropped);
  CHECK(a.kept == b.kept);
}

std::vector<mesh2> meshes() {
  std::vector<mesh2> out;
  for (const auto& sh : mesh_shapes())
    out.emplace_back(MPI_COMM_WORLD, std::array<int, 2>{sh[0], sh[1]});
  return out;
}

template <int Stage, class Tokens = tokens>
void check_against_one_rank(const setup& s) {
  // One rank: the same mesh type over MPI_COMM_SELF, so the layer is compiled once per stage.
  const mesh2 one(MPI_COMM_SELF, std::array<int, 2>{1, 1});
  const layer_result want = run_layer<Stage, Tokens>(one, s, false);
  CHECK(want.dropped > 0);  // the capacity binds: the drop path is exercised
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    const layer_result got = run_layer<Stage, Tokens>(m, s, true);
    check_same(got, want, 1e-5);
    CHECK(got.all_to_all_forward == got.formula.forward());
    CHECK(got.all_to_all_step == got.formula.step());
  }
}

}  // namespace

TEST_CASE("moe_layer: the index path equals the einsum path") {
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    for (int k : {1, 2}) {
      CAPTURE(k);
      setup s;
      s.gating.top_k = k;
      s.index_path = true;
      const layer_result a = run_layer<0>(m, s, true);
      s.index_path = false;
      const layer_result b = run_layer<0>(m, s, true);
      check_same(a, b, 1e-5);
      CHECK(a.all_to_all_step == b.all_to_all_step);
    }
  }
}

TEST_CASE("moe_layer: N ranks equal one rank (ZeRO 0 and 3, both paths)") {
  for (bool index : {true, false}) {
    CAPTURE(index);
    setup s;
    s.index_path = index;
    SUBCASE("even groups, top-2 with random routing") {
      check_against_one_rank<0>(s);
      check_against_one_rank<3>(s);
    }
    SUBCASE("uneven groups (3 sequences: a rank may hold none), Switch top-1, no biases") {
      s.batch = 3;
      s.gating.top_k = 1;
      s.gating.capacity_factor = 0.75;
      s.biases = false;
      check_against_one_rank<0>(s);
      check_against_one_rank<3>(s);
    }
    SUBCASE("tokens replicated over the expert axis: a slice there, an all-gather back") {
      check_against_one_rank<2, layout<split<'b', "dp">>>(s);
    }
  }
}

TEST_CASE("moe_layer: all-to-all bytes per layer, closed form") {
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    const setup s;
    const layer_result r = run_layer<3>(m, s, true);
    // Even splits: each of the four all-to-alls moves (n - 1)/n of the local "egcm" block.
    const auto n = static_cast<std::size_t>(m.size(1));
    const std::size_t groups = s.batch / static_cast<std::size_t>(m.world_size());
    const std::size_t block = s.experts * groups * r.capacity * s.width * sizeof(float);
    CHECK(r.all_to_all_step == 4 * (n - 1) * block / n);
    CHECK(r.all_to_all_forward == 2 * (n - 1) * block / n);
    CHECK(r.formula.step() == r.all_to_all_step);
  }
}

TEST_CASE("moe_layer: E must divide over the expert axis") {
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    using P = policy_of<mesh2, 0>;
    zero_engine<P> engine(m);
    const auto n = static_cast<std::size_t>(m.size(1));
    if (n > 1) {
      CHECK_THROWS_WITH_AS(moe::moe_layer<P>(engine, "moe", 8, 8, n + 1),
                           doctest::Contains("do not divide over the expert axis 'ep'"),
                           shape_error);
    }
    CHECK_THROWS_AS(moe::moe_layer<P>(engine, "moe0", 8, 8, 0), shape_error);
    // The static sizes must match the mesh and the constructor's E.
    CHECK_THROWS_WITH_AS((moe::moe_layer<P, "ep", 8, 8>(engine, "moe1", 8, 8, 8)),
                         doctest::Contains("the layer's type says 8"), shape_error);
    CHECK_THROWS_AS((moe::moe_layer<P, "ep", 4>(engine, "moe2", 8, 8, 8)), shape_error);
    CHECK(engine.parameter_count() == 0);  // nothing registered by the failed constructions
    moe::moe_layer<P> ok(engine, "moe3", 8, 8, 4 * n);
    CHECK(ok.experts() == 4 * n);
  }
}

}  // namespace moe_layer_tests

TEST_SUITE_END();
