// mesh: sizes and row-major coordinates, size inference, errors, and the axis communicators.
// Runs at 1, 2 and 4 ranks on every mesh shape of fixtures.hpp's mesh_shapes().
#include <doctest/doctest.h>
#include <mpi.h>

#include <array>
#include <span>
#include <string>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/mesh/mesh.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using mesh_t = mesh<"dp", "tp">;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The message of the shape_error that constructing a mesh of these sizes throws ("" if none).
template <class Mesh, class Sizes>
std::string construction_error(const Sizes& sizes) {
  try {
    const Mesh m(MPI_COMM_WORLD, sizes);
  } catch (const shape_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("sizes and coordinates are row-major, the first axis major") {
  const int n = world_size();
  const int r = world_rank();
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    CHECK(m.size(0) == shape[0]);
    CHECK(m.size(1) == shape[1]);
    CHECK(m.sizes() == shape);
    CHECK(m.world_size() == n);
    CHECK(m.rank() == r);
    CHECK(m.coord(0) == r / shape[1]);
    CHECK(m.coord(1) == r % shape[1]);
    CHECK(m.coords() == std::array<int, 2>{r / shape[1], r % shape[1]});
  }
  static_assert(mesh_t::axis_count == 2);
  static_assert(mesh_t::axis_names[0] == "dp" && mesh_t::axis_names[1] == "tp");
  static_assert(mesh_t::axis_index<"dp">() == 0 && mesh_t::axis_index<"tp">() == 1);

  // Three axes: at 4 ranks pp=2, dp=1, tp=2 puts rank 3 at (1, 0, 1).
  using mesh3_t = mesh<"pp", "dp", "tp">;
  const std::array<int, 3> shape =
      n == 4 ? std::array<int, 3>{2, 1, 2} : std::array<int, 3>{1, n, 1};
  const mesh3_t m3(MPI_COMM_WORLD, shape);
  CAPTURE(m3.describe());
  const std::array<int, 3> want =
      n == 4 ? std::array<int, 3>{r / 2, 0, r % 2} : std::array<int, 3>{0, r, 0};
  CHECK(m3.coords() == want);
  CHECK(m3.axis<"pp">().size() == shape[0]);
  CHECK(m3.axis<"dp">().size() == shape[1]);
  CHECK(m3.axis<"tp">().size() == shape[2]);
  for (std::size_t a = 0; a < 3; ++a) CHECK(m3.axis(a).rank() == want[a]);
}

TEST_CASE("one size may be -1: it takes the ranks the others leave") {
  const int n = world_size();
  {
    const mesh_t m(MPI_COMM_WORLD, {-1, 1});
    CHECK(m.sizes() == std::array<int, 2>{n, 1});
  }
  {
    const mesh_t m(MPI_COMM_WORLD, {1, -1});
    CHECK(m.sizes() == std::array<int, 2>{1, n});
  }
  if (n % 2 == 0) {
    const mesh_t a(MPI_COMM_WORLD, {2, -1});
    CHECK(a.sizes() == std::array<int, 2>{2, n / 2});
    const mesh_t b(MPI_COMM_WORLD, {-1, 2});
    CHECK(b.sizes() == std::array<int, 2>{n / 2, 2});
    CHECK(b.coord(1) == world_rank() % 2);
  }
  const mesh<"dp", "sp", "tp"> m3(MPI_COMM_WORLD, {1, -1, 1});
  CHECK(m3.sizes() == std::array<int, 3>{1, n, 1});
}

TEST_CASE("sizes that do not fit the world throw shape_error with the fix") {
  const int n = world_size();
  {
    // One rank too many: the message names the shape and the mpiexec -n that would fit.
    const std::string what = construction_error<mesh_t>(std::array<int, 2>{n + 1, 1});
    CAPTURE(what);
    CHECK(what.find("mpiexec -n " + std::to_string(n + 1)) != std::string::npos);
    CHECK(what.find("dp=" + std::to_string(n + 1) + " x tp=1") != std::string::npos);
    CHECK(what.find("has " + std::to_string(n)) != std::string::npos);
  }
  {
    const std::string what = construction_error<mesh_t>(std::array<int, 2>{2, 2 * n});
    CAPTURE(what);
    CHECK(what.find("mpiexec -n " + std::to_string(4 * n)) != std::string::npos);
  }
  {
    // -1 with the others not dividing the world.
    const std::string what = construction_error<mesh_t>(std::array<int, 2>{-1, n + 1});
    CAPTURE(what);
    CHECK(what.find("does not divide") != std::string::npos);
  }
  {
    const std::string what = construction_error<mesh_t>(std::array<int, 2>{0, n});
    CAPTURE(what);
    CHECK(what.find("'dp'") != std::string::npos);
    CHECK(what.find("positive") != std::string::npos);
  }
  {
    // Only one size may be inferred.
    const std::string what = construction_error<mesh_t>(std::array<int, 2>{-1, -1});
    CAPTURE(what);
    CHECK(what.find("'tp'") != std::string::npos);
  }
  CHECK_THROWS_AS(mesh_t(MPI_COMM_WORLD, {n + 1, 1}), shape_error);
  // A failed construction leaves MPI usable: a good mesh still works afterwards.
  const mesh_t m(MPI_COMM_WORLD, {n, 1});
  int one = 1;
  m.world().all_reduce(std::span<int>(&one, 1));
  CHECK(one == n);
}

TEST_CASE("axis communicators connect exactly the ranks that differ along the axis") {
  const int r = world_rank();
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    const int dp = m.coord(0);
    const int tp = m.coord(1);
    const int dp_size = shape[0];
    const int tp_size = shape[1];
    CHECK(m.axis<"dp">().size() == dp_size);
    CHECK(m.axis<"dp">().rank() == dp);
    CHECK(m.axis<"tp">().size() == tp_size);
    CHECK(m.axis<"tp">().rank() == tp);
    CHECK(&m.axis(0) == &m.axis<"dp">());
    CHECK(&m.axis(1) == &m.axis<"tp">());
    CHECK(m.axis<"dp">().name() == "dp");
    CHECK(m.axis<"tp">().name() == "tp");

    // Over tp: the ranks sharing this dp coordinate, dp * tp_size + t for t < tp_size.
    std::int64_t sum = r;
    m.axis<"tp">().all_reduce(std::span<std::int64_t>(&sum, 1));
    CHECK(sum == std::int64_t{dp} * tp_size * tp_size + tp_size * (tp_size - 1) / 2);
    // Over dp: the ranks sharing this tp coordinate, d * tp_size + tp for d < dp_size.
    double dsum = r;
    m.axis<"dp">().all_reduce(std::span<double>(&dsum, 1));
    CHECK(dsum == static_cast<double>(tp_size * dp_size * (dp_size - 1) / 2 + dp_size * tp));

    // Who is in my tp group, gathered in axis-rank order: the ranks of my row.
    std::vector<int> row(static_cast<std::size_t>(tp_size));
    const int me = r;
    m.axis<"tp">().all_gather(std::span<const int>(&me, 1), std::span<int>(row));
    for (int t = 0; t < tp_size; ++t) CHECK(row[static_cast<std::size_t>(t)] == dp * tp_size + t);
    std::vector<int> column(static_cast<std::size_t>(dp_size));
    m.axis<"dp">().all_gather(std::span<const int>(&me, 1), std::span<int>(column));
    for (int d = 0; d < dp_size; ++d)
      CHECK(column[static_cast<std::size_t>(d)] == d * tp_size + tp);
  }
}

