// The data axes as a set: hybrid sharding (HSDP: ZeRO within "dp", DDP across "dp_rep") and
// ZeRO over two axes at once, on mesh<"dp_rep", "dp"> with the batch split over both. Every
// shape of the job's ranks over the two axes (1 x N, N x 1, 2 x 2):
//   - N ranks train like one rank (losses and parameters), stages 0-3;
//   - the bytes each axis's communicator counts in a step equal hsdp_formula's (the shard
//     axis: ZeRO's 2 or 3 Psi (n-1)/n; the replica axis: 2 Psi/n (r-1)/r, the all-reduce of
//     each rank's reduced shard) and the planner's figure for that axis;
//   - the model states per rank equal the formula for the shard axis alone;
//   - a checkpoint reshards between HSDP, plain ZeRO on the world and other rank counts.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "train/training_fixture.hpp"
#include "zest/train/checkpoint.hpp"
#include "zest/zero/planner.hpp"

TEST_SUITE_BEGIN("train_hsdp");

// A named namespace: the unity build puts the train suites in one translation unit.
namespace hsdp_checks {
using namespace zest;
using namespace zest::testing;

using hsdp_mesh = zest::mesh<"dp_rep", "dp">;
using hsdp_tokens = layout<split<'b', "dp_rep", "dp">>;
constexpr std::size_t rep_axis = 0, shard_axis = 1;

template <int K>
using hsdp_stage = typename zero_stage<K, "dp">::template replicated_over<"dp_rep">;
template <int K>
using hsdp_policy = training_policy<hsdp_mesh, hsdp_stage<K>, float>;
// ZeRO over both axes at once: one split of the states, dp_rep major.
template <int K>
using both_policy = training_policy<hsdp_mesh, zero_stage<K, "dp_rep,dp">, float>;

static_assert(hsdp_policy<3>::data_mask == 0b11 && hsdp_policy<3>::shard_mask == 0b10 &&
              hsdp_policy<3>::replica_mask == 0b01);
static_assert(both_policy<3>::shard_mask == 0b11 && both_policy<3>::replica_mask == 0);
static_assert(std::is_same_v<hsdp_stage<3>::stored_layout<"mh">, layout<split<'m', "dp">>>);
static_assert(
    std::is_same_v<hsdp_stage<2>::gradient_layout<"mh">, layout<partial<"dp">, partial<"dp_rep">>>);
static_assert(std::is_same_v<zero_stage<3, "dp_rep,dp">::stored_layout<"mh">,
                             layout<split<'m', "dp_rep", "dp">>>);

// ZeRO++'s hpZ: ZeRO-3 over both axes (dp_rep the nodes, dp the ranks inside one), and a
// secondary copy split over dp alone for backward.
using hpz_stage = zero_stage<3, "dp_rep,dp">::with_secondary_over<"dp">;
using hpz_policy = training_policy<hsdp_mesh, hpz_stage, float>;
static_assert(std::is_same_v<hpz_stage::secondary_layout<"mh">, layout<split<'m', "dp">>>);
static_assert(hpz_stage::layouts<hsdp_mesh, "mh">.secondary ==
              layout_value_of<hsdp_mesh, "mh", layout<split<'m', "dp">>>);

// The shapes of the job's ranks over the two axes: testing::mesh_shapes() (1 x N, N x 1, 2 x 2).

// `options` for the N-rank runs (recomputation, prefetch and live groups change nothing in
// the numbers); the reference keeps the defaults.
template <class P>
void trains_like_one_rank(zero_options options = {}) {
  options.seed = 13;
  const auto one = make_single_mesh<hsdp_mesh>();
  zero_engine<P> ref_engine(one, {.seed = 13});
  gpt<P> ref_model(ref_engine, small_gpt());
  const auto ref_losses = train_steps<hsdp_tokens>(ref_engine, ref_model, 0, 8);
  const auto ref_params = parameter_values(ref_engine);
  for (const auto& shape : mesh_shapes()) {
    const hsdp_mesh mesh(MPI_COMM_WORLD, shape);
    INFO(mesh.describe());
    zero_engine<P> engine(mesh, options);
    gpt<P> model(engine, small_gpt());
    check_same_losses(train_steps<hsdp_tokens>(engine, model, 0, 8), ref_losses);
    check_same_parameters(parameter_values(engine), ref_params);
  }
}

// Bytes per axis and model states against the formulas and the planner.
template <int K>
void bytes_and_states_equal_formula() {
  using P = hsdp_policy<K>;
  for (const auto& shape : mesh_shapes()) {
    const hsdp_mesh mesh(MPI_COMM_WORLD, shape);
    INFO(mesh.describe() << ", stage " << K);
    const std::int64_t before = memory::live_bytes();
    zero_engine<P> engine(mesh, {.seed = 3});
    gpt<P> model(engine, small_gpt());
    const std::int64_t states = memory::live_bytes() - before;

    const auto psi = static_cast<double>(engine.parameter_count());
    const double n = mesh.size(shard_axis), r = mesh.size(rep_axis);
    const hsdp_formula_values f = hsdp_formula(K, psi, n, r, fp32_adam);
    CHECK(static_cast<double>(states) == doctest::Approx(f.memory_bytes).epsilon(0.05));
    const auto plan = plan_zero<hsdp_stage<K>>(model.shape(), mesh, fp32_adam);
    CHECK(static_cast<std::uint64_t>(states) == plan.memory.total());
    CHECK(plan.data_parallel_size == static_cast<std::uint64_t>(n));
    CHECK(plan.replica_size == static_cast<std::uint64_t>(r));

    auto s = sampler();
    const auto [in, tg] = s.batch<hsdp_tokens>(mesh, 0);
    const comm_stats shard_before = mesh.axis(shard_axis).stats();
    const comm_stats rep_before = mesh.axis(rep_axis).stats();
    (void)train_step(engine, model, in, tg, 1e-3);
    const std::uint64_t shard_bytes = (mesh.axis(shard_axis).stats() - shard_before).bytes_sent();
    const std::uint64_t rep_bytes = (mesh.axis(rep_axis).stats() - rep_before).bytes_sent();
    CHECK(static_cast<double>(shard_bytes) == f.elements_sent_shard * sizeof(float));
    CHECK(static_cast<double>(rep_bytes) == f.elements_sent_replica * sizeof(float));
    CHECK(shard_bytes == plan.bytes_on(shard_axis));
    CHECK(rep_bytes == plan.bytes_on(rep_axis));
  }
}

// ZeRO over both axes moves ZeRO's bytes for the whole world, split between the axes as the
// planner says.
template <int K>
void two_axis_bytes_equal_formula() {
  using P = both_policy<K>;
  for (const auto& shape : mesh_shapes()) {
    const hsdp_mesh mesh(MPI_COMM_WORLD, shape);
    INFO(mesh.describe() << ", stage " << K);
    zero_engine<P> engine(mesh, {.seed = 3});
    gpt<P> model(engine, small_gpt());
    auto s = sampler();
    const auto [in, tg] = s.batch<hsdp_tokens>(mesh, 0);
    const auto r = train_step(engine, model, in, tg, 1e-3);
    const auto psi = static_cast<double>(engine.parameter_count());
    CHECK(static_cast<double>(r.traffic.bytes_sent()) ==
          zero_formula(K, psi, mesh.world_size(), fp32_adam).elements_sent * sizeof(float));
    const auto plan = plan_zero<zero_stage<K, "dp_rep,dp">>(model.shape(), mesh, fp32_adam);
    CHECK(plan.data_parallel_size == static_cast<std::uint64_t>(mesh.world_size()));
    CHECK(r.traffic.bytes_sent() == plan.bytes_sent());
  }
}

TEST_CASE("HSDP: N ranks train like one rank, stages 0-3") {
  trains_like_one_rank<hsdp_policy<0>>();
  trains_like_one_rank<hsdp_policy<1>>();
  trains_like_one_rank<hsdp_policy<2>>();
  trains_like_one_rank<hsdp_policy<3>>();
}

TEST_CASE("ZeRO over two axes at once: N ranks train like one rank, stages 1 and 3") {
  trains_like_one_rank<both_policy<1>>();
  trains_like_one_rank<both_policy<3>>();
}

TEST_CASE("HSDP: bytes per axis and model states equal the formula and the planner") {
  bytes_and_states_equal_formula<0>();
  bytes_and_states_equal_formula<1>();
  bytes_and_states_equal_formula<2>();
  bytes_and_states_equal_formula<3>();
}

TEST_CASE("ZeRO over two axes at once: bytes equal ZeRO's formula for the whole world") {
  two_axis_bytes_equal_formula<1>();
  two_axis_bytes_equal_formula<3>();
}

// One step of P by hand: the per-axis all-gather bytes of backward alone, and the whole
// step's bytes per axis.
struct step_bytes {
  std::uint64_t backward_gather_rep = 0, backward_gather_shard = 0;
  std::uint64_t rep = 0, shard = 0;
};
template <class P>
step_bytes one_step(const hsdp_mesh& mesh) {
  zero_engine<P> engine(mesh, {.seed = 3});
  gpt<P> model(engine, small_gpt());
  auto s = sampler();
  const auto [in, tg] = s.batch<hsdp_tokens>(mesh, 0);
  const comm_stats rep0 = mesh.axis(rep_axis).stats(), shard0 = mesh.axis(shard_axis).stats();
  step_bytes b;
  {
    autodiff::tape t;
    auto loss = model.loss(t, in, tg, 0);
    const comm_stats rep1 = mesh.axis(rep_axis).stats();
    const comm_stats shard1 = mesh.axis(shard_axis).stats();
    engine.backward(loss);
    b.backward_gather_rep = (mesh.axis(rep_axis).stats() - rep1)[collective::all_gather].bytes_sent;
    b.backward_gather_shard =
        (mesh.axis(shard_axis).stats() - shard1)[collective::all_gather].bytes_sent;
  }
  (void)engine.step(1e-3);
  b.rep = (mesh.axis(rep_axis).stats() - rep0).bytes_sent();
  b.shard = (mesh.axis(shard_axis).stats() - shard0).bytes_sent();
  const auto plan = plan_zero<typename P::stage>(model.shape(), mesh, fp32_adam);
  CHECK(b.rep == plan.bytes_on(rep_axis));
  CHECK(b.shard == plan.bytes_on(shard_axis));
  return b;
}

TEST_CASE("ZeRO++ hpZ: N ranks train like one rank, and backward gathers inside a node only") {
  trains_like_one_rank<hpz_policy>();
  // The secondary copies under full recomputation, one live group, no prefetch.
  trains_like_one_rank<hpz_policy>(
      {.max_live_groups = 1, .prefetch = false, .recompute = recomputation::full});
  for (const auto& shape : mesh_shapes()) {
    const hsdp_mesh mesh(MPI_COMM_WORLD, shape);
    INFO(mesh.describe());
    const step_bytes hpz = one_step<hpz_policy>(mesh);
    const step_bytes flat = one_step<both_policy<3>>(mesh);
    // Backward's all-gather: the secondary copy (Psi / n_dp each) over dp alone.
    int psi = 0;
    {
      zero_engine<hpz_policy> engine(mesh, {.seed = 3});
      gpt<hpz_policy> model(engine, small_gpt());
      psi = static_cast<int>(engine.parameter_count());
    }
    const int n_dp = mesh.size(shard_axis), n_rep = mesh.size(rep_axis);
    CHECK(hpz.backward_gather_rep == 0);
    CHECK(hpz.backward_gather_shard ==
          static_cast<std::uint64_t>(psi / n_dp * (n_dp - 1)) * sizeof(float));
    // Without hpZ, backward gathers across the nodes as forward does.
    if (n_rep > 1) CHECK(flat.backward_gather_rep > 0);
    CHECK(hpz.rep == flat.rep - flat.backward_gather_rep);
  }
}

TEST_CASE("a checkpoint reshards between HSDP, ZeRO over the world and other rank counts") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto dir = shared_temp_dir("hsdp-reshard");
  const auto one = make_single_mesh();
  zero_engine<training_policy<world_mesh, zero_stage<3>, float>> ref_engine(one, {.seed = 31});
  gpt<training_policy<world_mesh, zero_stage<3>, float>> ref_model(ref_engine, small_gpt());
  const auto reference = train_steps(ref_engine, ref_model, 0, 12);
  const std::vector<double> middle(reference.begin() + 4, reference.begin() + 8);
  const std::vector<double> last(reference.begin() + 8, reference.end());

