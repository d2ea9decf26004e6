// redistribute_all / redistribute_async: a group of tensors moved together. Random groups of
// tensors of different dims, extents and transitions on a 2-D mesh give what each tensor's
// own redistribute gives, send the same bytes in all, and make one collective per axis and
// step for tensors whose transitions agree; the typed forms, the non-blocking handle and the
// errors.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/tensor/redistribute.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using mesh_t = mesh<"dp", "tp">;

// Bytes sent by every rank together (a coalesced all_reduce's per-rank share is balanced over
// the whole buffer, so only the sum over ranks adds up tensor by tensor).
std::uint64_t world_bytes(const mesh_t& m) {
  std::uint64_t b = m.stats().bytes_sent();
  MPI_Allreduce(MPI_IN_PLACE, &b, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return b;
}

// One member of a random group: a 3-D "abc" or 2-D "ca" tensor.
struct member {
  bool three_d = true;
  std::array<std::size_t, 3> g3{};
  std::array<std::size_t, 2> g2{};
  layout_value from{}, to{};
};

template <fixed_string Dims, std::size_t Rank>
void add_member(detail::transition_group<double, mesh_t>& group, const member& mb,
                const std::array<std::size_t, Rank>& g, const mesh_t& m, std::uint32_t salt,
                std::vector<std::vector<double>>& inputs,
                std::vector<std::array<std::size_t, Rank>>& locals) {
  std::array<std::size_t, Rank> local{};
  inputs.push_back(make_shard<double, Dims>(mb.from, g, m, salt, &local));
  locals.push_back(local);
  const auto plan = transition_plan_for<Dims>(mb.from, mb.to, g, m);
  group.add(view_of<Dims>, mb.from, plan, detail::to_shard_extents(g),
            detail::to_shard_extents(local), std::span<const double>(inputs.back()));
}

TEST_CASE("a random group moves as its tensors would alone, with the same bytes") {
  std::mt19937 rng(2024);  // same stream on every rank
  const auto l3 = layouts_on_two_axes("abc");
  const auto l2 = layouts_on_two_axes("ca");
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    for (int trial = 0; trial < 40; ++trial) {
      const std::size_t count = 1 + rng() % 5;
      std::vector<member> members(count);
      for (auto& mb : members) {
        mb.three_d = rng() % 3 != 0;
        mb.g3 = {rng() % 6, 1 + rng() % 7, 1 + rng() % 5};
        mb.g2 = {1 + rng() % 9, rng() % 5};
        const auto& ls = mb.three_d ? l3 : l2;
        mb.from = ls[rng() % ls.size()];
        mb.to = ls[rng() % ls.size()];
      }
      CAPTURE(m.describe());
      CAPTURE(trial);
      // Each alone: its result brought to replicate, and the bytes and calls it takes.
      std::vector<std::vector<double>> alone;
      std::uint64_t alone_bytes = 0;
      std::size_t alone_calls = 0;
      for (std::size_t k = 0; k < count; ++k) {
        const auto& mb = members[k];
        const auto salt = static_cast<std::uint32_t>(k + 3);
        auto run_one = [&]<fixed_string Dims>(const auto& g) {
          auto local = g;
          auto data = make_shard<double, Dims>(mb.from, g, m, salt, &local);
          m.reset_stats();
          auto moved =
              detail::run_transition<Dims>(transition_plan_for<Dims>(mb.from, mb.to, g, m), mb.from,
                                           local, std::span<const double>(data), g, m);
          alone_bytes += world_bytes(m);
          alone_calls += m.stats().calls();
          auto to_local = g;
          (void)make_shard<double, Dims>(mb.to, g, m, salt, &to_local);
          const auto full =
              detail::run_transition<Dims>(fixed_order_plan(mb.to, replicated_layout(2)), mb.to,
                                           to_local, std::move(moved), g, m);
          alone.emplace_back(full.begin(), full.end());
        };
        if (mb.three_d) {
          run_one.template operator()<"abc">(mb.g3);
        } else {
          run_one.template operator()<"ca">(mb.g2);
        }
      }
      // Together.
      detail::transition_group<double, mesh_t> group(m);
      std::vector<std::vector<double>> inputs;
      inputs.reserve(count);
      std::vector<std::array<std::size_t, 3>> locals3;
      std::vector<std::array<std::size_t, 2>> locals2;
      for (std::size_t k = 0; k < count; ++k) {
        const auto salt = static_cast<std::uint32_t>(k + 3);
        if (members[k].three_d) {
          add_member<"abc">(group, members[k], members[k].g3, m, salt, inputs, locals3);
        } else {
          add_member<"ca">(group, members[k], members[k].g2, m, salt, inputs, locals2);
        }
      }
      m.reset_stats();
      group.run();
      CHECK(world_bytes(m) == alone_bytes);
      CHECK(m.stats().calls() <= alone_calls);
      for (std::size_t k = 0; k < count; ++k) {
        const auto& mb = members[k];
        CHECK(group.layout(k) == mb.to);
        auto back = [&]<fixed_string Dims>(const auto& g) {
          std::array<std::size_t, Dims.size()> local{};
          std::copy_n(group.local(k).begin(), local.size(), local.begin());
          auto expect_local = local;
          (void)make_shard<double, Dims>(mb.to, g, m, 0, &expect_local);
          CHECK(local == expect_local);
          const auto full = detail::run_transition<Dims>(
              fixed_order_plan(mb.to, replicated_layout(2)), mb.to, local, group.release(k), g, m);
          return std::vector<double>(full.begin(), full.end());
        };
        const auto got = mb.three_d ? back.template operator()<"abc">(mb.g3)
                                    : back.template operator()<"ca">(mb.g2);
        CHECK(relative_error(got, alone[k]) < 1e-12);
      }
    }
  }
}

