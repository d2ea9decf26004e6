// A Megatron-style tensor-parallel MLP (tp_mlp.hpp) on every 2-D mesh dp x tp of the world,
// under ZeRO stages 0 and 3:
//   - 5 training steps equal a run on one process (losses within 1e-5 relative, parameters
//     within 1e-5 after gathering);
//   - the bytes each axis sends per step, from its communicator's counters, equal the
//     formulas the layouts imply:
//       tp: the reduction of the row-parallel output, "btm" [B/n_dp, T, M] partial(tp) ->
//           replicate, an all-reduce forward and one backward (the gradient of a replicated
//           value is pending over tp), and the all-reduce over tp of the gradient of the
//           tp-replicated output bias [M]: 2 (n_tp - 1)/n_tp of each;
//       dp: ZeRO over this rank's tp slice of the parameters, Psi_local = 2 M H / n_tp +
//           H / n_tp + M: stage 0 all-reduces 2 Psi_local (n_dp - 1)/n_dp, stage 3
//           all-gathers twice and reduce-scatters once, Psi_local (n_dp - 1)/n_dp each.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/tp_mlp.hpp"
#include "support/fixtures.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/train/train_step.hpp"

TEST_SUITE_BEGIN("nn_tensor_parallel");
// One namespace per file: the files of this folder share one unity translation unit.
namespace tensor_parallel_tests {

namespace {
using namespace zest;
using namespace zest::testing;

using grid_mesh = zest::mesh<"dp", "tp">;
constexpr std::int64_t steps = 5;
constexpr double lr = 1e-2;

struct run_result {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  std::vector<comm_stats> dp, tp;  // per step
};

template <class Stage, class Mesh>
run_result train(const Mesh& mesh) {
  using policy = training_policy<Mesh, Stage, float>;
  const tp_sizes s;
  zero_engine<policy> engine(mesh, {.seed = 7});
  const tp_regression<policy> model(engine, s);
  run_result r;
  for (std::int64_t k = 0; k < steps; ++k) {
    const auto [in, tg] = tp_batch(mesh, s, k);
    const comm_stats dp_before = mesh.axis(0).stats(), tp_before = mesh.axis(1).stats();
    r.losses.push_back(train_step(engine, model, in, tg, lr, static_cast<std::uint64_t>(k)).loss);
    r.dp.push_back(mesh.axis(0).stats() - dp_before);
    r.tp.push_back(mesh.axis(1).stats() - tp_before);
  }
  for (const auto* p : engine.parameters()) r.params[p->name()] = p->whole_value();
  return r;
}

template <class Stage>
void check_stage() {
  constexpr int stage = Stage::stage;
  // The one-process reference on the same mesh type over MPI_COMM_SELF: it shares the
  // N-rank runs' instantiations instead of compiling the model and engine a second time for
  // zest::local_mesh (which has tests of its own, tests/mesh), and its collectives move
  // nothing.
  const grid_mesh one(MPI_COMM_SELF, {1, 1});
  const run_result ref = train<Stage>(one);
  CHECK(ref.losses.back() < ref.losses.front());  // it learns

  for (const auto& shape : mesh_shapes()) {
    const auto n_dp = static_cast<std::uint64_t>(shape[0]);
    const auto n_tp = static_cast<std::uint64_t>(shape[1]);
    INFO("mesh dp=" << n_dp << " x tp=" << n_tp << ", ZeRO-" << stage);
    const grid_mesh mesh(MPI_COMM_WORLD, {shape[0], shape[1]});
    const run_result r = train<Stage>(mesh);

    REQUIRE(r.losses.size() == ref.losses.size());
    for (std::size_t k = 0; k < r.losses.size(); ++k) {
      INFO("step " << k << ": " << r.losses[k] << " vs " << ref.losses[k]);
      CHECK(std::abs(r.losses[k] - ref.losses[k]) <= 1e-5 * std::abs(ref.losses[k]));
    }
    REQUIRE(r.params.size() == ref.params.size());
    for (const auto& [name, values] : r.params) {
      const auto& want = ref.params.at(name);
      REQUIRE(values.size() == want.size());
      double worst = 0;
      for (std::size_t i = 0; i < values.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(values[i] - want[i])));
      INFO("parameter " << name << ": largest difference " << worst);
      CHECK(worst <= 1e-5);
    }

    // The formulas, in floats sent by this rank per step.
    const tp_sizes s;
    const std::uint64_t B = s.batch, T = s.time, M = s.width, H = s.hidden;
    REQUIRE(B % n_dp == 0);
    const std::uint64_t activations = B / n_dp * T * M;
    REQUIRE(activations % n_tp == 0);
    REQUIRE(M % n_tp == 0);
    const std::uint64_t tp_all_reduce =
        2 * (2 * activations * (n_tp - 1) / n_tp) + 2 * M * (n_tp - 1) / n_tp;
    const std::uint64_t psi_local = 2 * M * H / n_tp + H / n_tp + M;
    REQUIRE(psi_local % n_dp == 0);
    const std::uint64_t dp_share = psi_local * (n_dp - 1) / n_dp;
    constexpr std::uint64_t f = sizeof(float);

    for (std::size_t k = 0; k < r.tp.size(); ++k) {
      INFO("step " << k);
      const comm_stats& tp = r.tp[k];
      const comm_stats& dp = r.dp[k];
      CHECK(tp[collective::all_reduce].bytes_sent == tp_all_reduce * f);
      CHECK(tp.bytes_sent() == tp_all_reduce * f);  // nothing else over tp
      if (n_tp > 1) CHECK(tp[collective::all_reduce].calls == 3);
      if (stage == 0) {
        CHECK(dp[collective::all_reduce].bytes_sent == 2 * dp_share * f);
        CHECK(dp.bytes_sent() == 2 * dp_share * f);
      } else {
        CHECK(dp[collective::all_gather].bytes_sent == 2 * dp_share * f);
        CHECK(dp[collective::reduce_scatter].bytes_sent == dp_share * f);
        CHECK(dp.bytes_sent() == 3 * dp_share * f);
      }
    }
  }
}

TEST_CASE(
    "tensor-parallel MLP, ZeRO-0: every dp x tp mesh trains like one rank, bytes by formula") {
  check_stage<zero_stage<0>>();
}

TEST_CASE(
    "tensor-parallel MLP, ZeRO-3: every dp x tp mesh trains like one rank, bytes by formula") {
  check_stage<zero_stage<3>>();
}

}  // namespace

}  // namespace tensor_parallel_tests

TEST_SUITE_END();
