// Expert-parallel training of the MoE GPT (every other block a GShard top-2 layer with
// random routing, experts split over "ep", ZeRO over "dp"): on every dp x ep mesh of the
// job (1x2, 2x1, 2x2, ...) 10 steps give the same losses as one rank (fp32, relative
// 1e-5); and a checkpoint saved on one expert-axis size loads onto another with every
// expert weight bit for bit. The same equality for dropless top-3 experts balanced by the
// routing bias, the biases equal exactly.
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <vector>

#include "support/fixtures.hpp"
#include "train/training_fixture.hpp"
#include "zest/train/checkpoint.hpp"

TEST_SUITE_BEGIN("train_moe");
// One namespace per file: the files of this folder share one unity translation unit.
namespace moe_training_tests {

namespace {
using namespace zest;
using namespace zest::testing;

using ep_mesh = zest::mesh<"dp", "ep">;
template <class Mesh, int Stage>
using moe_policy = training_policy<Mesh, zero_stage<Stage>, float>;
using token_layout = layout<split<'b', "dp", "ep">>;

gpt_options moe_gpt() {
  gpt_options o = small_gpt();
  o.moe = true;
  o.experts = 4;
  o.gating.top_k = 2;
  o.gating.capacity_factor = 1.0;  // some tokens overflow: the drop path is exercised
  o.gating.random_routing = true;
  o.aux_weight = 0.01;
  o.z_loss_weight = 0.001;
  return o;
}

template <class P, class Model>
std::vector<double> train_moe(zero_engine<P>& engine, const Model& model, std::int64_t first,
                              std::int64_t steps) {
  return train_steps<token_layout>(engine, model, first, steps);
}

std::vector<ep_mesh> ep_meshes() {
  std::vector<ep_mesh> out;
  for (const auto& shape : mesh_shapes()) out.emplace_back(MPI_COMM_WORLD, shape);
  return out;
}

TEST_CASE("expert-parallel training equals one rank (ZeRO-1 and ZeRO-3 over dp)") {
  // The reference: one rank, ZeRO-1 (the policy of the first N-rank run, so it is compiled once).
  const auto one = make_single_mesh<ep_mesh>();
  zero_engine<moe_policy<ep_mesh, 1>> ref_engine(one, {.seed = 4});
  gpt<moe_policy<ep_mesh, 1>> ref_model(ref_engine, moe_gpt());
  const auto reference = train_moe(ref_engine, ref_model, 0, 10);
  CHECK(ref_model.moe_layer_count() == 1);
  const auto report = ref_model.last_moe_report();
  CHECK(report.aux_loss > 0.9);
  CHECK(report.dropped_fraction > 0);

  for (const auto& mesh : ep_meshes()) {
    INFO(mesh.describe());
    auto check = [&](auto engine_tag) {
      using P = typename decltype(engine_tag)::type;
      zero_engine<P> engine(mesh, {.seed = 4});
      gpt<P> model(engine, moe_gpt());
      const auto losses = train_moe(engine, model, 0, 10);
      for (std::size_t k = 0; k < losses.size(); ++k) {
        INFO("step " << k << ": " << losses[k] << " vs " << reference[k]);
        CHECK(std::abs(losses[k] - reference[k]) <= 1e-5 * std::abs(reference[k]));
      }
      const auto r = model.last_moe_report();
      CHECK(r.tokens_per_expert == ref_model.last_moe_report().tokens_per_expert);
    };
    check(std::type_identity<moe_policy<ep_mesh, 1>>{});
    check(std::type_identity<moe_policy<ep_mesh, 3>>{});
  }
}

// zest::gpt_shape with experts: on the world as ep, the names the model registers, and the
// elements of each block rank 0 holds (its experts, every other parameter whole).
TEST_CASE("gpt_shape lists the expert blocks a rank of ep holds") {
  gpt_options o = moe_gpt();
  o.layers = 3;   // blocks 0 and 2 dense, block 1 experts
  o.experts = 8;  // 8, 4 or 2 per rank of ep
  const ep_mesh mesh(MPI_COMM_WORLD, {1, -1});
  using P = moe_policy<ep_mesh, 3>;
  zero_engine<P> engine(mesh, {.seed = 1});
  const gpt<P> model(engine, o);
  const model_shape listed = gpt_shape(o, 1, static_cast<std::size_t>(mesh.size(1)));
  const auto& held = engine.parameters();
  REQUIRE(held.size() == listed.parameters.size());
  std::size_t experts = 0;
  for (std::size_t i = 0; i < held.size(); ++i) {
    CAPTURE(held[i]->name());
    CHECK(listed.parameters[i].name == held[i]->name());
    CHECK(held[i]->stored_elements() == listed.parameters[i].elements());  // dp = 1
    if (held[i]->name().find(".experts.") != std::string::npos) ++experts;
  }
  CHECK(experts == 4);
  CHECK(model.moe_layer_count() == 1);
}

TEST_CASE("expert weights round-trip exactly when the expert axis changes size") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long id = static_cast<long>(::getpid());
  MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const auto dir = std::filesystem::temp_directory_path() / ("zest-moe-ckpt-" + std::to_string(id));
  const auto meshes = ep_meshes();
  const ep_mesh& saving = meshes.back();    // the most expert-parallel shape
  const ep_mesh& loading = meshes.front();  // the least
  using P = moe_policy<ep_mesh, 3>;
  std::map<std::string, std::vector<float>> saved;
  {
    zero_engine<P> engine(saving, {.seed = 8});
    gpt<P> model(engine, moe_gpt());
    (void)train_moe(engine, model, 0, 3);
    saved = parameter_values(engine);
    save_training_state(dir, engine, 3);
  }
  zero_engine<P> engine(loading, {.seed = 9});
  gpt<P> model(engine, moe_gpt());
  load_training_state(dir, engine);
  const auto loaded = parameter_values(engine);
  REQUIRE(loaded.size() == saved.size());
  std::size_t experts_checked = 0;
  for (const auto& [name, values] : saved) {
    INFO(name);
    const auto& got = loaded.at(name);
    REQUIRE(got.size() == values.size());
    CHECK(std::memcmp(got.data(), values.data(), values.size() * sizeof(float)) == 0);
    if (name.find(".experts.") != std::string::npos) ++experts_checked;
  }
  CHECK(experts_checked == 4);  // fc and proj weights and biases of the one MoE block
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace

// Dropless experts, top-3, balanced by the routing bias (updated after each step): on every
// dp x ep mesh 10 steps of ZeRO-3 give the losses of one rank, the same biases (exactly) and
// loads, and nothing dropped.
TEST_CASE("dropless top-3 training balanced by the routing bias equals one rank (ZeRO-3)") {
  using P = moe_policy<ep_mesh, 3>;
  gpt_options o = moe_gpt();
  o.gating.dropless = true;
  o.gating.top_k = 3;
  o.gating.bias_update_rate = 0.01;
  o.aux_weight = 0;
  const auto run = [&o](const ep_mesh& mesh) {
    zero_engine<P> engine(mesh, {.seed = 4});
    gpt<P> model(engine, o);
    auto s = sampler();
    std::vector<double> losses;
    for (std::int64_t k = 0; k < 10; ++k) {
      const auto [in, tg] = s.template batch<token_layout>(mesh, static_cast<std::size_t>(k));
      losses.push_back(
          train_step(engine, model, in, tg, learning_rate(k), static_cast<std::uint64_t>(k)).loss);
      model.update_routing_bias();
    }
    return std::tuple{losses, model.routing_biases(), model.last_moe_report()};
  };
  const auto one = make_single_mesh<ep_mesh>();
  const auto ref = run(one);
  const auto& reference = std::get<0>(ref);
  const auto& ref_bias = std::get<1>(ref);
  const auto& ref_report = std::get<2>(ref);
  REQUIRE(ref_bias.size() == 1);
  CHECK(ref_report.dropped_fraction == 0);
  CHECK(ref_report.dropped_per_expert == std::vector<std::int64_t>(4, 0));
  bool moved = false;
  for (double b : ref_bias[0]) moved = moved || b != 0;
  CHECK(moved);
  for (const auto& mesh : ep_meshes()) {
    INFO(mesh.describe());
    const auto got = run(mesh);
    const auto& losses = std::get<0>(got);
    for (std::size_t k = 0; k < losses.size(); ++k) {
      INFO("step " << k << ": " << losses[k] << " vs " << reference[k]);
      CHECK(std::abs(losses[k] - reference[k]) <= 1e-5 * std::abs(reference[k]));
    }
    CHECK(std::get<1>(got) == ref_bias);
    CHECK(std::get<2>(got).load_per_expert == ref_report.load_per_expert);
  }
}

}  // namespace moe_training_tests

TEST_SUITE_END();
