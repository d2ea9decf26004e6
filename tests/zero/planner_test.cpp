// ZeRO stages as layouts, and the planner derived from them: static checks on the layouts
// and their transitions, the ZeRO table's formulas (docs/design-notes.md, "ZeRO stages")
// exactly where Psi and N_d divide, the ZeRO paper's figures, and uneven splits against a
// direct sum of balanced blocks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "zest/mesh/mesh_shape.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/stage.hpp"

namespace {
using namespace zest;
using dp_mesh = mesh_shape<"dp">;
using tp_dp_mesh = mesh_shape<"tp", "dp">;  // the data axis need not come first

template <int K>
constexpr zero_layouts lay = zero_stage<K>::template layouts<dp_mesh, "mh">;
template <class L>
constexpr layout_value lv = layout_value_of<dp_mesh, "mh", L>;

constexpr layout_value rep = lv<layout<>>;
constexpr layout_value part = lv<layout<partial<"dp">>>;
constexpr layout_value shard = lv<layout<split<'m', "dp">>>;

// The ZeRO table (docs/design-notes.md, "ZeRO stages"), row by row.
static_assert(lay<0> == zero_layouts{rep, rep, part, rep, rep, rep, rep});
static_assert(lay<1> == zero_layouts{rep, rep, part, shard, part, shard, shard});
static_assert(lay<2> == zero_layouts{rep, rep, part, shard, shard, shard, shard});
static_assert(lay<3> == zero_layouts{shard, rep, part, shard, shard, shard, shard});

// The gradient is the dual of the use on the data axes (a mask: here axis 0), at every stage.
static_assert(lay<3>.gradient == detail::dual_of_use(lay<3>.compute, 1U));
static_assert(detail::dual_of_use(part, 1U) == rep && detail::dual_of_use(shard, 1U) == shard);

// The layout types are the spellings a tensor can be declared with.
static_assert(std::is_same_v<zero_stage<3>::stored_layout<"mh">, layout<split<'m', "dp">>>);
static_assert(std::is_same_v<zero_stage<2>::stored_layout<"mh">, layout<>>);
static_assert(std::is_same_v<zero_stage<1>::gradient_buffer_layout<"mh">, layout<partial<"dp">>>);
static_assert(std::is_same_v<zero_stage<0>::kept_gradient_layout<"mh">, layout<>>);

// The split rule chooses the dim; another data axis name and another mesh position work.
static_assert(zero_stage<3, "dp", split_last_dim>::layouts<dp_mesh, "mh">.stored ==
              lv<layout<split<'h', "dp">>>);
static_assert(zero_stage<3, "data">::layouts<mesh_shape<"data">, "v">.stored ==
              layout_value_of<mesh_shape<"data">, "v", layout<split<'v', "data">>>);
static_assert(zero_stage<3>::layouts<tp_dp_mesh, "mh">.stored.splits(1, 'm'));
static_assert(zero_stage<3>::layouts<tp_dp_mesh, "mh">.stored.is_replicate(0));
static_assert(zero_stage<2>::layouts<tp_dp_mesh, "mh">.gradient.is_partial(1));
static_assert(zero_stage<2>::layouts<tp_dp_mesh, "mh">.gradient.is_replicate(0));

static_assert(is_zero_stage_v<zero_stage<2>> && !is_zero_stage_v<int>);
static_assert(!zero_stage<0>::partitions_optimizer_state &&
              zero_stage<1>::partitions_optimizer_state);
static_assert(!zero_stage<1>::partitions_gradients && zero_stage<2>::partitions_gradients);
static_assert(!zero_stage<2>::partitions_parameters && zero_stage<3>::partitions_parameters);

// The collectives of each phase follow from the transitions.
template <int K>
constexpr transition_plan phase(zero_phase p) {
  const zero_transfer t = transfer_of(lay<K>, p);
  return fixed_order_plan(t.from, t.to);
}
constexpr bool only(const transition_plan& p, step_kind k) {
  return p.size() == 1 && p[0].kind == k;
}

static_assert(phase<0>(zero_phase::forward_gather).size() == 0);
static_assert(only(phase<0>(zero_phase::gradient_reduction), step_kind::all_reduce));
static_assert(phase<0>(zero_phase::parameter_update).size() == 0);

static_assert(phase<1>(zero_phase::forward_gather).size() == 0);
static_assert(only(phase<1>(zero_phase::gradient_reduction), step_kind::reduce_scatter));
static_assert(only(phase<1>(zero_phase::parameter_update), step_kind::all_gather));
static_assert(only(phase<2>(zero_phase::gradient_reduction), step_kind::reduce_scatter));
static_assert(only(phase<2>(zero_phase::parameter_update), step_kind::all_gather));

static_assert(only(phase<3>(zero_phase::forward_gather), step_kind::all_gather));
static_assert(only(phase<3>(zero_phase::backward_gather), step_kind::all_gather));
static_assert(only(phase<3>(zero_phase::gradient_reduction), step_kind::reduce_scatter));
static_assert(phase<3>(zero_phase::parameter_update).size() == 0);
static_assert(phase<3>(zero_phase::gradient_reduction)[0].dim == 'm');

// The planner's positional dims.
static_assert(view_of<detail::positional_dims<3>()> == "abc");

// --- helpers ----------------------------------------------------------------------------

constexpr std::uint64_t k_bytes = 12;

// The ZeRO table's memory formula in integers (psi divisible by n).
std::uint64_t formula_memory(int stage, std::uint64_t psi, std::uint64_t n,
                             const training_precision& pr) {
  const std::uint64_t p = pr.parameter_bytes, g = pr.gradient_bytes, k = pr.k();
  switch (stage) {
    case 0: return (p + g + k) * psi;
    case 1: return (p + g) * psi + k * psi / n;
    case 2: return p * psi + (g + k) * psi / n;
    default: return (p + g + k) * psi / n;
  }
}
std::uint64_t formula_elements(int stage, std::uint64_t psi, std::uint64_t n) {
  return (stage == 3 ? 3U : 2U) * psi / n * (n - 1);
}

}  // namespace

