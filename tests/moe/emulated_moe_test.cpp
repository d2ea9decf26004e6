// MoE on the generic code paths (the function objects that the CUDA backend runs as
// kernels), run on the host by zest::emulated_mesh and compared with the host backend's own
// loops on zest::mesh: the same inputs on both, each 2-D shape of the world size.
//   gating     top-2 (random routing, drops) and top-1, float and double: expert_index,
//              slot_index, weight, combine and dispatch, aux and z losses, statistics, and
//              the gradient of the logits from combine, weight, aux and z
//   index path dispatch_by_index and combine_by_index with hand-made indices (two routes
//              sharing a slot, dropped ones), the weight used through a copy (y split on m),
//              values and gradients; an index out of range throws the host's message
//   moe_layer  a forward and backward of the whole layer under ZeRO 0 and 3, both paths
#include <doctest/doctest.h>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/mesh/emulated_mesh.hpp"
#include "zest/moe/moe_layer.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

using host2 = mesh<"dp", "ep">;
using emul2 = emulated_mesh<"dp", "ep">;
using by_group = layout<split<'g', "dp", "ep">>;

static_assert(std::is_same_v<backend_of<emul2>, emulated_backend>);

template <class V>
std::vector<double> as_double(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Largest |a - b| over the largest |b| (or 1 when b is all zeros, which a must equal).
double relative(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 1e30;
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / (scale > 0 ? scale : 1.0);
}

template <class Mesh>
std::vector<Mesh> meshes() {
  std::vector<Mesh> out;
  for (const auto& sh : mesh_shapes())
    out.emplace_back(MPI_COMM_WORLD, std::array<int, 2>{sh[0], sh[1]});
  return out;
}

std::int64_t sum_over_world(std::int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

// Named results of one run, compared entry by entry.
using results = std::map<std::string, std::vector<double>>;

void check_same(const results& got, const results& want, double tolerance) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    CHECK(relative(got.at(name), w) <= tolerance);
  }
}

// ---------------------------------------------------------------------------------------
// Gating.

constexpr std::size_t G = 6, S = 10, E = 4;  // 6 groups: uneven over 4 ranks

// Logits spread enough that top choices differ between tokens, ties excluded.
template <class T>
std::vector<T> gate_logits() {
  const auto v = global_values(std::array<std::size_t, 3>{G, S, E}, 3);
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    out[i] = static_cast<T>(2 * v[i] + 0.01 * static_cast<double>(i % 7));
  }
  return out;
}

// Routing of the logits on mesh m, with the gradient of
// sum(combine * R1) + sum(weight * R2) + a * aux + b * z seeded directly on the outputs.
template <class T, class Mesh>
results run_gating(const Mesh& m, const moe::gating_options& o) {
  using logits_t = tensor<T, Mesh, "gse", by_group>;
  using routing_t = moe::routing_of<logits_t>;
  using slot_grad = ad::dual_tensor<typename routing_t::slot_tensor>;
  using weight_grad = ad::dual_tensor<typename routing_t::weight_tensor>;
  using scalar_grad = ad::dual_tensor<typename routing_t::scalar_tensor>;
  const auto lg = gate_logits<T>();
  ad::tape t;
  auto logits = t.parameter(logits_t::from_global(m, {G, S, E}, std::span<const T>(lg)));
  auto r = moe::gating(logits, o);
  const std::size_t C = o.one_hot ? r.capacity : 0;
  const std::size_t K = static_cast<std::size_t>(o.top_k);
  std::vector<T> r1, r2;
  for (double v : global_values(std::array<std::size_t, 4>{G, S, E, C}, 5)) r1.push_back(T(v));
  for (double v : global_values(std::array<std::size_t, 3>{G, S, K}, 6)) r2.push_back(T(v));
  const std::vector<T> a{T(0.7)}, b{T(-0.3)};
  r.combine.node()->grad.emplace(slot_grad::from_global(m, {G, S, E, C}, std::span<const T>(r1)));
  r.weight.node()->grad.emplace(weight_grad::from_global(m, {G, S, K}, std::span<const T>(r2)));
  r.aux_loss.node()->grad.emplace(scalar_grad::from_global(m, {}, std::span<const T>(a)));
  r.z_loss.node()->grad.emplace(scalar_grad::from_global(m, {}, std::span<const T>(b)));
  t.run_backward();

  results out;
  out["expert_index"] = as_double(to_global(r.expert_index));
  out["slot_index"] = as_double(to_global(r.slot_index));
  out["weight"] = as_double(to_global(r.weight.value()));
  out["combine"] = as_double(to_global(r.combine.value()));
  out["dispatch"] = as_double(to_global(r.dispatch));
  out["aux_loss"] = as_double(to_global(r.aux_loss.value()));
  out["z_loss"] = as_double(to_global(r.z_loss.value()));
  out["d_logits"] = as_double(to_global(logits.grad()));
  out["capacity"] = {double(r.capacity)};
  // Every rank holds its own groups (the logits split g over both axes): totals are sums.
  std::vector<double> stats;
  for (auto v : r.stats.tokens_per_expert) stats.push_back(double(sum_over_world(v)));
  for (auto v : r.stats.kept_per_expert) stats.push_back(double(sum_over_world(v)));
  stats.push_back(double(sum_over_world(r.stats.tokens)));
  stats.push_back(double(sum_over_world(r.stats.assignments)));
  stats.push_back(double(sum_over_world(r.stats.dropped)));
  out["stats"] = stats;
  return out;
}

