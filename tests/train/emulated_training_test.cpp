// ZeRO training on the emulated backend, the GPU's code paths run on the host: the same GPT,
// engine and optimizer on zest::emulated_mesh<"dp"> (function objects handed to the backend's
// for_each and sum: parameter conversions, pack buffers, AdamW, norms, the loss scaler's
// check) against zest::mesh<"dp"> (the host's loops, the reference):
//   - stages 0-3 in fp32, stage 3 in bfloat16, stage 1 in float16 (loss scaling): the same
//     losses (1e-5 relative) and parameters, the same model-state bytes by the backend's
//     counters, and a step leaves them as they were;
//   - an injected inf under float16 skips the step on the emulated mesh too;
//   - a checkpoint saved on the emulated mesh (its shards staged through host memory) loads
//     on the host mesh, and both then take the same step;
//   - the norm, the inf check, a record's staging and the recomputation check through the
//     backend (train/backend_paths.hpp, which the GPU test runs on a cuda_mesh too).
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "train/backend_paths.hpp"
#include "train/training_fixture.hpp"
#include "zest/mesh/emulated_mesh.hpp"
#include "zest/train/checkpoint.hpp"

TEST_SUITE_BEGIN("train_emulated");
// One namespace per file: the files of this folder share one unity translation unit.
namespace emulated_training_tests {

namespace {
using namespace zest;
using namespace zest::testing;

using emulated = emulated_mesh<"dp">;
static_assert(std::is_same_v<backend_of<emulated>, emulated_backend>);
static_assert(!detail::runs_host_loops<backend_of<emulated>>(),
              "the generic paths, not the host's");

using emulated_grad = tensor<float, emulated, "bm", layout<split<'b', "dp">>>;
using host_grad = tensor<float, world_mesh, "bm", layout<split<'b', "dp">>>;

emulated make_emulated_mesh() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return emulated(MPI_COMM_WORLD, {n});
}

template <class Mesh, int Stage, class Param>
using policy = training_policy<Mesh, zero_stage<Stage>, Param>;

// A trained model's losses, parameters (whole) and model-state bytes.
struct run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  std::int64_t states = 0;
};

template <class P>
run train(const typename P::mesh_type& mesh, std::int64_t steps) {
  using backend = backend_of<typename P::mesh_type>;
  run r;
  const std::int64_t before = backend::counters().live.load();
  zero_engine<P> engine(mesh, {.seed = 11});
  gpt<P> model(engine, small_gpt());
  r.states = backend::counters().live.load() - before;
  r.losses = train_steps(engine, model, 0, steps);
  CHECK(backend::counters().live.load() - before == r.states);  // a step leaves them alone
  r.params = parameter_values(engine);
  return r;
}

// Losses within 1e-5 relative; parameters within 1e-5, plus `ulp` (one unit in the last place
// of the stored precision, relative) for 16-bit values: sums in another order (the gradient
// norm, the autodiff reductions) differ by 1e-7 and may round a 16-bit value the other way.
// For 16-bit values the absolute floor is also 5 % of a step's learning rate: an element whose
// gradient is near zero takes Adam's normalised step (m / sqrt(v), about +-1 whatever the
// gradient's size), so a gradient of 1e-7 rounded in another order moves it by a visible
// part of lr (seen: 2e-5 at 4 ranks, bfloat16, a weight near zero).
void check_same(const run& got, const run& want, double ulp) {
  const double floor = ulp == 0 ? 1e-5 : 0.05 * learning_rate(0);
  CHECK(got.states == want.states);
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t k = 0; k < got.losses.size(); ++k) {
    INFO("step " << k << ": " << got.losses[k] << " vs " << want.losses[k]);
    CHECK(std::abs(got.losses[k] - want.losses[k]) <= 1e-5 * std::abs(want.losses[k]));
  }
  REQUIRE(got.params.size() == want.params.size());
  for (const auto& [name, values] : got.params) {
    const auto& ref = want.params.at(name);
    REQUIRE(values.size() == ref.size());
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double a = values[i], b = ref[i];
      // One unit in the last place of the larger of the two: the values may lie on either
      // side of a power of two, where the spacing halves.
      const double d = std::abs(a - b) - ulp * std::max(std::abs(a), std::abs(b));
      if (d > worst) {
        worst = d;
        at = i;
      }
    }
    INFO("parameter " << name << ": largest difference beyond tolerance " << worst << " at " << at
                      << " (" << values[at] << " vs " << ref[at] << ")");
    CHECK(worst <= floor);
  }
}