  // HSDP-3 over (dp_rep, dp) = (2, N/2) on an even world, (1, 1) on one rank: 4 steps, save.
  const std::array<int, 2> hsdp_shape{world > 1 ? 2 : 1, world > 1 ? world / 2 : 1};
  {
    const hsdp_mesh mesh(MPI_COMM_WORLD, hsdp_shape);
    zero_engine<hsdp_policy<3>> engine(mesh, {.seed = 31});
    gpt<hsdp_policy<3>> model(engine, small_gpt());
    check_same_losses(train_steps<hsdp_tokens>(engine, model, 0, 4),
                      std::vector<double>(reference.begin(), reference.begin() + 4));
    save_training_state(dir / "hsdp", engine, 4);
  }
  // Plain ZeRO-1 over the world's "dp" resumes it, 4 steps, and saves.
  {
    const auto mesh = make_world_mesh();
    zero_engine<training_policy<world_mesh, zero_stage<1>, float>> engine(mesh, {.seed = 99});
    gpt<training_policy<world_mesh, zero_stage<1>, float>> model(engine, small_gpt());
    CHECK(load_training_state(dir / "hsdp", engine).step == 4);
    check_same_losses(train_steps(engine, model, 4, 4), middle);
    save_training_state(dir / "plain", engine, 8);
  }
  // HSDP-2 over (dp_rep, dp) = (N, 1) resumes that, and so does one rank under ZeRO-3.
  {
    const hsdp_mesh mesh(MPI_COMM_WORLD, {world, 1});
    zero_engine<hsdp_policy<2>> engine(mesh, {.seed = 98});
    gpt<hsdp_policy<2>> model(engine, small_gpt());
    CHECK(load_training_state(dir / "plain", engine).step == 8);
    check_same_losses(train_steps<hsdp_tokens>(engine, model, 8, 4), last);
  }
  {
    zero_engine<training_policy<world_mesh, zero_stage<3>, float>> engine(one, {.seed = 97});
    gpt<training_policy<world_mesh, zero_stage<3>, float>> model(engine, small_gpt());
    CHECK(load_training_state(dir / "plain", engine).step == 8);
    check_same_losses(train_steps(engine, model, 8, 4), last);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace hsdp_checks

TEST_SUITE_END();
