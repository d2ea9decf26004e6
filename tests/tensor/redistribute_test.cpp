// redistribute: every pair of layouts of a 3-D tensor on a 2-D mesh, uneven extents, values
// against the global reference, and the communicators' byte counters against the plan and
// against the per-transition formulas (docs/design-notes.md, "Transitions: what each one
// sends").
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/plan/explain.hpp"
#include "zest/tensor/redistribute.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using mesh_t = mesh<"dp", "tp">;

template <class Mesh>
std::uint64_t planned_bytes(const transition_plan& plan, layout_value v,
                            const std::array<std::size_t, 3>& g, const Mesh& m, std::size_t elem) {
  std::uint64_t b = 0;
  for (const auto& s : plan) {
    if (is_collective(s.kind)) b += detail::step_bytes<"abc">(s, v, g, m, elem);
    v = detail::after_step(v, s);
  }
  return b;
}

TEST_CASE("every layout pair round-trips values and counts the planned bytes") {
  const auto layouts = layouts_on_two_axes("abc");
  REQUIRE(layouts.size() == 28);
  std::mt19937 rng(1234);  // same stream on every rank
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    for (int trial = 0; trial < 2; ++trial) {
      const std::array<std::size_t, 3> g{rng() % 7, 1 + rng() % 9, 1 + rng() % 6};
      const auto want = global_values(g, 7);
      for (const auto& from : layouts) {
        for (const auto& to : layouts) {
          CAPTURE(to_string(from, mesh_t::axis_names));
          CAPTURE(to_string(to, mesh_t::axis_names));
          CAPTURE(m.describe());
          CAPTURE(g);
          std::array<std::size_t, 3> local{};
          auto data = make_shard<double, "abc">(from, g, m, 7, &local);
          const transition_plan plan = fixed_order_plan(from, to);
          m.reset_stats();
          auto moved = detail::run_transition<"abc">(
              plan, from, local, host_vector<double>(data.begin(), data.end()), g, m);
          const comm_stats stats = m.stats();
          CHECK(stats.calls() == plan.collectives());
          CHECK(stats.bytes_sent() == planned_bytes(plan, from, g, m, sizeof(double)));
          // The new shard is what make_shard gives for `to`, except on partial axes, where
          // only the sum is defined: compare after bringing both to replicate.
          if (!to.any_partial()) {
            const auto expect = make_shard<double, "abc">(to, g, m, 7);
            REQUIRE(moved.size() == expect.size());
            for (std::size_t i = 0; i < expect.size(); ++i)
              CHECK(moved[i] == doctest::Approx(expect[i]));
          }
          std::array<std::size_t, 3> to_local{};
          (void)make_shard<double, "abc">(to, g, m, 7, &to_local);
          const auto full = detail::run_transition<"abc">(
              fixed_order_plan(to, replicated_layout(2)), to, to_local, std::move(moved), g, m);
          CHECK(relative_error(std::vector<double>(full.begin(), full.end()), want) < 1e-12);
        }
      }
    }
  }
}