template <int Stage, class Param>
void compare(std::int64_t steps, double ulp = 0) {
  const auto host_mesh = make_world_mesh();
  const auto emulated_mesh = make_emulated_mesh();
  const run want = train<policy<world_mesh, Stage, Param>>(host_mesh, steps);
  const run got = train<policy<emulated, Stage, Param>>(emulated_mesh, steps);
  check_same(got, want, ulp);
  CHECK(got.losses.back() < got.losses.front());  // it learns
}

TEST_CASE("emulated backend: ZeRO stages 0-3 train like the host") {
  SUBCASE("stage 0") { compare<0, float>(4); }
  SUBCASE("stage 1") { compare<1, float>(4); }
  SUBCASE("stage 2") { compare<2, float>(4); }
  SUBCASE("stage 3") { compare<3, float>(4); }
}

TEST_CASE("emulated backend: bfloat16 ZeRO-3 and float16 ZeRO-1 train like the host") {
  SUBCASE("bfloat16, stage 3") { compare<3, bfloat16>(4, 0x1.0p-7); }
  SUBCASE("float16, stage 1") { compare<1, float16>(4, 0x1.0p-10); }
}

TEST_CASE("emulated backend: an inf under float16 skips the step on every rank") {
  using P = policy<emulated, 1, float16>;
  const auto mesh = make_emulated_mesh();
  zero_engine<P> engine(mesh, {.seed = 4});
  gpt<P> model(engine, small_gpt());
  (void)train_steps(engine, model, 0, 1);
  const auto params = parameter_values(engine);
  const float scale = engine.loss_scaler().scale();

  auto s = sampler();
  const auto [in, tg] = s.batch<"dp">(mesh, 1);
  {
    autodiff::tape t;
    auto loss = model.loss(t, in, tg, 1);
    engine.backward(loss);
  }
  // An inf in one gradient element on the last rank (stage 1 reduces at the step: poison
  // the full-size buffer, whose reduce-scatter spreads it to the owner).
  if (mesh.world().rank() == mesh.world_size() - 1) {
    auto* p = engine.parameters().front();
    const auto buf = p->gradient_buffer();
    const float16 inf(std::numeric_limits<float>::infinity());
    emulated_backend::fill(buf.data(), 1, inf);
  }
  const auto r = engine.step(1e-3);
  CHECK_FALSE(r.applied);
  CHECK(engine.loss_scaler().scale() == scale / 2);
  CHECK(parameter_values(engine) == params);
  const auto next = train_steps(engine, model, 2, 1);
  CHECK(std::isfinite(next.front()));
}

TEST_CASE("emulated backend: the norm, the inf check, records and recomputation's check") {
  check_backend_paths<emulated_grad, host_grad>(make_emulated_mesh());
}

TEST_CASE("emulated backend: a checkpoint saved on the emulated mesh loads on the host") {
  using saving = policy<emulated, 3, bfloat16>;
  using loading = policy<world_mesh, 2, bfloat16>;
  const auto dir = shared_temp_dir("checkpoint");
  const auto emulated_mesh = make_emulated_mesh();
  const auto host_mesh = make_world_mesh();

  zero_engine<saving> source(emulated_mesh, {.seed = 21});
  gpt<saving> source_model(source, small_gpt());
  (void)train_steps(source, source_model, 0, 3);
  save_training_state(dir / "ckpt", source, 3);

  zero_engine<loading> target(host_mesh, {.seed = 99});
  gpt<loading> target_model(target, small_gpt());
  CHECK(load_training_state(dir / "ckpt", target).step == 3);
  CHECK(target.steps_taken() == source.steps_taken());
  CHECK(parameter_values(target) == parameter_values(source));

  // And back: the host's state loads into a fresh emulated engine (written back to its shards).
  zero_engine<saving> again(emulated_mesh, {.seed = 5});
  gpt<saving> again_model(again, small_gpt());
  save_training_state(dir / "ckpt2", target, 3);
  (void)load_training_state(dir / "ckpt2", again);
  CHECK(parameter_values(again) == parameter_values(source));

  // The masters and moments came along: the next steps agree.
  const auto a = train_steps(source, source_model, 3, 2);
  const auto b = train_steps(target, target_model, 3, 2);
  const auto c = train_steps(again, again_model, 3, 2);
  for (std::size_t k = 0; k < a.size(); ++k) {
    CHECK(std::abs(a[k] - b[k]) <= 1e-5 * std::abs(a[k]));
    CHECK(a[k] == c[k]);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (host_mesh.world().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

}  // namespace emulated_training_tests

TEST_SUITE_END();
