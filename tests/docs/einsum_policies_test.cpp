// docs/einsum-policies.md's worked examples, on 2 ranks: the plans and bytes it quotes from
// explain, and the result layouts it states (static_assert with zest::layout_is).
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <type_traits>

#include "support/fixtures.hpp"
#include "zest/einsum/einsum.hpp"
#include "zest/einsum/policy.hpp"
#include "zest/layout/layout_of.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/linear.hpp"
#include "zest/nn/tensor_parallel.hpp"
#include "zest/plan/explain.hpp"
#include "zest/tensor/tensor.hpp"
#include "zest/zero/engine.hpp"

namespace {
using namespace zest;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("einsum-policies.md: a ZeRO-3 weight, gathered or kept") {
  REQUIRE(zest::testing::world_size() == 2);  // the document's figures are for 2 ranks
  const mesh<"dp"> m(MPI_COMM_WORLD, {2});
  using x_t = tensor<float, mesh<"dp">, "bsm", layout<split<'b', "dp">>>;
  using w_t = tensor<float, mesh<"dp">, "mh", layout<split<'m', "dp">>>;
  const x_t x(m, {8, 128, 512});
  const w_t w(m, {512, 2048});

  const std::string gather = explain<"bsm,mh->bsh">(x, w).str();
  CAPTURE(gather);
  CHECK(has(gather, "policy gather_weights"));
  CHECK(has(gather, "operand 1 \"mh\" [512x2048] split(m:dp) -> replicate"));
  CHECK(has(gather, "all_gather over dp (dim m)                  2.00 MiB sent by this rank"));
  CHECK(has(gather, "result \"bsh\" split(b:dp)"));
  using y_t = decltype(einsum<"bsm,mh->bsh">(x, w));
  static_assert(layout_is<y_t, layout<split<'b', "dp">>>);

  const std::string keep = explain<"bsm,mh->bsh", keep_weights>(x, w).str();
  CAPTURE(keep);
  CHECK(has(keep, "policy keep_weights"));
  CHECK(has(keep, "operand 0 \"bsm\" [8x128x512] split(b:dp) -> split(m:dp)"));
  CHECK(has(keep, "all_to_all over dp (dim b -> m)             512.00 KiB sent by this rank"));
  CHECK(has(keep, "result \"bsh\" partial(dp)"));
  using z_t = decltype(einsum<"bsm,mh->bsh", keep_weights>(x, w));
  static_assert(layout_is<z_t, layout<partial<"dp">>>);
  // Its pending sum, reduced to split(b:dp): a reduce-scatter of the 8x128x2048 floats, 4 MiB.
  const z_t z(m, {8, 128, 2048});
  CHECK(has(explain<layout<split<'b', "dp">>>(z).str(), "4.00 MiB sent by this rank"));
}

TEST_CASE("einsum-policies.md: sequence-parallel activations and a row-parallel weight") {
  REQUIRE(zest::testing::world_size() == 2);
  const mesh<"tp"> m(MPI_COMM_WORLD, {2});
  using a_t = tensor<float, mesh<"tp">, "bsh", layout<split<'s', "tp">>>;
  using v_t = tensor<float, mesh<"tp">, "hm", layout<split<'h', "tp">>>;
  const a_t a(m, {8, 128, 2048});
  const v_t v(m, {2048, 512});
  CHECK(has(explain<"bsh,hm->bsm">(a, v).str(), "all_gather over tp (dim h)"));
  const std::string keep = explain<"bsh,hm->bsm", keep_weights>(a, v).str();
  CAPTURE(keep);
  CHECK(has(keep, "all_to_all over tp (dim s -> h)"));
  static_assert(
      layout_is<decltype(einsum<"bsh,hm->bsm", keep_weights>(a, v)), layout<partial<"tp">>>);

  // The Megatron MLP's second matmul: local, guarded by no_communication<>.
  using h_t = tensor<float, mesh<"tp">, "bsh", layout<split<'h', "tp">>>;
  const h_t h(m, {8, 128, 2048});
  const std::string local = explain<"bsh,hm->bsm", no_communication<>>(h, v).str();
  CAPTURE(local);
  CHECK(has(local, "total 0 B sent by this rank in 0 collectives"));
  static_assert(
      layout_is<decltype(einsum<"bsh,hm->bsm", no_communication<>>(h, v)), layout<partial<"tp">>>);
}

TEST_CASE("einsum-policies.md: a guarded layer, fed a sequence-parallel stream") {
  REQUIRE(zest::testing::world_size() == 2);
  using grid = mesh<"dp", "tp">;
  using policy = training_policy<grid, zero_stage<0>, float>;
  using on_tp = layout<split<'h', "tp">>;
  const grid m(MPI_COMM_WORLD, {1, 2});
  zero_engine<policy> engine(m, {.seed = 1});
  const std::size_t group = engine.begin_group("fc");  // the weight and bias together
  const linear<policy, "btm,mh->bth", "mh", "h", on_tp, on_tp, no_communication<>> fc(
      engine, "fc", {64, 256}, {256});
  engine.end_group();
  autodiff::tape t;
  const auto in_scope = engine.use(t, group);
  using stream_t = tensor<float, grid, "btm", layout<split<'t', "tp">>>;
  const auto x =
      t.constant(stream_t::generate(m, {2, 8, 64}, [](const auto& i) { return float(i[2]); }));
  const comm_stats before = m.axis(1).stats();
  const auto whole = whole_on_tp<policy>(x);
  const comm_stats gathered = m.axis(1).stats() - before;
  const auto y = fc(whole);
  const comm_stats all = m.axis(1).stats() - before;
  CHECK(gathered.calls() == 1);            // the stream's all-gather over tp
  CHECK(all.calls() == gathered.calls());  // the guarded product: none
  static_assert(layout_is<std::remove_cvref_t<decltype(y.value())>, on_tp>);
  CHECK(y.value().extents() == std::array<std::size_t, 3>{2, 8, 256});
}

}  // namespace