TEST_CASE("tensors whose transitions agree share one collective per axis and step") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    using w_t = tensor<float, mesh_t, "mh", layout<split<'m', "dp">>>;
    using b_t = tensor<float, mesh_t, "h", layout<split<'h', "dp">>>;
    using g_t = tensor<float, mesh_t, "hm", layout<partial<"dp">>>;
    const auto w = make_tensor<w_t>(m, {7, 5}, 1);
    const auto b = make_tensor<b_t>(m, {5}, 2);
    const auto v = make_tensor<w_t>(m, {3, 4}, 3);

    // One tensor's transition alone: its calls (one all_gather over dp, also on one rank).
    m.reset_stats();
    (void)redistribute<layout<>>(w);
    const auto one = m.stats().calls();
    CHECK(one == 1);

    // ZeRO-3's gather: three shards -> replicate, one all_gather over dp.
    m.reset_stats();
    auto [wf, bf, vf] = redistribute_all<layout<>>(w, b, v);
    CHECK(m.stats().calls() == one);
    CHECK(m.axis(0).stats().calls() == one);
    CHECK(to_global(wf) == to_global(w));
    CHECK(to_global(bf) == to_global(b));
    CHECK(to_global(vf) == to_global(v));
    static_assert(std::is_same_v<decltype(wf), tensor<float, mesh_t, "mh">>);

    // ZeRO-2's gradient: partial sums -> each split on its own dim, one reduce_scatter.
    const auto g1 = make_tensor<g_t>(m, {6, 9}, 4);
    const auto g2 = make_tensor<g_t>(m, {2, 3}, 5);
    m.reset_stats();
    const auto [s1, s2] =
        redistribute_all<layout<split<'h', "dp">>, layout<split<'m', "dp">>>(g1, g2);
    CHECK(m.stats().calls() == one);
    CHECK(relative_error(to_global(s1), global_values(std::array<std::size_t, 2>{6, 9}, 4)) < 1e-6);
    CHECK(relative_error(to_global(s2), global_values(std::array<std::size_t, 2>{2, 3}, 5)) < 1e-6);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(s2)>,
                                 tensor<float, mesh_t, "hm", layout<split<'m', "dp">>>>);
  }
}

TEST_CASE("redistribute_async: issued at once, completed by wait, rvalues handed over") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    using x_t = tensor<double, mesh_t, "abc", layout<split<'a', "dp">, partial<"tp">>>;
    using y_t = tensor<double, mesh_t, "ab", layout<split<'b', "tp">>>;
    const std::array<std::size_t, 3> gx{5, 4, 3};
    const std::array<std::size_t, 2> gy{7, 6};
    const auto x = make_tensor<x_t>(m, gx, 6);
    auto y = make_tensor<y_t>(m, gy, 7);
    const auto want_x = to_global(redistribute<layout<split<'c', "tp">>>(x));
    const auto want_y = to_global(y);
    auto pending = redistribute_async<layout<split<'c', "tp">>, layout<>>(x, std::move(y));
    // Other collectives may run between the issue and the wait on other communicators.
    double one = 1;
    m.world().all_reduce(std::span<double>(&one, 1), reduce_op::sum);
    CHECK(one == m.world_size());
    const auto [xs, ys] = pending.wait();
    CHECK(to_global(xs) == want_x);
    CHECK(to_global(ys) == want_y);
    CHECK_THROWS_WITH_AS((void)pending.wait(), doctest::Contains("wait() called twice"),
                         std::logic_error);
  }
}

TEST_CASE("a group on two mesh objects is refused with the tensor's index") {
  const auto shape = mesh_shapes().front();
  mesh_t m1(MPI_COMM_WORLD, shape);
  mesh_t m2(MPI_COMM_WORLD, shape);
  using x_t = tensor<float, mesh_t, "ab", layout<split<'a', "dp">>>;
  const auto a = make_tensor<x_t>(m1, {4, 2}, 1);
  const auto b = make_tensor<x_t>(m2, {4, 2}, 2);
  CHECK_THROWS_WITH_AS((void)redistribute_all<layout<>>(a, b),
                       doctest::Contains("tensor 1 (\"ab\") lives on another mesh object"),
                       shape_error);
}
}  // namespace
