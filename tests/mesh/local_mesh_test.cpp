// local_mesh: a mesh of one process that needs no MPI. This test's main() (doctest's own)
// never calls MPI_Init, so any MPI call behind local_mesh would abort it.
#include <doctest/doctest.h>

#include <array>
#include <span>
#include <string>
#include <vector>

#include "zest/mesh/mesh.hpp"
#include "zest/tensor/tensor.hpp"

namespace {
using namespace zest;
using mesh_t = local_mesh<"dp", "tp">;
static_assert(std::is_same_v<mesh_t::communicator_type, local_communicator>);
static_assert(mesh_t::axis_count == 2);
static_assert(mesh_t::axis_index<"tp">() == 1);
}  // namespace

TEST_CASE("a local mesh has one rank and axes of size 1") {
  const mesh_t m;
  CHECK(m.sizes() == std::array<int, 2>{1, 1});
  CHECK(m.coords() == std::array<int, 2>{0, 0});
  CHECK(m.size(0) == 1);
  CHECK(m.coord(1) == 0);
  CHECK(m.rank() == 0);
  CHECK(m.world_size() == 1);
  CHECK(m.describe() == "mesh<dp=1, tp=1>");
  CHECK(local_mesh<"pp", "dp", "tp">().describe() == "mesh<pp=1, dp=1, tp=1>");
}

TEST_CASE("a local mesh's communicators are one-rank copies") {
  const mesh_t m;
  CHECK(m.axis<"dp">().size() == 1);
  CHECK(m.axis<"dp">().rank() == 0);
  CHECK(m.axis<"dp">().name() == "dp");
  CHECK(m.axis(1).name() == "tp");
  CHECK(m.world().name() == "world");
  CHECK(m.world().size() == 1);

  std::vector<float> v{1, 2, 3};
  m.axis<"tp">().all_reduce(std::span<float>(v));
  CHECK(v == std::vector<float>{1, 2, 3});
  std::vector<float> out(3);
  m.axis<"dp">().all_gather(std::span<const float>(v), std::span<float>(out));
  CHECK(out == v);
  CHECK(m.stats()[collective::all_reduce].calls == 1);
  CHECK(m.stats()[collective::all_gather].calls == 1);
  m.reset_stats();
  CHECK(m.stats().calls() == 0);
}

TEST_CASE("tensors on a local mesh hold the whole tensor, whatever the layout") {
  const mesh_t m;
  using x_t = tensor<float, mesh_t, "ab", layout<split<'a', "dp">, partial<"tp">>>;
  const auto x =
      x_t::generate(m, {3, 4}, [](const auto& i) { return static_cast<float>(i[0] * 4 + i[1]); });
  CHECK(x.local_count() == 12);
  CHECK(x.local_offsets() == std::array<std::size_t, 2>{0, 0});
  CHECK(x.holds_partial_summand());
  for (std::size_t k = 0; k < 12; ++k) CHECK(x.local()[k] == static_cast<float>(k));
}