template <class T>
void check_gating(const moe::gating_options& o, double tolerance) {
  const auto hosts = meshes<host2>();
  const auto emuls = meshes<emul2>();
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    CAPTURE(hosts[i].describe());
    const results want = run_gating<T>(hosts[i], o);
    const results got = run_gating<T>(emuls[i], o);
    check_same(got, want, tolerance);
    CHECK(want.at("stats").back() > 0);  // the capacity binds: drops are exercised
    // Integers exactly.
    CHECK(got.at("expert_index") == want.at("expert_index"));
    CHECK(got.at("slot_index") == want.at("slot_index"));
    CHECK(got.at("stats") == want.at("stats"));
  }
}

// ---------------------------------------------------------------------------------------
// The index path with hand-made indices.

constexpr std::size_t M = 6, K = 2, C = 5;

// Experts and slots of every (g, s, k): the second choice another expert than the first,
// some slots dropped (-1), and (g = 1, s = 2) and (g = 1, s = 7) sharing expert 1's slot 3.
struct routes_global {
  std::vector<std::int32_t> expert, slot;
};
routes_global hand_routes() {
  routes_global r;
  for (std::size_t g = 0; g < G; ++g) {
    for (std::size_t s = 0; s < S; ++s) {
      const auto e1 = static_cast<std::int32_t>((g * 3 + s * 5) % E);
      const auto e2 = static_cast<std::int32_t>((static_cast<std::size_t>(e1) + 1 + s % 3) % E);
      const auto c1 = static_cast<std::int32_t>((s + g) % (C + 1)) - 1;  // -1 .. C-1
      const auto c2 = static_cast<std::int32_t>((s * 3 + g * 2) % (C + 2)) - 2;
      r.expert.push_back(e1);
      r.expert.push_back(e2);
      r.slot.push_back(c1);
      r.slot.push_back(std::max(c2, std::int32_t{-1}));
    }
  }
  const std::size_t a = (1 * S + 2) * K, b = (1 * S + 7) * K;
  r.expert[a] = r.expert[b] = 1;
  r.slot[a] = r.slot[b] = 3;
  r.expert[a + 1] = r.expert[b + 1] = 2;
  return r;
}

