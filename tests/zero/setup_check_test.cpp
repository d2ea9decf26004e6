// zero_engine's start-up check (issue 24): ranks whose engines would issue different
// collectives — another model (a parameter more, another shape), other options, another
// mesh shape — stop before the first collective, every rank with collective_mismatch naming
// the first field that differs and each rank's value of it. Ranks set up alike train.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstddef>
#include <optional>
#include <string>

#include "support/mpi_test.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/zero/engine.hpp"
#include "zest/zero/parameter.hpp"

namespace {
using namespace zest;

using mesh_t = mesh<"dp">;
using policy = training_policy<mesh_t, zero_stage<3>, float>;

// What rank 1 does differently from the others.
enum class slip { none, extra_parameter, other_shape, other_options };

// Builds an engine with two parameters and enters its group: the first collective (stage
// 3's gather) comes after the check. Returns the mismatch's message ("" when none).
std::string enter_with(slip s) {
  const mesh_t mesh(MPI_COMM_WORLD, {-1});
  const bool odd = mesh.rank() == 1;
  zero_options options{.seed = 3};
  if (odd && s == slip::other_options) options.bucket_elements = 1024;
  zero_engine<policy> engine(mesh, options);
  const std::size_t group = engine.begin_group("layer");
  const std::size_t n = 4 * static_cast<std::size_t>(mesh.world_size());
  parameter<policy, "mh"> w(engine, "layer.weight", {n, odd && s == slip::other_shape ? 6U : 5U},
                            init::normal{0.02});
  parameter<policy, "h"> b(engine, "layer.bias", {n}, init::constant{0.0});
  std::optional<parameter<policy, "h">> extra;
  if (odd && s == slip::extra_parameter) {
    extra.emplace(engine, "layer.scale", std::array<std::size_t, 1>{n}, init::constant{1.0});
  }
  engine.end_group();
  try {
    autodiff::tape t;
    auto scope = engine.use(t, group);
    CHECK(w.value().value().extents()[0] == n);  // gathered: the check let it through
  } catch (const collective_mismatch& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("start-up check: ranks set up alike pass it") { CHECK(enter_with(slip::none).empty()); }

TEST_CASE("start-up check: a parameter more on one rank") {
  const std::string what = enter_with(slip::extra_parameter);
  if (zest::testing::world().size < 2) return;
  INFO(what);
  CHECK(what.rfind("zest: zero_engine: the ranks were not started alike: the model's parameters "
                   "differs: ",
                   0) == 0);
  CHECK(what.find("rank 0: no parameter #2 (2 parameters)") != std::string::npos);
  CHECK(what.find("rank 1: parameter #2 is layer.scale [") != std::string::npos);
}

TEST_CASE("start-up check: a parameter of another shape on one rank") {
  const std::string what = enter_with(slip::other_shape);
  if (zest::testing::world().size < 2) return;
  INFO(what);
  CHECK(what.find("the model's parameters differs") != std::string::npos);
  CHECK(what.find("rank 0: parameter #0 is layer.weight [") != std::string::npos);
  CHECK(what.find(", 5] (2 parameters); rank 1: parameter #0 is layer.weight [") !=
        std::string::npos);
  CHECK(what.find(", 6] (2 parameters)") != std::string::npos);
}

TEST_CASE("start-up check: other engine options on one rank") {
  const std::string what = enter_with(slip::other_options);
  if (zest::testing::world().size < 2) return;
  INFO(what);
  CHECK(what.find("the engine's options differs: rank 0: bucket_elements 4194304") !=
        std::string::npos);
  CHECK(what.find("rank 1: bucket_elements 1024") != std::string::npos);
}
