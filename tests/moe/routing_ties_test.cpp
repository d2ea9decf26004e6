// MoE gating when softmax underflows (logits tens of units apart, as with a router whose
// logits have a standard deviation of 60): several experts then share the probability 0, and
//   - the second choice is the best of them by logit (then the lowest index), not the
//     lowest index among the zeros;
//   - a second choice whose gate is exactly 0 is not routed: no slot, no dispatch, weight 0,
//     so it cannot take a slot from a later token's real second choice.
// Hand-computed routing of two group patterns, on the host backend (mesh) and on the generic
// code paths (emulated_mesh, what the CUDA backend runs), float and double, the groups split
// over every rank.
#include <doctest/doctest.h>
#include <mpi.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "support/mpi_test.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/mesh/emulated_mesh.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/moe/gating.hpp"
#include "zest/tensor/redistribute.hpp"

TEST_SUITE_BEGIN("moe_routing_ties");
// One namespace per file: the files of this folder share one unity translation unit.
namespace routing_ties_tests {

namespace {
using namespace zest;
namespace ad = zest::autodiff;

constexpr std::size_t G = 4, S = 4, E = 4, K = 2;

// F: a gap after which exp underflows to exactly 0 in T (exp(-150) is 0 in float, not in
// double; exp(-1500) is 0 in double).
template <class T>
constexpr double far = std::is_same_v<T, float> ? 100.0 : 1000.0;

// Groups 0, 2: pattern A; groups 1, 3: pattern B. Rows are tokens, columns experts.
//
// A   logits                 p (in T)          e1 e2  gates              first  second slot
// t0  0   -3F  -1.5F -4.5F   1 0 0 0           0  2   1, 0               0      - (gate 0)
// t1  -4F 0    -3F   -2F     0 1 0 0           1  3   1, 0               0      - (gate 0)
// t2  -1  -2   0     -3      softmax           2  0   e/(1+e), 1/(1+e)   0      c0 + 0 = 1
// t3  -2  0    -1    -50     softmax           1  2   e/(1+e), 1/(1+e)   1      c2 + 0 = 1
//   first-choice counts c = (1, 2, 1, 0); C = ceil(2 * 4 / 4 * 1.0) = 2: everything routed
//   is kept. (By lowest index, t0's second choice would be expert 1 and t1's expert 0,
//   taking slot 1 of expert 0 with weight 0 and dropping t2's second choice at slot 2.)
// B
// t0  0   -3F  -3F   -4.5F   1 0 0 0           0  1   1, 0               0      - (gate 0)
// t1  -3F -3F  0     -3F     0 0 1 0           2  0   1, 0               0      - (gate 0)
// t2  0   0    -5F   -5F     .5 .5 0 0         0  1   .5, .5             1      c1 + 0 = 0
// t3  -5F -1   -5F   0       0 p 0 q           3  1   e/(1+e), 1/(1+e)   0      c1 + 1 = 1
//   equal logits: the lowest index (t0, t1's second choices, t2's first); c = (2, 0, 1, 1).
template <class T>
std::vector<T> logits_of_groups() {
  const double F = far<T>;
  const std::array<std::array<double, 4>, 4> a{{{0, -3 * F, -1.5 * F, -4.5 * F},
                                                {-4 * F, 0, -3 * F, -2 * F},
                                                {-1, -2, 0, -3},
                                                {-2, 0, -1, -50}}};
  const std::array<std::array<double, 4>, 4> b{{{0, -3 * F, -3 * F, -4.5 * F},
                                                {-3 * F, -3 * F, 0, -3 * F},
                                                {0, 0, -5 * F, -5 * F},
                                                {-5 * F, -1, -5 * F, 0}}};
  std::vector<T> out;
  for (std::size_t g = 0; g < G; ++g) {
    const auto& rows = g % 2 == 0 ? a : b;
    for (const auto& row : rows)
      for (double v : row) out.push_back(static_cast<T>(v));
  }
  return out;
}

struct choice {
  int expert, slot;
  double gate;
};

// [pattern][token][k]
std::array<std::array<std::array<choice, 2>, 4>, 2> expected() {
  const double e = std::exp(1.0);
  const double hi = e / (1 + e), lo = 1 / (1 + e);
  return {{{{{{{0, 0, 1}, {2, -1, 0}}},
             {{{1, 0, 1}, {3, -1, 0}}},
             {{{2, 0, hi}, {0, 1, lo}}},
             {{{1, 1, hi}, {2, 1, lo}}}}},
           {{{{{0, 0, 1}, {1, -1, 0}}},
             {{{2, 0, 1}, {0, -1, 0}}},
             {{{0, 1, .5}, {1, 0, .5}}},
             {{{3, 0, hi}, {1, 1, lo}}}}}}};
}

std::int64_t sum_over_world(std::int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

template <class T, class Mesh>
void check_routing(const moe::gating_options& o, std::size_t capacity) {
  using logits_t = tensor<T, Mesh, "gse", layout<split<'g', "dp">>>;
  const Mesh mesh(MPI_COMM_WORLD, {testing::world().size});
  const auto x = logits_of_groups<T>();
  ad::tape t;
  auto logits = t.parameter(logits_t::from_global(mesh, {G, S, E}, std::span<const T>(x)));
  auto r = moe::gating(logits, o);
  REQUIRE(r.capacity == capacity);

  const auto experts = to_global(r.expert_index);
  const auto slots = to_global(r.slot_index);
  const auto weights = to_global(r.weight.value());
  const auto dispatch = to_global(r.dispatch);
  const auto combine = to_global(r.combine.value());
  REQUIRE(experts.size() == G * S * K);
  REQUIRE(dispatch.size() == G * S * E * capacity);
  const auto want = expected();
  std::vector<double> want_dispatch(dispatch.size(), 0), want_combine(dispatch.size(), 0);
  std::int64_t want_dropped = 0;
  for (std::size_t g = 0; g < G; ++g) {
    for (std::size_t s = 0; s < S; ++s) {
      for (std::size_t k = 0; k < K; ++k) {
        CAPTURE(g);
        CAPTURE(s);
        CAPTURE(k);
        const choice& c = want[g % 2][s][k];
        const std::size_t at = (g * S + s) * K + k;
        CHECK(experts[at] == c.expert);
        CHECK(slots[at] == c.slot);
        CHECK(static_cast<double>(weights[at]) == doctest::Approx(c.gate).epsilon(1e-6));
        if (c.slot < 0) {
          CHECK(weights[at] == T(0));
          ++want_dropped;
          continue;
        }
        const std::size_t cell = ((g * S + s) * E + static_cast<std::size_t>(c.expert)) * capacity +
                                 static_cast<std::size_t>(c.slot);
        want_dispatch[cell] = 1;
        want_combine[cell] = c.gate;
      }
    }
  }
  for (std::size_t i = 0; i < dispatch.size(); ++i) {
    CAPTURE(i);
    CHECK(static_cast<double>(dispatch[i]) == want_dispatch[i]);
    CHECK(static_cast<double>(combine[i]) == doctest::Approx(want_combine[i]).epsilon(1e-6));
  }
  // Statistics: first choices per expert (A: 1 2 1 0, B: 2 0 1 1, two groups of each), and
  // the zero-gate choices counted as dropped, not kept.
  const std::array<std::int64_t, E> first{6, 4, 4, 2};
  for (std::size_t e = 0; e < E; ++e) {
    CHECK(sum_over_world(r.stats.tokens_per_expert[e]) == first[e]);
  }
  CHECK(sum_over_world(r.stats.dropped) == want_dropped);
  CHECK(want_dropped == 8);
}

template <class Mesh>
void check_backend() {
  // Without random routing (the old code routed the zero gates there), and in evaluation.
  const moe::gating_options train{.top_k = 2, .capacity_factor = 1.0, .random_routing = false};
  const moe::gating_options eval{.top_k = 2, .eval_capacity_factor = 2.0, .training = false};
  // Random routing never routes a zero gate either (u < 2 * 0 is false); t2 of B has
  // 2 * g2 = 1 > u: routed whatever the draw. The others' draws decide, so only B's t2 and
  // the zero gates are checked there (through expert_index and slot_index).
  SUBCASE("float, training without random routing") { check_routing<float, Mesh>(train, 2); }
  SUBCASE("double, training without random routing") { check_routing<double, Mesh>(train, 2); }
  SUBCASE("float, evaluation (capacity 4)") { check_routing<float, Mesh>(eval, 4); }
  SUBCASE("double, evaluation (capacity 4)") { check_routing<double, Mesh>(eval, 4); }
  SUBCASE("random routing: zero gates are never routed") {
    using logits_t = tensor<float, Mesh, "gse", layout<split<'g', "dp">>>;
    const Mesh mesh(MPI_COMM_WORLD, {testing::world().size});
    const auto x = logits_of_groups<float>();
    ad::tape t;
    auto logits = t.constant(logits_t::from_global(mesh, {G, S, E}, std::span<const float>(x)));
    for (std::uint64_t seed = 0; seed < 8; ++seed) {
      CAPTURE(seed);
      auto r = moe::gating(logits, {.top_k = 2, .capacity_factor = 1.0, .seed = seed});
      const auto experts = to_global(r.expert_index);
      const auto slots = to_global(r.slot_index);
      const auto want = expected();
      for (std::size_t g = 0; g < G; ++g) {
        for (std::size_t s = 0; s < S; ++s) {
          const choice& c = want[g % 2][s][1];
          const std::size_t at = (g * S + s) * K + 1;
          CHECK(experts[at] == c.expert);
          if (c.gate == 0) CHECK(slots[at] == -1);
          if (g % 2 == 1 && s == 2) CHECK(slots[at] == 0);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("gating with underflowing softmax: ties by logit, zero gates not routed (host)") {
  check_backend<mesh<"dp">>();
}

TEST_CASE("gating with underflowing softmax: ties by logit, zero gates not routed (emulated)") {
  check_backend<emulated_mesh<"dp">>();
}

}  // namespace routing_ties_tests

TEST_SUITE_END();