TEST_CASE("byte counters equal the transition table's formula for each transition (even extents)") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    const std::size_t n = static_cast<std::size_t>(shape[0]);  // transitions on dp
    using x_rep = tensor<float, mesh_t, "abc">;
    using x_a = tensor<float, mesh_t, "abc", layout<split<'a', "dp">>>;
    using x_b = tensor<float, mesh_t, "abc", layout<split<'b', "dp">>>;
    using x_p = tensor<float, mesh_t, "abc", layout<partial<"dp">>>;
    const std::array<std::size_t, 3> g{8, 12, 5};  // divisible by 1, 2, 4
    const std::uint64_t S = 8 * 12 * 5 * sizeof(float);
    auto bytes = [&](auto&& run) {
      m.reset_stats();
      run();
      return m.stats().bytes_sent();
    };
    const auto xa = make_tensor<x_a>(m, g, 1);
    const auto xp = make_tensor<x_p>(m, g, 2);
    const auto xr = make_tensor<x_rep>(m, g, 3);
    CHECK(bytes([&] { (void)redistribute<layout<>>(xa); }) == (n - 1) * S / n);      // all-gather
    CHECK(bytes([&] { (void)redistribute<layout<>>(xp); }) == 2 * (n - 1) * S / n);  // all-reduce
    CHECK(bytes([&] { (void)redistribute<layout<split<'b', "dp">>>(xp); }) ==
          (n - 1) * S / n);  // reduce-scatter
    CHECK(bytes([&] { (void)redistribute<layout<split<'b', "dp">>>(xa); }) ==
          (n - 1) * S / n / n);                                                    // all-to-all
    CHECK(bytes([&] { (void)redistribute<layout<split<'a', "dp">>>(xr); }) == 0);  // slice
    CHECK(bytes([&] { (void)redistribute<layout<partial<"dp">>>(xr); }) == 0);  // keep on one rank
    CHECK(bytes([&] { (void)redistribute<layout<split<'a', "dp">>>(xa); }) == 0);  // nothing to do
    // And the typed results hold the right values.
    CHECK(relative_error(to_global(redistribute<layout<split<'b', "dp">>>(xa)),
                         global_values(g, 1)) < 1e-6);
    CHECK(relative_error(to_global(redistribute<layout<split<'c', "dp">>>(xp)),
                         global_values(g, 2)) < 1e-6);
    static_assert(std::is_same_v<decltype(redistribute<layout<split<'b', "dp">>>(xa)), x_b>);
  }
}

TEST_CASE("uneven splits: 50257 over the whole mesh, and chained transitions") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    using v_t = tensor<float, mesh_t, "v", layout<split<'v', "dp", "tp">>>;
    const std::array<std::size_t, 1> g{50257};
    const auto v = make_tensor<v_t>(m, g, 5);
    const int world = m.world_size();
    CHECK(v.local_count() ==
          balanced_block(50257, static_cast<std::size_t>(world), static_cast<std::size_t>(m.rank()))
              .size);
    CHECK(relative_error(to_global(v), global_values(g, 5)) < 1e-6);
    // split(v:dp,tp) -> split(v:tp,dp) -> partial(dp) split(v:tp) -> replicate
    auto a = redistribute<layout<split<'v', "tp", "dp">>>(v);
    auto b = redistribute<layout<partial<"dp">, split<'v', "tp">>>(a);
    CHECK(relative_error(to_global(b), global_values(g, 5)) < 1e-6);
  }
}

TEST_CASE("bfloat16 tensors move like any other element type") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    using x_t = tensor<bfloat16, mesh_t, "ab", layout<split<'a', "dp">, partial<"tp">>>;
    const std::array<std::size_t, 2> g{6, 5};
    const auto x = make_tensor<x_t>(m, g, 9);
    const auto y = redistribute<layout<split<'b', "tp">>>(x);
    CHECK(relative_error(to_global(y), global_values(g, 9)) < 2e-2);
  }
}

TEST_CASE("explain's bytes match what redistribute sends") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    using x_t = tensor<double, mesh_t, "abc", layout<split<'a', "dp">, partial<"tp">>>;
    const auto x = make_tensor<x_t>(m, {5, 7, 3}, 4);
    const auto report = explain<layout<split<'b', "dp", "tp">>>(x);
    m.reset_stats();
    (void)redistribute<layout<split<'b', "dp", "tp">>>(x);
    CHECK(m.stats().bytes_sent() == report.bytes());
    CHECK(m.stats().calls() == report.collectives());
  }
}
}  // namespace

namespace {
// Regression: g++ 12 once gave these two instantiations one mangled name (zero-valued
// elements of the layout_value argument were left out), so one body ran for both.
TEST_CASE("layouts that differ only by which axis splits get distinct code") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    using on_dp = tensor<float, mesh_t, "GS", layout<split<'G', "dp">>>;
    const auto a = make_tensor<on_dp>(m, {4, 3}, 3);
    m.reset_stats();
    const auto b = redistribute<layout<split<'G', "tp">>>(a);
    CHECK(m.stats().calls() == 1);  // all_gather over dp, then a free slice over tp
    const auto c = redistribute<layout<split<'G', "dp">>>(b);
    CHECK(m.stats().calls() == 2);
    CHECK(relative_error(to_global(c), global_values(std::array<std::size_t, 2>{4, 3}, 3)) < 1e-6);
  }
}
}  // namespace
