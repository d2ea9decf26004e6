// The maths of the tensor-parallel MLP of tp_mlp.hpp, written with its parameters as inputs
// (no engine), against central differences with zest::testing::check_gradients, on every
// dp x tp mesh of the world, in double:
//
//   x "btm" split(b:dp) -> W1 "mh", b1 "h" split(h:tp) -> GELU -> W2 "hm" split(h:tp)
//   -> "btm" partial(tp) -> all-reduce over tp -> + b2 "m" (replicated)
//
// and under ZeRO-3 storage (W1 split(m:dp) as well as h over tp: gathered on use, its gradient
// reduce-scattered back). Every gradient is checked: the input's, both weights' (split over
// tp, their gradients split too) and both biases' (b2 replicated: its gradient was pending
// over dp and tp). Extents are uneven (5 rows over 2 and 4 ranks).
#include <doctest/doctest.h>

#include <cstdint>

#include "support/fixtures.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/testing/check_gradients.hpp"

TEST_SUITE_BEGIN("nn_tp_mlp_gradients");
// One namespace per file: the files of this folder share one unity translation unit.
namespace tp_mlp_gradients_tests {

namespace {
using namespace zest;
namespace ad = zest::autodiff;

using grid = mesh<"dp", "tp">;

template <class X>
X filled(const grid& m, const typename X::extents_type& e, std::uint32_t salt) {
  return X::generate(m, e, [&](const auto& i) { return zest::testing::value_at(i, salt); });
}

template <class W1Layout>
void check_mlp(const grid& m) {
  using on_tp = layout<split<'h', "tp">>;
  using x_t = tensor<double, grid, "btm", layout<split<'b', "dp">>>;
  using w1_t = tensor<double, grid, "mh", W1Layout>;
  using b1_t = tensor<double, grid, "h", on_tp>;
  using w2_t = tensor<double, grid, "hm", on_tp>;
  using b2_t = tensor<double, grid, "m">;
  const std::size_t B = 5, T = 2, M = 3, H = 4;
  const auto x = filled<x_t>(m, {B, T, M}, 1);
  const auto w1 = filled<w1_t>(m, {M, H}, 2);
  const auto b1 = filled<b1_t>(m, {H}, 3);
  const auto w2 = filled<w2_t>(m, {H, M}, 4);
  const auto b2 = filled<b2_t>(m, {M}, 5);

  auto mlp = [](ad::tape& t, const auto& xv, const auto& w1v, const auto& b1v, const auto& w2v,
                const auto& b2v) {
    auto hidden = ad::einsum<"btm,mh->bth", layout<split<'b', "dp">, split<'h', "tp">>>(xv, w1v);
    auto act = ad::gelu(ad::broadcast_add(hidden, b1v));
    auto partial_sum = ad::einsum<"bth,hm->btm">(act, w2v);  // partial over tp
    auto y = ad::broadcast_add(ad::redistribute<layout<split<'b', "dp">>>(partial_sum), b2v);
    return zest::testing::weighted_sum(t, y, 11);
  };
  const auto r = zest::testing::check_gradients({.names = {"x", "W1", "b1", "W2", "b2"}}, mlp, x,
                                                w1, b1, w2, b2);
  CAPTURE(layout_string<w1_t>());
  INFO(r.message());
  CHECK(r.ok());
  CHECK(r.checked == B * T * M + 2 * M * H + H + M);
}

TEST_CASE("tensor-parallel MLP: every gradient agrees with central differences on dp x tp") {
  for (const auto& shape : zest::testing::mesh_shapes()) {
    const grid m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    check_mlp<layout<split<'h', "tp">>>(m);
    check_mlp<layout<split<'m', "dp">, split<'h', "tp">>>(m);  // ZeRO-3 storage of W1
  }
}

}  // namespace

}  // namespace tp_mlp_gradients_tests

TEST_SUITE_END();
