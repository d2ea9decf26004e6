// ZeRO++'s quantized wires as layout choices: qwZ (zero_stage<3>::with_quantized_weights<B>:
// the weight all-gathers in int8 blocks) and qgZ (::with_quantized_gradients<B>: the
// gradients' reduce-scatter as an int8 all-to-all), alone and with hpZ, on
// mesh<"dp_rep", "dp"> with dp_rep the nodes (the batch split over both). In every shape of
// the job's ranks over the two axes (1 x N, N x 1, 2 x 2):
//   - the bytes each axis's communicator counts in a step equal the planner's, and on one
//     axis zeropp_formula's (about 1/4 of fp32's for the gathers: 1 + 4/B bytes an element);
//   - a 300-step run's final loss is within 2 % of the unquantized run's;
//   - hpZ with qwZ still gathers nothing across the nodes in backward.
// The quantization error of one gather and one reduce-scatter against a reference quantizer
// is tests/tensor/wire_test.cpp's.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "train/training_fixture.hpp"
#include "zest/zero/planner.hpp"

TEST_SUITE_BEGIN("train_zeropp");

// A named namespace: the unity build puts the train suites in one translation unit.
namespace zeropp_checks {
using namespace zest;
using namespace zest::testing;

using node_mesh = zest::mesh<"dp_rep", "dp">;
using node_tokens = layout<split<'b', "dp_rep", "dp">>;
constexpr std::size_t node_axis = 0, gpu_axis = 1;

// Blocks of 8: every part of small_gpt's parameters per rank (1, 2 or 4 of them) is a whole
// number of blocks, so the formula holds exactly.
constexpr std::uint32_t block = 8;
using exact_stage = zero_stage<3, "dp_rep,dp">;
using qwz_stage = exact_stage::with_quantized_weights<block>;
using qgz_stage = exact_stage::with_quantized_gradients<block>;
using both_stage = qwz_stage::with_quantized_gradients<block>;
using all_stage = both_stage::with_secondary_over<"dp">;  // hpZ, qwZ and qgZ
// The same with the default blocks, 256 elements (what a user writes).
using zeropp_stage =
    exact_stage::with_secondary_over<"dp">::with_quantized_weights<>::with_quantized_gradients<>;
static_assert(zeropp_stage::gather_wire == int8_all_gathers(256));
template <class Stage>
using policy = training_policy<node_mesh, Stage, float>;

static_assert(qwz_stage::gather_wire == int8_all_gathers(block) &&
              qwz_stage::gradient_wire == exact_wire);
static_assert(both_stage::layouts<node_mesh, "mh">.gradient_wire == int8_reduce_scatters(block));
static_assert(std::is_same_v<all_stage::stored_layout<"mh">, exact_stage::stored_layout<"mh">>);
static_assert(
    zero_stage<2>::with_quantized_gradients<64>::layouts<mesh<"dp">, "mh">.gradient_wire ==
    int8_reduce_scatters(64));

// The shapes of the job's ranks over the two axes: testing::mesh_shapes() (1 x N, N x 1, 2 x 2).

// One step's bytes per axis: equal to the planner's, which prices the wires.
template <class Stage>
std::array<std::uint64_t, 2> step_bytes(const node_mesh& mesh) {
  using P = policy<Stage>;
  zero_engine<P> engine(mesh, {.seed = 3});
  gpt<P> model(engine, small_gpt());
  auto s = sampler();
  const auto [in, tg] = s.batch<node_tokens>(mesh, 0);
  const comm_stats node0 = mesh.axis(node_axis).stats(), gpu0 = mesh.axis(gpu_axis).stats();
  (void)train_step(engine, model, in, tg, 1e-3);
  const std::array<std::uint64_t, 2> bytes{(mesh.axis(node_axis).stats() - node0).bytes_sent(),
                                           (mesh.axis(gpu_axis).stats() - gpu0).bytes_sent()};
  const auto plan = plan_zero<Stage>(model.shape(), mesh, fp32_adam);
  CHECK(bytes[0] == plan.bytes_on(node_axis));
  CHECK(bytes[1] == plan.bytes_on(gpu_axis));
  return bytes;
}

TEST_CASE("qwZ and qgZ: bytes per axis equal the planner's, and on one axis the formula") {
  std::uint64_t psi = 0;
  {
    const auto one = make_single_mesh<node_mesh>();
    zero_engine<policy<exact_stage>> engine(one, {.seed = 3});
    gpt<policy<exact_stage>> model(engine, small_gpt());
    psi = engine.parameter_count();
  }
  for (const auto& shape : mesh_shapes()) {
    const node_mesh mesh(MPI_COMM_WORLD, shape);
    INFO(mesh.describe());
    const auto exact = step_bytes<exact_stage>(mesh);
    const auto qwz = step_bytes<qwz_stage>(mesh);
    const auto qgz = step_bytes<qgz_stage>(mesh);
    const auto both = step_bytes<both_stage>(mesh);
    const auto all = step_bytes<all_stage>(mesh);
    // qgZ under stages 1 (the buffer reduce-scattered at the step) and 2 (in backward):
    // the planner's bytes per axis (step_bytes checks them).
    (void)step_bytes<zero_stage<1, "dp_rep,dp">::with_quantized_gradients<block>>(mesh);
    (void)step_bytes<zero_stage<2, "dp_rep,dp">::with_quantized_gradients<block>>(mesh);
    const auto total = [](const std::array<std::uint64_t, 2>& b) { return b[0] + b[1]; };
    // The whole world on one axis: the formula, exactly.
    const double n = mesh.world_size();
    if (mesh.size(node_axis) == 1 || mesh.size(gpu_axis) == 1) {
      const auto p = static_cast<double>(psi);
      CHECK(static_cast<double>(total(exact)) == zeropp_formula(p, n, 0, 0, fp32_adam).total());
      CHECK(static_cast<double>(total(qwz)) == zeropp_formula(p, n, block, 0, fp32_adam).total());
      CHECK(static_cast<double>(total(qgz)) == zeropp_formula(p, n, 0, block, fp32_adam).total());
      CHECK(static_cast<double>(total(both)) ==
            zeropp_formula(p, n, block, block, fp32_adam).total());
    }
    if (n > 1) {
      // The gathers at 1.5 of fp32's 4 bytes an element (blocks of 8); qwZ and qgZ together
      // at 1.5 / 4 of the exact step's bytes.
      CHECK(static_cast<double>(total(both)) / static_cast<double>(total(exact)) ==
            doctest::Approx(1.5 / 4.0));
      // hpZ: backward gathers inside the node, so the nodes carry less than without it.
      if (mesh.size(node_axis) > 1) CHECK(all[0] < both[0]);
    }
  }
}

// `steps` steps of Stage on the world's ranks (nodes x ranks in a node as the world allows),
// returning the losses.
template <class Stage>
std::vector<double> train_run(const node_mesh& mesh, std::int64_t steps) {
  using P = policy<Stage>;
  zero_engine<P> engine(mesh, {.seed = 17});
  gpt<P> model(engine, small_gpt());
  return train_steps<node_tokens>(engine, model, 0, steps);
}

TEST_CASE("qwZ, qgZ and hpZ: a 300-step run's final loss within 2 % of the exact run's") {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const node_mesh mesh(MPI_COMM_WORLD,
                       n == 4 ? std::array<int, 2>{2, 2} : std::array<int, 2>{1, n});
  INFO(mesh.describe());
  constexpr std::int64_t steps = 300;
  const auto exact = train_run<exact_stage>(mesh, steps);
  const auto quantized = train_run<zeropp_stage>(mesh, steps);
  // The last 10 steps' mean (the same batches in both runs).
  const auto tail = [](const std::vector<double>& l) {
    return std::accumulate(l.end() - 10, l.end(), 0.0) / 10.0;
  };
  INFO("exact " << tail(exact) << ", quantized " << tail(quantized) << " (first " << exact.front()
                << ")");
  CHECK(std::abs(tail(quantized) - tail(exact)) <= 0.02 * tail(exact));
  CHECK(tail(exact) < 0.8 * exact.front());  // the runs learned something
  // Not the exact run: the wire did quantize (on more than one rank per axis).
  if (n > 1) CHECK(quantized != exact);
}

}  // namespace zeropp_checks

TEST_SUITE_END();