template <class Mesh, class YLayout>
results run_index_path(const Mesh& m) {
  using T = float;
  using x_t = tensor<T, Mesh, "gsm", by_group>;
  using index_t = tensor<std::int32_t, Mesh, "gsk", by_group>;
  using weight_t = tensor<T, Mesh, "gsk", by_group>;
  using y_t = tensor<T, Mesh, "egcm", YLayout>;
  const routes_global hr = hand_routes();
  const auto ei = index_t::from_global(m, {G, S, K}, std::span<const std::int32_t>(hr.expert));
  const auto si = index_t::from_global(m, {G, S, K}, std::span<const std::int32_t>(hr.slot));
  auto values = [](auto extents, std::uint32_t salt) {
    std::vector<T> out;
    for (double v : global_values(extents, salt)) out.push_back(T(v));
    return out;
  };
  const std::array<std::size_t, 3> xe{G, S, M}, we{G, S, K};
  const std::array<std::size_t, 4> ye{E, G, C, M};
  const auto xv = values(xe, 1), dv = values(ye, 2), yv = values(ye, 3), wv = values(we, 4),
             zv = values(xe, 5);
  ad::tape t;
  results out;
  // dispatch: d = dispatch_by_index(x), seeded with dd.
  auto x = t.parameter(x_t::from_global(m, xe, std::span<const T>(xv)));
  auto d = moe::dispatch_by_index(x, ei, si, E, C);
  using d_grad = typename decltype(d)::gradient_type;
  d.node()->grad.emplace(d_grad::from_global(m, ye, std::span<const T>(dv)));
  // combine: z = combine_by_index(y, w), seeded with dz.
  auto y = t.parameter(y_t::from_global(m, ye, std::span<const T>(yv)));
  auto w = t.parameter(weight_t::from_global(m, we, std::span<const T>(wv)));
  auto z = moe::combine_by_index(y, w, ei, si);
  using z_grad = typename decltype(z)::gradient_type;
  z.node()->grad.emplace(z_grad::from_global(m, xe, std::span<const T>(zv)));
  t.run_backward();
  out["dispatched"] = as_double(to_global(d.value()));
  out["d_x"] = as_double(to_global(x.grad()));
  out["combined"] = as_double(to_global(z.value()));
  out["d_y"] = as_double(to_global(y.grad()));
  out["d_weight"] = as_double(to_global(w.grad()));
  return out;
}

template <class YLayout>
void check_index_path() {
  const auto hosts = meshes<host2>();
  const auto emuls = meshes<emul2>();
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    CAPTURE(hosts[i].describe());
    const results want = run_index_path<host2, YLayout>(hosts[i]);
    const results got = run_index_path<emul2, YLayout>(emuls[i]);
    check_same(got, want, 1e-6);
  }
}

// The message of dispatch_by_index's error for a slot at the capacity, or "".
template <class Mesh>
std::string index_error(const Mesh& m) {
  using x_t = tensor<float, Mesh, "gsm", by_group>;
  using index_t = tensor<std::int32_t, Mesh, "gsk", by_group>;
  routes_global hr = hand_routes();
  hr.slot[(5 * S + 4) * K + 1] = static_cast<std::int32_t>(C);  // group 5, token 4, choice 1
  hr.expert[(5 * S + 4) * K + 1] = 0;
  const auto ei = index_t::from_global(m, {G, S, K}, std::span<const std::int32_t>(hr.expert));
  const auto si = index_t::from_global(m, {G, S, K}, std::span<const std::int32_t>(hr.slot));
  ad::tape t;
  auto x = t.constant(x_t(m, {G, S, M}));
  try {
    (void)moe::dispatch_by_index(x, ei, si, E, C);
  } catch (const shape_error& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------
// The layer (as tests/moe/moe_layer_test.cpp): loss = sum(y * R) + 0.1 aux + 0.01 z.

struct layer_setup {
  std::size_t batch = 4, time = 8, width = 8, hidden = 12, experts = 4;
  moe::gating_options gating{.top_k = 2, .capacity_factor = 1.0, .seed = 11};
  bool index_path = true;
};

template <int Stage, class Mesh>
results run_layer(const Mesh& m, const layer_setup& s) {
  using P = training_policy<Mesh, zero_stage<Stage>>;
  using x_t = tensor<float, Mesh, "btm", layout<split<'b', "dp", "ep">>>;
  using r_t = tensor<float, Mesh, "btm">;
  zero_engine<P> engine(m, {.seed = 5});
  const std::size_t group = engine.begin_group("moe");
  moe::moe_layer<P> layer(engine, "moe", s.width, s.hidden, s.experts, s.gating, s.index_path);
  engine.end_group();
  const std::array<std::size_t, 3> xe{s.batch, s.time, s.width};
  const auto xg = global_values(xe, 1);
  const auto rg = global_values(xe, 2);
  const std::vector<float> xv(xg.begin(), xg.end()), rv(rg.begin(), rg.end());
  ad::tape t;
  auto x = t.parameter(x_t::from_global(m, xe, std::span<const float>(xv)));
  auto [y, loss] = [&] {
    auto in_scope = engine.use(t, group);
    auto y = layer(x);
    auto r = t.constant(r_t::from_global(m, xe, std::span<const float>(rv)));
    auto loss =
        ad::sum(y * r) + ad::scale(layer.aux_loss(), 0.1F) + ad::scale(layer.z_loss(), 0.01F);
    return std::pair{y, loss};
  }();
  engine.backward(loss);
  results out;
  out["y"] = as_double(to_global(y.value()));
  out["dx"] = as_double(to_global(x.grad()));
  out["aux"] = as_double(to_global(layer.aux_loss().value()));
  out["z"] = as_double(to_global(layer.z_loss().value()));
  out["gate"] = as_double(to_global(layer.gate().gradient_buffer_tensor()));
  out["in_weight"] = as_double(to_global(layer.in_weight().gradient_buffer_tensor()));
  out["out_weight"] = as_double(to_global(layer.out_weight().gradient_buffer_tensor()));
  out["in_bias"] = as_double(to_global(layer.in_bias().gradient_buffer_tensor()));
  out["out_bias"] = as_double(to_global(layer.out_bias().gradient_buffer_tensor()));
  std::int64_t kept = 0;
  for (auto k : layer.stats().kept_per_expert) kept += k;
  out["kept"] = {double(sum_over_world(kept))};
  out["dropped"] = {double(sum_over_world(layer.stats().dropped))};
  return out;
}

template <int Stage>
void check_layer(const layer_setup& s) {
  const auto hosts = meshes<host2>();
  const auto emuls = meshes<emul2>();
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    CAPTURE(hosts[i].describe());
    const results want = run_layer<Stage>(hosts[i], s);
    const results got = run_layer<Stage>(emuls[i], s);
    CHECK(want.at("dropped")[0] > 0);
    check_same(got, want, 1e-6);
  }
}

}  // namespace