TEST_CASE("world() spans every rank; stats() counts the axes only") {
  const int n = world_size();
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CHECK(m.world().size() == n);
    CHECK(m.world().rank() == world_rank());
    CHECK(m.world().name() == "world");
    int r = world_rank();
    m.world().all_reduce(std::span<int>(&r, 1));
    CHECK(r == n * (n - 1) / 2);

    m.reset_stats();
    float x = 1;
    m.axis<"tp">().all_reduce(std::span<float>(&x, 1));
    m.world().all_reduce(std::span<float>(&x, 1));  // not part of the mesh's stats
    CHECK(m.stats()[collective::all_reduce].calls == 1);
    CHECK(m.stats().calls() == 1);
    CHECK(m.world().stats()[collective::all_reduce].calls == 1);
    m.reset_stats();
    CHECK(m.stats().calls() == 0);
    CHECK(m.world().stats().calls() == 0);
  }
}

TEST_CASE("describe() names the axes and their sizes") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CHECK(m.describe() ==
          "mesh<dp=" + std::to_string(shape[0]) + ", tp=" + std::to_string(shape[1]) + ">");
  }
  const mesh<"x"> one(MPI_COMM_WORLD, {-1});
  CHECK(one.describe() == "mesh<x=" + std::to_string(world_size()) + ">");
}

TEST_CASE("a mesh can be moved") {
  mesh_t a(MPI_COMM_WORLD, {-1, 1});
  mesh_t b = std::move(a);
  CHECK(b.size(0) == world_size());
  int one = 1;
  b.axis<"dp">().all_reduce(std::span<int>(&one, 1));
  CHECK(one == world_size());
}

TEST_CASE("local_mesh: one rank, every axis of size 1, next to an MPI world") {
  // local_mesh uses no MPI at all (tests/mesh/local_mesh_test.cpp runs it without MPI_Init);
  // here it lives next to MPI meshes and gives the same answers on every rank.
  const local_mesh<"dp", "tp"> m;
  CHECK(m.sizes() == std::array<int, 2>{1, 1});
  CHECK(m.coords() == std::array<int, 2>{0, 0});
  CHECK(m.rank() == 0);
  CHECK(m.world_size() == 1);
  CHECK(m.describe() == "mesh<dp=1, tp=1>");
  CHECK(m.axis<"tp">().size() == 1);
  CHECK(m.world().size() == 1);
}
