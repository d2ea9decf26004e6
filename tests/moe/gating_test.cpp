// MoE gating (zest/moe/gating.hpp): GShard top-2 and Switch top-1 routing on a hand-computed
// group (choices, renormalised gates, slots, drops, dispatch and combine element by element,
// the aux and z losses), random routing against draws recomputed here from the documented
// formula (including a second choice that is not routed and frees a slot for a later one),
// aux = 1 at perfect balance, gradients of sum(combine * R1) + sum(weight * R2) + a * aux +
// b * z against central differences (double) on mesh<"dp"> (replicated, split over dp) and
// each 2-D mesh<"dp", "tp"> shape, and results that do not depend on the number of ranks.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/core/random.hpp"
#include "zest/moe/gating.hpp"

TEST_SUITE_BEGIN("moe_gating");
// One namespace per file: the files of this folder share one unity translation unit.
namespace gating_tests {

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

using mesh1 = mesh<"dp">;
using mesh2 = mesh<"dp", "tp">;
using solo = local_mesh<"dp">;  // the single-rank reference
using solo_logits = tensor<double, solo, "gse">;

template <class V>
std::vector<double> as_double(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

// The documented draw of random routing for global token index i = g * S + s.
double routing_uniform(std::uint64_t seed, std::uint64_t i) {
  return static_cast<double>(splitmix64(splitmix64(seed) ^ i) >> 11) * 0x1p-53;
}

// ---------------------------------------------------------------------------------------
// The hand-computed group: S = 6 tokens, E = 3 experts. Logits log(p) + shift_s give
// softmax p and logsumexp shift_s.
//
//   token  p              e1 e2   g1'          g2'
//   0      .6  .3  .1      0  1   .6/.9 = 2/3  1/3
//   1      .5  .2  .3      0  2   .5/.8        .3/.8
//   2      .7  .1  .2      0  2   .7/.9        .2/.9
//   3      .2  .5  .3      1  2   .5/.8        .3/.8
//   4      .1  .4  .5      2  1   5/9          4/9
//   5      .3  .25 .45     2  0   .45/.75      .3/.75
//
// First choices c = (3, 1, 2). Top-2 with C = 2 (capacity_factor 0.5): first slots 0 1 2 0 0 1
// (token 2 dropped); second slots c[e2] + earlier second choices to e2: token 0 -> expert 1
// slot 1 (kept), token 1 -> 2 (dropped), 2 -> 3, 3 -> 4, token 4 -> expert 1 slot 2
// (dropped), token 5 -> expert 0 slot 3 (dropped).
// m = mean p = (2.4, 1.75, 1.85) / 6; aux = 3 * (3/6 * .4 + 1/6 * 1.75/6 + 2/6 * 1.85/6)
//   = .6 + 3 * 5.45 / 36 = 253/240.
// z = mean shift^2 = (1 + .25 + 0 + .25 + 1 + 2.25) / 6 = 4.75 / 6.

constexpr std::size_t hand_s = 6, hand_e = 3;
const std::array<std::array<double, 3>, 6> hand_p{
    {{.6, .3, .1}, {.5, .2, .3}, {.7, .1, .2}, {.2, .5, .3}, {.1, .4, .5}, {.3, .25, .45}}};
const std::array<double, 6> hand_shift{-1, -.5, 0, .5, 1, 1.5};

std::vector<double> hand_logits() {
  std::vector<double> x;
  for (std::size_t s = 0; s < hand_s; ++s) {
    for (std::size_t e = 0; e < hand_e; ++e) x.push_back(std::log(hand_p[s][e]) + hand_shift[s]);
  }
  return x;
}

// One expected assignment: token, choice, expert, slot (-1 dropped), gate.
struct assignment {
  std::size_t s, k;
  int expert, slot;
  double gate;
};

// Checks a routing of the hand group (one group) against the expected assignments.
template <class R>
void check_hand(const R& r, const std::vector<assignment>& want, std::size_t k,
                std::size_t capacity) {
  REQUIRE(r.capacity == capacity);
  const auto experts = to_global(r.expert_index);
  const auto slots = to_global(r.slot_index);
  const auto weights = to_global(r.weight.value());
  const auto dispatch = to_global(r.dispatch);
  const auto combine = to_global(r.combine.value());
  REQUIRE(experts.size() == hand_s * k);
  REQUIRE(combine.size() == hand_s * hand_e * capacity);
  std::vector<double> want_dispatch(combine.size(), 0.0), want_combine(combine.size(), 0.0);
  REQUIRE(want.size() == hand_s * k);
  for (const assignment& a : want) {
    CAPTURE(a.s);
    CAPTURE(a.k);
    const std::size_t at = a.s * k + a.k;
    CHECK(experts[at] == a.expert);
    CHECK(slots[at] == a.slot);
    CHECK(weights[at] == doctest::Approx(a.slot < 0 ? 0.0 : a.gate).epsilon(1e-13));
    if (a.slot >= 0) {
      const std::size_t c = (a.s * hand_e + static_cast<std::size_t>(a.expert)) * capacity +
                            static_cast<std::size_t>(a.slot);
      want_dispatch[c] = 1;
      want_combine[c] = a.gate;
    }
  }
  for (std::size_t i = 0; i < combine.size(); ++i) {
    CAPTURE(i);
    CHECK(dispatch[i] == want_dispatch[i]);
    CHECK(combine[i] == doctest::Approx(want_combine[i]).epsilon(1e-13));
  }
  CHECK(to_global(r.aux_loss.value())[0] == doctest::Approx(253.0 / 240).epsilon(1e-13));
  CHECK(to_global(r.z_loss.value())[0] == doctest::Approx(4.75 / 6).epsilon(1e-13));
  CHECK(r.stats.tokens_per_expert == std::vector<std::int64_t>{3, 1, 2});
  CHECK(r.stats.tokens == 6);
  CHECK(r.stats.assignments == static_cast<std::int64_t>(6 * k));
}

// The top-2 assignments of the hand group, given the slots of the second choices of tokens 0
// and 4 (the only second choices that can be kept at C = 2).
std::vector<assignment> hand_top2(int slot0, int slot4) {
  return {{0, 0, 0, 0, 2.0 / 3},     {0, 1, 1, slot0, 1.0 / 3}, {1, 0, 0, 1, .5 / .8},
          {1, 1, 2, -1, .3 / .8},    {2, 0, 0, -1, .7 / .9},    {2, 1, 2, -1, .2 / .9},
          {3, 0, 1, 0, .5 / .8},     {3, 1, 2, -1, .3 / .8},    {4, 0, 2, 0, 5.0 / 9},
          {4, 1, 1, slot4, 4.0 / 9}, {5, 0, 2, 1, .45 / .75},   {5, 1, 0, -1, .3 / .75}};
}

TEST_CASE("expert_capacity: ceil(k S / E * factor), at least 1, no slot from rounding noise") {
  CHECK(moe::expert_capacity(6, 3, 2, 0.5) == 2);
  CHECK(moe::expert_capacity(6, 3, 1, 1.0) == 2);
  CHECK(moe::expert_capacity(1024, 8, 2, 1.25) == 320);
  CHECK(moe::expert_capacity(100, 10, 2, 1.1) == 22);  // 20 * 1.1 = 22.000000000000004
  CHECK(moe::expert_capacity(10, 4, 2, 1.0) == 5);
  CHECK(moe::expert_capacity(7, 4, 2, 1.0) == 4);  // 3.5
  CHECK(moe::expert_capacity(4, 64, 1, 1.0) == 1);
  CHECK(moe::expert_capacity(0, 4, 2, 1.0) == 1);
  CHECK_THROWS_AS(moe::expert_capacity(8, 0, 2, 1.0), shape_error);
  CHECK_THROWS_AS(moe::expert_capacity(8, 4, 2, 0.0), shape_error);
}

TEST_CASE("top2_gating: the hand-computed group, no random routing") {
  const solo m;
  ad::tape t;
  auto logits = t.parameter(solo_logits::from_global(m, {1, hand_s, hand_e}, hand_logits()));
  moe::gating_options o;
  o.capacity_factor = 0.5;
  o.random_routing = false;
  const auto r = moe::top2_gating(logits, o);
  check_hand(r, hand_top2(1, -1), 2, 2);
  CHECK(r.stats.kept_per_expert == std::vector<std::int64_t>{2, 2, 2});
  CHECK(r.stats.dropped == 6);

  // Evaluation: its own capacity factor, and never random routing.
  moe::gating_options eval;
  eval.training = false;
  eval.capacity_factor = 4;
  eval.eval_capacity_factor = 0.5;
  eval.seed = 12345;
  check_hand(moe::top2_gating(logits, eval), hand_top2(1, -1), 2, 2);
  // C = 4 keeps every first choice, and the second choices up to slot 3 (c = 3, 1, 2).
  eval.eval_capacity_factor = 1.0;
  const auto big = moe::gating(logits, eval);
  CHECK(big.capacity == 4);
  CHECK(to_global(big.slot_index) ==
        std::vector<std::int32_t>{0, 1, 1, 2, 2, 3, 0, -1, 0, 2, 1, 3});
  CHECK(big.stats.dropped == 1);
}

TEST_CASE("top2_gating: random routing decides before slots; an unrouted choice frees its slot") {
  const solo m;
  ad::tape t;
  auto logits = t.parameter(solo_logits::from_global(m, {1, hand_s, hand_e}, hand_logits()));
  // Token 0's second choice is routed iff u(0) < 2 * 1/3, token 4's iff u(4) < 2 * 4/9; the
  // others are over capacity whatever the draw. Each combination of the two decisions, with
  // a seed found from the documented formula.
  for (int routed0 = 0; routed0 < 2; ++routed0) {
    for (int routed4 = 0; routed4 < 2; ++routed4) {
      CAPTURE(routed0);
      CAPTURE(routed4);
      std::uint64_t seed = 0;
      while ((routing_uniform(seed, 0) < 2.0 / 3) != (routed0 == 1) ||
             (routing_uniform(seed, 4) < 8.0 / 9) != (routed4 == 1)) {
        ++seed;
      }
      moe::gating_options o;
      o.capacity_factor = 0.5;
      o.seed = seed;
      const auto r = moe::top2_gating(logits, o);
      // Routed, token 0 takes slot 1 of expert 1 (after token 3's first choice) and token 4
      // finds it full; unrouted, token 0 leaves it to token 4.
      const int slot0 = routed0 ? 1 : -1;
      const int slot4 = routed0 ? -1 : (routed4 ? 1 : -1);
      check_hand(r, hand_top2(slot0, slot4), 2, 2);
      const std::int64_t kept1 = 1 + (slot0 >= 0 ? 1 : 0) + (slot4 >= 0 ? 1 : 0);
      CHECK(r.stats.kept_per_expert == std::vector<std::int64_t>{2, kept1, 2});
      CHECK(r.stats.dropped == 12 - 4 - kept1);
    }
  }
}

TEST_CASE("top1_gating: Switch on the hand-computed group") {
  const solo m;
  ad::tape t;
  auto logits = t.parameter(solo_logits::from_global(m, {1, hand_s, hand_e}, hand_logits()));
  moe::gating_options o;
  o.top_k = 1;
  o.capacity_factor = 1.0;  // C = ceil(1 * 6 / 3) = 2
  // The gate is p[e1] itself; token 2 is the third first choice of expert 0: dropped.
  const std::vector<assignment> want{{0, 0, 0, 0, .6}, {1, 0, 0, 1, .5}, {2, 0, 0, -1, .7},
                                     {3, 0, 1, 0, .5}, {4, 0, 2, 0, .5}, {5, 0, 2, 1, .45}};
  const auto r = moe::top1_gating(logits, o);
  check_hand(r, want, 1, 2);
  CHECK(r.stats.kept_per_expert == std::vector<std::int64_t>{2, 1, 2});
  CHECK(r.stats.dropped == 1);
  const auto same = moe::gating(logits, o);
  static_assert(std::is_same_v<decltype(same), decltype(r)>);
  CHECK(to_global(same.combine.value()) == to_global(r.combine.value()));

  // top_k must match the gating asked for.
  o.top_k = 2;
  CHECK_THROWS_AS((void)moe::top1_gating(logits, o), shape_error);
  o.top_k = 1;
  CHECK_THROWS_AS((void)moe::top2_gating(logits, o), shape_error);
  // Any k from 1 to E (3 here): top-3 routes, more than E or fewer than 1 is an error.
  o.top_k = 4;
  CHECK_THROWS_AS((void)moe::gating(logits, o), shape_error);
  o.top_k = 0;
  CHECK_THROWS_AS((void)moe::gating(logits, o), shape_error);
}

TEST_CASE("aux_loss is 1 at perfect balance, for top-2 and top-1") {
  // S = 6 tokens whose logits are the 6 permutations of (2, 1, 0): each expert is the first
  // choice of 2 = S/E tokens, and its mean gate is 1/3.
  std::vector<double> x;
  std::array<double, 3> v{0, 1, 2};
  do {
    x.insert(x.end(), v.begin(), v.end());
  } while (std::next_permutation(v.begin(), v.end()));
  REQUIRE(x.size() == 18);
  const solo m;
  ad::tape t;
  auto logits = t.parameter(solo_logits::from_global(m, {1, 6, 3}, x));
  for (int k = 1; k <= 2; ++k) {
    CAPTURE(k);
    moe::gating_options o;
    o.top_k = k;
    const auto r = moe::gating(logits, o);
    CHECK(std::abs(to_global(r.aux_loss.value())[0] - 1.0) < 1e-12);
    CHECK(r.stats.tokens_per_expert == std::vector<std::int64_t>{2, 2, 2});
  }
}

TEST_CASE("gating: types and layouts") {
  using mesh_t = mesh2;
  using logits_t = tensor<float, mesh_t, "gse", layout<split<'g', "dp", "tp">>>;
  using routing_t = moe::routing_of<logits_t>;
  static_assert(std::is_same_v<routing_t, moe::routing<mesh_t, logits_t::layout, float>>);
  static_assert(std::is_same_v<routing_t::slot_tensor,
                               tensor<float, mesh_t, "gsec", layout<split<'g', "dp", "tp">>>>);
  static_assert(
      std::is_same_v<routing_t::index_tensor,
                     tensor<std::int32_t, mesh_t, "gsk", layout<split<'g', "dp", "tp">>>>);
  static_assert(std::is_same_v<routing_t::weight_tensor,
                               tensor<float, mesh_t, "gsk", layout<split<'g', "dp", "tp">>>>);
  static_assert(std::is_same_v<routing_t::scalar_tensor,
                               tensor<float, mesh_t, "", layout<partial<"dp">, partial<"tp">>>>);
  using half_t = tensor<double, mesh_t, "gse", layout<split<'g', "dp">>>;
  static_assert(std::is_same_v<moe::routing_of<half_t>::scalar_tensor,
                               tensor<double, mesh_t, "", layout<partial<"dp">>>>);
  // The scalars add to cross_entropy's loss of tokens split the same way.
  mesh_t m(MPI_COMM_WORLD, {world_size(), 1});
  ad::tape t;
  auto logits = t.parameter(half_t::generate(m, {3, 4, 4}, [](const auto& i) {
    return 0.1 * static_cast<double>(i[0] + 2 * i[1] + 3 * i[2]);
  }));
  auto r = moe::top2_gating(logits, {});
  CHECK(layout_string<decltype(r.dispatch)>() == "split(g:dp)");
  CHECK(layout_string<typename decltype(r.aux_loss)::tensor_type>() == "partial(dp)");
  CHECK(r.capacity == 3);  // ceil(2 * 4 / 4 * 1.25)
}

// ---------------------------------------------------------------------------------------
// An independent reference of the routing rule over global arrays.

struct reference {
  std::vector<std::int32_t> expert, slot;
  std::vector<double> weight;
};
reference reference_route(const std::vector<double>& x, std::size_t G, std::size_t S, std::size_t E,
                          int k, std::size_t C, bool random, std::uint64_t seed) {
  reference out;
  const std::size_t K = static_cast<std::size_t>(k);
  out.expert.assign(G * S * K, -1);
  out.slot.assign(G * S * K, -1);
  out.weight.assign(G * S * K, 0.0);
  for (std::size_t g = 0; g < G; ++g) {
    std::vector<std::size_t> first_count(E, 0), second_count(E, 0);
    std::vector<std::array<double, 2>> gates(S);
    for (std::size_t s = 0; s < S; ++s) {
      const double* row = x.data() + (g * S + s) * E;
      const double top = *std::max_element(row, row + E);
      std::vector<double> p(E);
      double sum = 0;
      for (std::size_t e = 0; e < E; ++e) sum += p[e] = std::exp(row[e] - top);
      for (double& v : p) v /= sum;
      std::size_t e1 = 0;
      for (std::size_t e = 1; e < E; ++e) e1 = p[e] > p[e1] ? e : e1;
      const std::size_t at = (g * S + s) * K;
      out.expert[at] = static_cast<std::int32_t>(e1);
      out.slot[at] = static_cast<std::int32_t>(first_count[e1]++);
      gates[s] = {p[e1], 0};
      if (k == 2) {
        std::size_t e2 = e1 == 0 ? 1 : 0;
        for (std::size_t e = 0; e < E; ++e) e2 = e != e1 && p[e] > p[e2] ? e : e2;
        out.expert[at + 1] = static_cast<std::int32_t>(e2);
        gates[s] = {p[e1] / (p[e1] + p[e2]), p[e2] / (p[e1] + p[e2])};
      }
    }
    for (std::size_t s = 0; s < S && k == 2; ++s) {
      const std::size_t at = (g * S + s) * K + 1;
      const auto e2 = static_cast<std::size_t>(out.expert[at]);
      if (random && !(routing_uniform(seed, g * S + s) < 2 * gates[s][1])) continue;
      out.slot[at] = static_cast<std::int32_t>(first_count[e2] + second_count[e2]++);
    }
    for (std::size_t s = 0; s < S; ++s) {
      for (std::size_t j = 0; j < K; ++j) {
        const std::size_t at = (g * S + s) * K + j;
        if (out.slot[at] >= static_cast<std::int32_t>(C)) out.slot[at] = -1;
        out.weight[at] = out.slot[at] < 0 ? 0.0 : gates[s][j];
      }
    }
  }
  return out;
}

// Logits with clear margins: token (g, s) ranks the experts by a rotation, so first and
// second choices differ by at least 0.6 in logit and every argmax survives a 1e-6 nudge.
std::vector<double> margin_logits(std::size_t G, std::size_t S, std::size_t E) {
  std::vector<double> x(G * S * E);
  for (std::size_t g = 0; g < G; ++g) {
    for (std::size_t s = 0; s < S; ++s) {
      for (std::size_t e = 0; e < E; ++e) {
        const std::size_t rank = (e + g + s * s + s / 3) % E;
        x[(g * S + s) * E + e] = 0.8 * static_cast<double>(rank) +
                                 0.1 * std::sin(static_cast<double>(31 * g + 7 * s + 3 * e));
      }
    }
  }
  return x;
}

// A seed whose draws stay at least 1e-3 away from every threshold 2 * g2', so that a 1e-6
// nudge of the logits changes no random decision.
std::uint64_t safe_seed(const std::vector<double>& x, std::size_t G, std::size_t S, std::size_t E) {
  const reference r = reference_route(x, G, S, E, 2, 1000, false, 0);
  for (std::uint64_t seed = 1;; ++seed) {
    bool ok = true;
    for (std::size_t t = 0; t < G * S && ok; ++t) {
      ok = std::abs(routing_uniform(seed, t) - 2 * r.weight[t * 2 + 1]) > 1e-3;
    }
    if (ok) return seed;
  }
}

// ---------------------------------------------------------------------------------------
// Gradients by central differences, and agreement across meshes.

struct run_result {
  double loss = 0;
  std::vector<double> grad;
};

// loss = sum(combine * R1) + sum(weight * R2) + 0.7 aux + 0.3 z, R1 and R2 fixed.
template <class Logits>
run_result gating_loss(const typename Logits::mesh_type& m, const std::array<std::size_t, 3>& ext,
                       const std::vector<double>& x, const moe::gating_options& o, bool grads) {
  using mesh_t = typename Logits::mesh_type;
  constexpr layout_value whole = replicated_layout(mesh_t::axis_count);
  ad::tape t;
  auto logits = t.parameter(Logits::from_global(m, ext, x));
  auto r = moe::gating(logits, o);
  using slots_t = basic_tensor<double, mesh_t, moe::slot_dims, whole>;
  using choices_t = basic_tensor<double, mesh_t, moe::choice_dims, whole>;
  const auto& ce = r.combine.value().extents();
  const auto& we = r.weight.value().extents();
  const auto r1 = global_values(ce, 5);
  const auto r2 = global_values(we, 6);
  auto c1 = t.constant(slots_t::from_global(m, ce, r1));
  auto c2 = t.constant(choices_t::from_global(m, we, r2));
  auto loss = ad::sum(r.combine * c1) + ad::sum(r.weight * c2) + ad::scale(r.aux_loss, 0.7) +
              ad::scale(r.z_loss, 0.3);
  run_result out;
  out.loss = to_global(loss.value())[0];
  if (grads) {
    ad::backward(loss);
    out.grad = as_double(to_global(logits.grad()));
  }
  return out;
}

template <class Logits>
void check_gradients(const typename Logits::mesh_type& m, int k, bool random) {
  CAPTURE(layout_string<Logits>());
  CAPTURE(k);
  CAPTURE(random);
  const std::size_t G = 5, S = 6, E = 4;
  const std::array<std::size_t, 3> ext{G, S, E};
  const std::vector<double> x = margin_logits(G, S, E);
  moe::gating_options o;
  o.top_k = k;
  o.capacity_factor = 0.6;  // C = ceil(k * 1.5 * 0.6): 1 for top-1, 2 for top-2; many drops
  o.random_routing = random;
  o.seed = safe_seed(x, G, S, E);
  const run_result base = gating_loss<Logits>(m, ext, x, o, true);
  const solo one;
  const run_result ref = gating_loss<solo_logits>(one, ext, x, o, true);
  CHECK(std::abs(base.loss - ref.loss) < 1e-12 * std::max(1.0, std::abs(ref.loss)));
  CHECK(relative_error(base.grad, ref.grad) < 1e-12);
  const double h = 1e-6;
  double worst = 0, scale = 1;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<double> plus = x, minus = x;
    plus[i] += h;
    minus[i] -= h;
    const double fd = (gating_loss<Logits>(m, ext, plus, o, false).loss -
                       gating_loss<Logits>(m, ext, minus, o, false).loss) /
                      (2 * h);
    worst = std::max(worst, std::abs(fd - base.grad[i]));
    scale = std::max(scale, std::abs(fd));
  }
  CHECK(worst / scale < 1e-6);
}

TEST_CASE("gating gradients: central differences, sharded and unsharded") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  for (int k = 1; k <= 2; ++k) {
    check_gradients<tensor<double, mesh1, "gse">>(m, k, k == 2);
    check_gradients<tensor<double, mesh1, "gse", layout<split<'g', "dp">>>>(m, k, false);
    check_gradients<tensor<double, mesh1, "gse", layout<split<'g', "dp">>>>(m, k, true);
  }
  for (const auto& shape : mesh_shapes()) {
    CAPTURE(shape[0]);
    CAPTURE(shape[1]);
    mesh2 m2(MPI_COMM_WORLD, shape);
    for (int k = 1; k <= 2; ++k) {
      check_gradients<tensor<double, mesh2, "gse", layout<split<'g', "dp", "tp">>>>(m2, k, true);
      // Replicated over tp: the gradient reaches the logits as pending tp summands.
      check_gradients<tensor<double, mesh2, "gse", layout<split<'g', "dp">>>>(m2, k, true);
    }
  }
}