TEST_CASE("emulated gating equals the host's: top-2 with random routing, float and double") {
  const moe::gating_options o{.top_k = 2, .capacity_factor = 1.0, .seed = 7};
  check_gating<float>(o, 1e-6);
  check_gating<double>(o, 1e-12);
}

TEST_CASE("emulated gating equals the host's: top-2 without random routing, top-1, no one-hot") {
  SUBCASE("top-2, every second choice routed, tight capacity") {
    check_gating<float>({.top_k = 2, .capacity_factor = 0.5, .random_routing = false}, 1e-6);
  }
  SUBCASE("top-1 (Switch)") {
    check_gating<float>({.top_k = 1, .capacity_factor = 1.0, .seed = 3}, 1e-6);
  }
  SUBCASE("index path only: no one-hot tensors") {
    check_gating<float>({.top_k = 2, .capacity_factor = 1.0, .seed = 9, .one_hot = false}, 1e-6);
  }
  SUBCASE("evaluation: eval capacity") {
    check_gating<float>({.top_k = 2, .eval_capacity_factor = 0.75, .training = false}, 1e-6);
  }
}

TEST_CASE("emulated dispatch_by_index and combine_by_index equal the host's") {
  SUBCASE("y in the token layout") { check_index_path<by_group>(); }
  SUBCASE("y split on m over ep: the weight used through a copy") {
    check_index_path<layout<split<'g', "dp">, split<'m', "ep">>>();
  }
}

TEST_CASE("emulated dispatch_by_index: an index out of range throws the host's message") {
  const auto hosts = meshes<host2>();
  const auto emuls = meshes<emul2>();
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    CAPTURE(hosts[i].describe());
    const std::string want = index_error(hosts[i]);
    const std::string got = index_error(emuls[i]);
    CHECK(got == want);
    // Only the rank holding group 5 sees it.
    const bool holds = !want.empty();
    CHECK(sum_over_world(holds ? 1 : 0) >= 1);
    if (holds) {
      CHECK(want.find("token (g=5, s=4) choice 1 goes to expert 0, slot 5") != std::string::npos);
    }
  }
}

TEST_CASE("emulated moe_layer equals the host's (ZeRO 0 and 3, both paths)") {
  for (bool index : {true, false}) {
    CAPTURE(index);
    layer_setup s;
    s.index_path = index;
    check_layer<0>(s);
    check_layer<3>(s);
    s.gating.top_k = 1;
    check_layer<0>(s);
  }
}