TEST_CASE("mesh_shape: a mesh's shape without communicators") {
  const dp_mesh m({4096});
  CHECK(m.size(0) == 4096);
  CHECK(m.coord(0) == 0);
  CHECK(m.describe() == "mesh<dp=4096>");
  const tp_dp_mesh m2({2, 3}, {1, 2});
  CHECK(m2.rank() == 5);
  CHECK(m2.world_size() == 6);
  CHECK(m2.at({0, 1}).rank() == 1);
  CHECK_THROWS_AS(dp_mesh({0}), shape_error);
  CHECK_THROWS_AS(dp_mesh({4}, {4}), shape_error);
  static_assert(dp_mesh({8}, {3}).rank() == 3);  // constexpr too
}

TEST_CASE("gpt_model: GPT-2 small has 124,439,808 parameters") {
  const model_shape m = gpt_model(gpt2_small);
  CHECK(m.parameter_count() == 124'439'808ULL);
  CHECK(m.parameters.size() == 2 + 12 * 12 + 2);
  gpt_config untied = gpt2_small;
  untied.tied_output = false;
  CHECK(gpt_model(untied).parameter_count() == 124'439'808ULL + 50257ULL * 768);
}

TEST_CASE("planner: the ZeRO table's formulas exactly when N_d divides every split") {
  struct setting {
    std::uint64_t psi;
    int n;
  };
  // 7.5B over 64 (the paper), and 4096 ranks with a Psi it divides.
  const setting settings[] = {
      {1000, 1}, {8, 2}, {1'000'000, 4}, {7'500'000'000ULL, 64}, {4096ULL * 1'831'055, 4096}};
  for (const auto& pr : {mixed_precision_adam, fp32_adam}) {
    for (const auto& s : settings) {
      const dp_mesh mesh({s.n});
      const model_shape model = flat_model(s.psi);
      for (int stage = 0; stage <= 3; ++stage) {
        CAPTURE(stage);
        CAPTURE(s.psi);
        CAPTURE(s.n);
        const zero_plan p = plan_zero(stage, model, mesh, pr);
        const auto n = static_cast<std::uint64_t>(s.n);
        CHECK(p.memory.total() == formula_memory(stage, s.psi, n, pr));
        CHECK(p.elements_sent() == formula_elements(stage, s.psi, n));
        // Gradients (and the optimizer) in the gradient type, parameter gathers in the parameter type.
        CHECK(p.bytes_sent() == p.elements_sent() * pr.parameter_bytes);
        // The closed form agrees in floating point as well.
        const auto f =
            zero_formula(stage, static_cast<double>(s.psi), static_cast<double>(s.n), pr);
        CHECK(static_cast<double>(p.memory.total()) ==
              doctest::Approx(f.memory_bytes).epsilon(1e-12));
        CHECK(static_cast<double>(p.elements_sent()) ==
              doctest::Approx(f.elements_sent).epsilon(1e-12));
        if (s.n > 1) CHECK(p.psi_coefficient() == doctest::Approx(stage == 3 ? 3.0 : 2.0));
      }
    }
  }
}

TEST_CASE("planner: which collectives each stage sends, per phase") {
  const std::uint64_t psi = 64'000;
  const dp_mesh mesh({8});
  const auto model = flat_model(psi);
  const std::uint64_t part = psi / 8 * 7;  // Psi (N-1)/N elements, bf16 -> x2 bytes
  const auto z0 = plan_zero<zero_stage<0>>(model, mesh);
  CHECK(z0.bytes_of(collective::all_reduce) == 2 * part * 2);
  CHECK(z0.collectives_summary() == "all_reduce");
  const auto z1 = plan_zero<zero_stage<1>>(model, mesh);
  CHECK(z1.of(zero_phase::gradient_reduction)
            .bytes_by[static_cast<std::size_t>(collective::reduce_scatter)] == part * 2);
  CHECK(z1.of(zero_phase::parameter_update)
            .bytes_by[static_cast<std::size_t>(collective::all_gather)] == part * 2);
  CHECK(z1.collectives_summary() == "reduce_scatter + all_gather");
  const auto z3 = plan_zero<zero_stage<3>>(model, mesh);
  CHECK(z3.of(zero_phase::forward_gather).bytes == part * 2);
  CHECK(z3.of(zero_phase::backward_gather).bytes == part * 2);
  CHECK(z3.of(zero_phase::gradient_reduction).bytes == part * 2);
  CHECK(z3.of(zero_phase::parameter_update).bytes == 0);
  CHECK(z3.collectives_summary() == "all_gather + all_gather + reduce_scatter");

  // Memory by state: stage 1 keeps a full-size gradient buffer, stage 2 only its shard.
  const auto z2 = plan_zero<zero_stage<2>>(model, mesh);
  CHECK(z1.memory.gradients == 2 * psi);
  CHECK(z2.memory.gradients == 2 * psi / 8);
  CHECK(z1.memory.master == 4 * psi / 8);
  CHECK(z1.memory.optimizer_state == 8 * psi / 8);
  CHECK(z3.memory.parameters == 2 * psi / 8);
  CHECK(z0.memory.optimizer() == k_bytes * psi);
}

// Calls as the engine issues them: one coalesced collective per group, phase and axis step;
// the gradients' per bucket of at most bucket_elements (a parameter larger than that a
// bucket of its own); a parameter without a group alone. Bytes do not depend on grouping.
TEST_CASE("planner: calls per group and per gradient bucket") {
  const dp_mesh mesh({4});
  model_shape m{"grouped", {}};
  m.parameters = {{"a.w", {64, 8}, "a"}, {"a.b", {8}, "a"}, {"b.w", {64, 8}, "b"},
                  {"b.v", {64, 8}, "b"}, {"b.b", {8}, "b"}, {"alone", {16}}};
  model_shape apart = m;
  for (auto& p : apart.parameters) p.group.clear();
  const auto calls = [](const zero_plan& z, zero_phase phase, collective k) {
    return z.of(phase).calls[static_cast<std::size_t>(k)];
  };
  using enum collective;
  const auto z3 = plan_zero<zero_stage<3>>(m, mesh);
  CHECK(calls(z3, zero_phase::forward_gather, all_gather) == 3);  // groups a, b and the last
  CHECK(calls(z3, zero_phase::backward_gather, all_gather) == 3);
  CHECK(calls(z3, zero_phase::gradient_reduction, reduce_scatter) == 3);
  const auto z3_apart = plan_zero<zero_stage<3>>(apart, mesh);
  CHECK(calls(z3_apart, zero_phase::forward_gather, all_gather) == 6);
  CHECK(z3_apart.bytes_sent() == z3.bytes_sent());
  // Buckets of 600 elements: a's 520 in one; b's 512 + 512 + 8 in two (512 alone, 520).
  const auto z0 = plan_zero<zero_stage<0>>(m, mesh, mixed_precision_adam, 600);
  CHECK(calls(z0, zero_phase::gradient_reduction, all_reduce) == 1 + 2 + 1);
  const auto z0_one = plan_zero<zero_stage<0>>(m, mesh, mixed_precision_adam, 100);
  CHECK(calls(z0_one, zero_phase::gradient_reduction, all_reduce) == 2 + 3 + 1);
  CHECK(z0_one.bytes_sent() == z0.bytes_sent());
  // Stage 1's update gathers per group, its gradients' reduce-scatter per bucket.
  const auto z1 = plan_zero<zero_stage<1>>(m, mesh, mixed_precision_adam, 100);
  CHECK(calls(z1, zero_phase::parameter_update, all_gather) == 3);
  CHECK(calls(z1, zero_phase::gradient_reduction, reduce_scatter) == 6);
}

TEST_CASE("planner: the ZeRO paper's example, Psi = 7.5B, N_d = 64, K = 12") {
  const dp_mesh mesh({64});
  const auto model = flat_model(7'500'000'000ULL);
  // 120 GB baseline, then 31.4 / 16.6 / 1.9 GB (decimal, as the paper prints them).
  const double paper[] = {120, 31.4, 16.6, 1.9};
  const int digits[] = {0, 1, 1, 1};
  const std::uint64_t exact[] = {120'000'000'000ULL, 31'406'250'000ULL, 16'640'625'000ULL,
                                 1'875'000'000ULL};
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    const auto p = plan_zero(stage, model, mesh);
    CHECK(p.memory.total() == exact[stage]);
    const double scale = std::pow(10.0, digits[stage]);
    CHECK(std::round(static_cast<double>(p.memory.total()) / 1e9 * scale) ==
          std::round(paper[stage] * scale));
  }
}

TEST_CASE("planner: uneven splits equal a direct sum of balanced blocks, on every rank") {
  // The token embedding of GPT-2 over 3 ranks: 50257 = 16753 + 16752 + 16752 rows.
  const std::uint64_t rows = 50257, cols = 768, n = 3;
  const model_shape model{"wte", {{"wte", {rows, cols}}}};
  const std::uint64_t psi = rows * cols;
  for (int stage = 0; stage <= 3; ++stage) {
    std::uint64_t total_elements = 0;
    for (int r = 0; r < 3; ++r) {
      CAPTURE(stage);
      CAPTURE(r);
      const auto ur = static_cast<std::uint64_t>(r);
      const auto p = plan_zero(stage, model, dp_mesh({3}, {r}));
      const std::uint64_t mine = balanced_block(rows, n, ur).size * cols;  // my block of rows
      const std::uint64_t params = stage == 3 ? mine : psi;
      const std::uint64_t grads = stage >= 2 ? mine : psi;
      const std::uint64_t optim = stage >= 1 ? mine : psi;
      CHECK(p.memory == model_state_bytes{2 * params, 2 * grads, 4 * optim, 8 * optim});
      // all-reduce: the ring over flat chunks of the whole gradient; reduce-scatter: all
      // but my block; all-gather: my block to each of the others.
      std::uint64_t expected = 0;
      if (stage == 0) expected = 2 * (psi - balanced_block(psi, n, ur).size);
      if (stage == 1 || stage == 2) expected = (psi - mine) + (n - 1) * mine;
      if (stage == 3) expected = 2 * (n - 1) * mine + (psi - mine);
      CHECK(p.elements_sent() == expected);
      total_elements += p.elements_sent();
    }
    // Summed over the ranks, uneven blocks still send the table's total exactly.
    CHECK(total_elements == (stage == 3 ? 3 : 2) * (n - 1) * psi);
  }
}

TEST_CASE("planner: GPT-2 small over 3 ranks, per parameter blocks summed") {
  const model_shape model = gpt_model(gpt2_small);
  const std::uint64_t n = 3;
  for (int r = 0; r < 3; ++r) {
    const auto ur = static_cast<std::uint64_t>(r);
    std::uint64_t shard = 0;  // elements of rank r's first-dim blocks, over all parameters
    for (const auto& prm : model.parameters) {
      shard += balanced_block(prm.extents[0], n, ur).size * (prm.elements() / prm.extents[0]);
    }
    const std::uint64_t psi = model.parameter_count();
    const auto p3 = plan_zero(3, model, dp_mesh({3}, {r}));
    CHECK(p3.memory.total() == 16 * shard);
    CHECK(p3.elements_sent() == 2 * (n - 1) * shard + (psi - shard));
    const auto p2 = plan_zero(2, model, dp_mesh({3}, {r}));
    CHECK(p2.memory.total() == 2 * psi + 14 * shard);
  }
}

TEST_CASE("planner: a GPT whose dims N_d divides meets the formula exactly") {
  gpt_config c = gpt2_small;
  c.vocab = 50304;  // padded to a multiple of 64, as GPT training code often does
  const model_shape model = gpt_model(c);
  const std::uint64_t psi = model.parameter_count();
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    const auto p = plan_zero(stage, model, dp_mesh({64}));
    CHECK(p.memory.total() == formula_memory(stage, psi, 64, mixed_precision_adam));
    CHECK(p.elements_sent() == formula_elements(stage, psi, 64));
  }
}

TEST_CASE("planner: only the data axis partitions; other mesh axes replicate") {
  const auto model = flat_model(4000);
  for (int stage = 0; stage <= 3; ++stage) {
    const auto one = plan_zero(stage, model, dp_mesh({4}));
    const auto two = plan_zero(stage, model, tp_dp_mesh({2, 4}, {1, 0}));
    CHECK(one.memory == two.memory);
    CHECK(one.bytes_sent() == two.bytes_sent());
    CHECK(two.data_parallel_size == 4);
  }
}

TEST_CASE("planner: a run-time stage gives the typed plan; errors are clear") {
  const auto model = gpt_model(gpt2_small);
  const dp_mesh mesh({4});
  const auto typed = plan_zero<zero_stage<2>>(model, mesh);
  const auto dynamic = plan_zero(2, model, mesh);
  CHECK(typed.memory == dynamic.memory);
  CHECK(typed.bytes_sent() == dynamic.bytes_sent());
  CHECK(typed.str() == dynamic.str());
  CHECK(typed.str().find("gradient_reduction") != std::string::npos);
  CHECK_THROWS_WITH_AS(plan_zero(4, model, mesh), doctest::Contains("stages 0-3"), shape_error);
  const model_shape scalar{"s", {{"s", {}}}};
  CHECK_THROWS_WITH_AS(plan_zero(3, scalar, mesh), doctest::Contains("extents {1}"), shape_error);
}