// Everything gating returns, as global arrays; stats summed over the ranks that hold
// distinct groups (coordinate 0 on the axes that do not split g).
struct routing_globals {
  std::vector<double> dispatch, combine, weight;
  std::vector<std::int32_t> expert, slot;
  double aux = 0, z = 0;
  std::vector<std::int64_t> stats;
  std::size_t capacity = 0;
};

template <class Logits>
routing_globals global_routing(const typename Logits::mesh_type& m,
                               const std::array<std::size_t, 3>& ext, const std::vector<double>& x,
                               const moe::gating_options& o) {
  using T = typename Logits::value_type;
  const std::vector<T> values(x.begin(), x.end());
  ad::tape t;
  auto logits = t.parameter(Logits::from_global(m, ext, values));
  const auto r = moe::gating(logits, o);
  routing_globals out;
  out.dispatch = as_double(to_global(r.dispatch));
  out.combine = as_double(to_global(r.combine.value()));
  out.weight = as_double(to_global(r.weight.value()));
  out.expert = to_global(r.expert_index);
  out.slot = to_global(r.slot_index);
  out.aux = to_global(r.aux_loss.value())[0];
  out.z = to_global(r.z_loss.value())[0];
  out.capacity = r.capacity;
  std::vector<std::int64_t> s = r.stats.tokens_per_expert;
  s.insert(s.end(), r.stats.kept_per_expert.begin(), r.stats.kept_per_expert.end());
  s.push_back(r.stats.tokens);
  s.push_back(r.stats.assignments);
  s.push_back(r.stats.dropped);
  bool counts = true;
  for (std::size_t a = 0; a < Logits::mesh_type::axis_count; ++a) {
    if (!Logits::layout.is_split(a) && m.coord(a) != 0) counts = false;
  }
  if (!counts) std::fill(s.begin(), s.end(), 0);
  if constexpr (!std::is_same_v<typename Logits::mesh_type, solo>) {
    MPI_Allreduce(MPI_IN_PLACE, s.data(), static_cast<int>(s.size()), MPI_INT64_T, MPI_SUM,
                  MPI_COMM_WORLD);
  }
  out.stats = s;
  return out;
}

