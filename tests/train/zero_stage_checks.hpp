// The checks of one ZeRO stage (fp32), as the members of zero_stage_checks<Stage>; the
// four stages' test cases are in zero_stages_test.cpp, one translation unit:
//   - N ranks train like 1 rank: 20 steps, losses within 1e-5 relative, same parameters;
//   - the bytes of parameter and gradient collectives per step, from the communicators'
//     counters, equal the ZeRO table's formula (docs/design-notes.md: 2 Psi (N-1)/N
//     elements for stages 0-2, 3 Psi (N-1)/N for stage 3) and the planner's figure; scalar
//     reductions are counted apart;
//   - the model-state bytes per rank, from zest's own allocation accounting, equal the
//     stage's formula (and the planner's), and stage 3 keeps at most two groups gathered.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "train/training_fixture.hpp"
#include "zest/zero/planner.hpp"

namespace zest::testing {

template <int test_stage>
struct zero_stage_checks {
  using stage_t = zero_stage<test_stage>;
  using world_policy = training_policy<world_mesh, stage_t, float>;

  // N ranks train like one rank
  static void trains_like_one_rank() {
    const auto mesh = make_world_mesh();
    zero_engine<world_policy> engine(mesh, {.seed = 11});
    gpt<world_policy> model(engine, small_gpt());
    const auto losses = train_steps(engine, model, 0, 20);
    const auto params = parameter_values(engine);

    const auto one = make_single_mesh();
    zero_engine<world_policy> ref_engine(one, {.seed = 11});
    gpt<world_policy> ref_model(ref_engine, small_gpt());
    const auto ref_losses = train_steps(ref_engine, ref_model, 0, 20);
    const auto ref_params = parameter_values(ref_engine);

    check_same_losses(losses, ref_losses);
    CHECK(losses.back() < losses.front() - 0.3);  // it learns
    check_same_parameters(params, ref_params);
  }

  // bytes communicated per step equal the formula
  static void bytes_equal_formula() {
    const auto mesh = make_world_mesh();
    zero_engine<world_policy> engine(mesh, {.seed = 3});
    gpt<world_policy> model(engine, small_gpt());
    auto s = sampler();
    const auto [in, tg] = s.batch<"dp">(mesh, 0);
    const auto r = train_step(engine, model, in, tg, 1e-3);

    const auto psi = static_cast<std::uint64_t>(engine.parameter_count());
    const auto n = static_cast<std::uint64_t>(mesh.world_size());
    REQUIRE(psi % n == 0);
    const std::uint64_t share = psi * (n - 1) / n * sizeof(float);  // Psi (N-1)/N elements
    const std::uint64_t expected = (test_stage == 3 ? 3 : 2) * share;
    CHECK(r.traffic.bytes_sent() == expected);
    CHECK(static_cast<double>(r.traffic.bytes_sent()) ==
          zero_formula(test_stage, static_cast<double>(psi), static_cast<double>(n), fp32_adam)
                  .elements_sent *
              sizeof(float));
    if (n > 1) {
      if (test_stage == 0) {
        CHECK(r.traffic[collective::all_reduce].bytes_sent == 2 * share);
      } else {
        CHECK(r.traffic[collective::reduce_scatter].bytes_sent == share);
        CHECK(r.traffic[collective::all_gather].bytes_sent == (test_stage == 3 ? 2 : 1) * share);
      }
    }
    // The planner derives the same figure from the same layouts.
    const auto plan = plan_zero<stage_t>(model.shape(), mesh, fp32_adam);
    CHECK(r.traffic.bytes_sent() == plan.bytes_sent());
    // Loss and gradient norm: scalar reductions on the world communicator, apart.
    CHECK(r.scalar_traffic[collective::all_reduce].calls >= 2);
    CHECK(r.scalar_traffic.bytes_sent() <= 64 * r.scalar_traffic.calls());
  }

  // model-state bytes per rank equal the formula
  static void states_equal_formula() {
    const auto mesh = make_world_mesh();
    const std::int64_t before = memory::live_bytes();
    zero_engine<world_policy> engine(mesh, {.seed = 5});
    gpt<world_policy> model(engine, small_gpt());
    const std::int64_t states = memory::live_bytes() - before;

    const auto psi = static_cast<double>(engine.parameter_count());
    const auto n = static_cast<double>(mesh.world_size());
    const double formula = zero_formula(test_stage, psi, n, fp32_adam).memory_bytes;
    INFO("measured " << states << " bytes, formula " << formula);
    CHECK(static_cast<double>(states) >= 0.95 * formula);
    CHECK(static_cast<double>(states) <= 1.05 * formula);
    const auto plan = plan_zero<stage_t>(model.shape(), mesh, fp32_adam);
    CHECK(static_cast<std::uint64_t>(states) == plan.memory.total());

    // A step leaves the model states as they were, and stage 3 holds at most two groups.
    (void)train_steps(engine, model, 0, 2);
    CHECK(memory::live_bytes() - before == states);
    if (test_stage == 3) {
      CHECK(engine.peak_live_groups() <= engine.options().max_live_groups);
      CHECK(engine.peak_live_groups() >= 1);
    }
  }

  // buckets and prefetch change the calls, not the numbers
  static void buckets_change_calls_not_numbers() {
    const auto mesh = make_world_mesh();
    zero_engine<world_policy> whole(mesh, {.seed = 6});
    gpt<world_policy> model_whole(whole, small_gpt());
    zero_options small;
    small.seed = 6;
    small.bucket_elements = 2000;  // several gradient collectives per block
    small.prefetch = false;
    zero_engine<world_policy> bucketed(mesh, small);
    gpt<world_policy> model_bucketed(bucketed, small_gpt());

    auto s = sampler();
    for (std::size_t k = 0; k < 3; ++k) {
      const auto [in, tg] = s.batch<"dp">(mesh, k);
      const auto a = train_step(whole, model_whole, in, tg, 1e-3);
      const auto b = train_step(bucketed, model_bucketed, in, tg, 1e-3);
      CHECK(std::abs(a.loss - b.loss) <= 1e-6 * std::abs(a.loss));
      CHECK(a.traffic.bytes_sent() == b.traffic.bytes_sent());
      if (test_stage != 1 && mesh.world_size() > 1) {
        // Stage 1 reduces at the step, the others during backward: buckets add calls there.
        const collective kind =
            test_stage == 0 ? collective::all_reduce : collective::reduce_scatter;
        CHECK(b.traffic[kind].calls > a.traffic[kind].calls);
      }
    }
    CHECK(parameter_values(whole) == parameter_values(bucketed));
    if (test_stage == 3) {
      CHECK(whole.peak_live_groups() == 2);     // one computing, the next one prefetched
      CHECK(bucketed.peak_live_groups() == 1);  // without prefetch
    }
  }
};

}  // namespace zest::testing