template <class Logits>
void check_same_routing(const typename Logits::mesh_type& m, int k) {
  CAPTURE(layout_string<Logits>());
  CAPTURE(k);
  const std::size_t G = 7, S = 8, E = 4;  // 7 groups: uneven blocks, empty ones at 4 x 2
  const std::array<std::size_t, 3> ext{G, S, E};
  const std::vector<double> x = global_values(ext, 3);
  moe::gating_options o;
  o.top_k = k;
  o.capacity_factor = 0.75;
  o.seed = 2024;
  const routing_globals got = global_routing<Logits>(m, ext, x, o);
  const solo one;
  using solo_t = tensor<typename Logits::value_type, solo, "gse">;
  const routing_globals want = global_routing<solo_t>(one, ext, x, o);
  const double tolerance = std::is_same_v<typename Logits::value_type, float> ? 1e-6 : 1e-12;
  CHECK(got.capacity == want.capacity);
  CHECK(got.dispatch == want.dispatch);
  CHECK(got.combine == want.combine);
  CHECK(got.weight == want.weight);
  CHECK(got.expert == want.expert);
  CHECK(got.slot == want.slot);
  CHECK(std::abs(got.aux - want.aux) < tolerance);
  CHECK(std::abs(got.z - want.z) < tolerance);
  CHECK(got.stats == want.stats);
  // The single-rank result against the independent reference of the rule.
  const reference ref = reference_route(x, G, S, E, k, want.capacity, true, o.seed);
  CHECK(want.expert == ref.expert);
  CHECK(want.slot == ref.slot);
  CHECK(relative_error(want.weight, ref.weight) < tolerance);
  std::int64_t dropped = 0;
  for (auto v : ref.slot) dropped += v < 0 ? 1 : 0;
  CHECK(want.stats.back() == dropped);
  CHECK(dropped > 0);
}

TEST_CASE("gating: the same routing at 1, 2 and 4 ranks, random routing on") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  for (int k = 1; k <= 2; ++k) {
    check_same_routing<tensor<double, mesh1, "gse">>(m, k);
    check_same_routing<tensor<double, mesh1, "gse", layout<split<'g', "dp">>>>(m, k);
    check_same_routing<tensor<float, mesh1, "gse", layout<split<'g', "dp">>>>(m, k);
  }
  for (const auto& shape : mesh_shapes()) {
    CAPTURE(shape[0]);
    CAPTURE(shape[1]);
    mesh2 m2(MPI_COMM_WORLD, shape);
    for (int k = 1; k <= 2; ++k) {
      check_same_routing<tensor<double, mesh2, "gse", layout<split<'g', "dp", "tp">>>>(m2, k);
      check_same_routing<tensor<double, mesh2, "gse", layout<split<'g', "tp">>>>(m2, k);
    }
  }
}

}  // namespace

}  // namespace gating_tests

TEST_SUITE_END();
