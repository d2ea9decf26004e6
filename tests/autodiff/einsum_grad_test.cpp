// Gradients of einsums through the tape, checked by finite differences (double) of
// loss = sum(einsum(...) * R) against a single-rank reference, for each spec under several
// layout combinations (partial operands, nested splits, conflicts, forced outputs), and the
// ZeRO-3 case: a weight stored split over dp gets its gradient split over dp through one
// reduce-scatter.
#include <doctest/doctest.h>

#include <random>
#include <tuple>
#include <vector>

#include "einsum/einsum_cases.hpp"
#include "support/fixtures.hpp"
#include "zest/autodiff/tape.hpp"

namespace {
using namespace zest;
using namespace zest::testing;

// sum(reference_einsum(in) * r) over the global arrays.
double reference_loss(const einsum_spec& s, const std::vector<dense>& in,
                      const std::vector<double>& r) {
  std::vector<std::size_t> out_extents;
  const auto y = reference_einsum(s, in, out_extents);
  double total = 0;
  for (std::size_t i = 0; i < y.size(); ++i) total += y[i] * r[i];
  return total;
}

template <fixed_string Spec, int Combo, class O1 = void, class O2 = void>
void check_gradient(const einsum_mesh& m, std::mt19937& rng) {
  constexpr einsum_spec s = spec_of<Spec>;
  std::array<std::size_t, 128> extent{};
  for (std::size_t i = 0; i < s.operand_count; ++i)
    for (std::size_t k = 0; k < s.inputs[i].size; ++k)
      extent[static_cast<unsigned char>(s.inputs[i].letters[k])] = 1 + rng() % 4;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto extents_of = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
      typename operand_t<double, Spec, J, Combo>::extents_type e{};
      for (std::size_t k = 0; k < s.inputs[J].size; ++k)
        e[k] = extent[static_cast<unsigned char>(s.inputs[J].letters[k])];
      return e;
    };
    autodiff::tape t;
    auto vars = std::make_tuple(t.parameter(make_tensor<operand_t<double, Spec, I, Combo>>(
        m, extents_of(std::integral_constant<std::size_t, I>{}),
        static_cast<std::uint32_t>(11 + I)))...);
    auto y = autodiff::einsum<Spec, O1, O2>(std::get<I>(vars)...);
    using y_t = typename decltype(y)::tensor_type;
    using r_t = basic_tensor<double, einsum_mesh, y_t::dims, replicated_layout(2)>;
    auto r = t.constant(make_tensor<r_t>(m, y.value().extents(), 77));
    auto loss = autodiff::sum(y * r);
    autodiff::backward(loss);

    // Gradient layouts are the duals of the operands' layouts.
    static_assert((std::is_same_v<std::remove_cvref_t<decltype(std::get<I>(vars).grad())>,
                                  autodiff::dual_tensor<operand_t<double, Spec, I, Combo>>> &&
                   ...));

    std::vector<dense> in{dense{
        s.inputs[I].view(),
        std::vector<std::size_t>(std::get<I>(vars).value().extents().begin(),
                                 std::get<I>(vars).value().extents().end()),
        global_values(std::get<I>(vars).value().extents(), static_cast<std::uint32_t>(11 + I))}...};
    const auto r_global = global_values(y.value().extents(), 77);
    const double want_loss = reference_loss(s, in, r_global);
    CHECK(to_global(loss.value())[0] == doctest::Approx(want_loss).epsilon(1e-12));

    auto check_operand = [&](std::size_t i, const std::vector<double>& grad) {
      CAPTURE(i);
      REQUIRE(grad.size() == in[i].data.size());
      const double h =
          1e-3;  // the loss is linear in each operand: central differences are exact up to rounding
      double worst = 0, scale = 1;
      for (std::size_t e = 0; e < grad.size(); ++e) {
        auto plus = in, minus = in;
        plus[i].data[e] += h;
        minus[i].data[e] -= h;
        const double fd =
            (reference_loss(s, plus, r_global) - reference_loss(s, minus, r_global)) / (2 * h);
        worst = std::max(worst, std::abs(fd - grad[e]));
        scale = std::max(scale, std::abs(fd));
      }
      CHECK(worst / scale < 1e-9);
    };
    (check_operand(I, to_global(std::get<I>(vars).grad())), ...);
  }
  (std::make_index_sequence<s.operand_count>{});
}

template <fixed_string Spec>
void check_spec_gradients() {
  std::mt19937 rng(7);
  for (const auto& shape : mesh_shapes()) {
    einsum_mesh m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    CAPTURE(view_of<Spec>);
    check_gradient<Spec, 0>(m, rng);  // unsharded
    check_gradient<Spec, 1>(m, rng);
    check_gradient<Spec, 2>(m, rng);
    check_gradient<Spec, 4>(m, rng);  // a partial operand
    check_gradient<Spec, 5>(m, rng);  // nested splits
    check_gradient<Spec, 6>(m, rng);  // a conflict, gather_weights
    check_gradient<Spec, 6, keep_weights>(m, rng);
    check_gradient<Spec, 4, layout<>>(m, rng);  // forced replicated output of a partial product
  }
}

TEST_CASE("matmul ik,kj->ij") { check_spec_gradients<"ik,kj->ij">(); }
TEST_CASE("linear bsm,mh->bsh") { check_spec_gradients<"bsm,mh->bsh">(); }
TEST_CASE("batched bik,bkj->bij") { check_spec_gradients<"bik,bkj->bij">(); }
TEST_CASE("transposed ki,jk->ij") { check_spec_gradients<"ki,jk->ij">(); }
TEST_CASE("outer i,j->ij") { check_spec_gradients<"i,j->ij">(); }
TEST_CASE("reduction bsm->sm") { check_spec_gradients<"bsm->sm">(); }
TEST_CASE("transpose bsm->msb") { check_spec_gradients<"bsm->msb">(); }
TEST_CASE("full reduction ij->") { check_spec_gradients<"ij->">(); }
TEST_CASE("summed out of one operand ij,jk->k") { check_spec_gradients<"ij,jk->k">(); }
TEST_CASE("GShard dispatch GSEC,GSM->EGCM") { check_spec_gradients<"GSEC,GSM->EGCM">(); }
TEST_CASE("GShard combine GSEC,EGCM->GSM") { check_spec_gradients<"GSEC,EGCM->GSM">(); }

TEST_CASE("ZeRO-3: weight stored split(m:dp) gets its gradient split(m:dp) by one reduce-scatter") {
  using mesh_t = mesh<"dp">;
  mesh_t m(MPI_COMM_WORLD, {world_size()});
  using x_t = tensor<double, mesh_t, "bsm", layout<split<'b', "dp">>>;
  using w_t = tensor<double, mesh_t, "mh", layout<split<'m', "dp">>>;
  using r_t = tensor<double, mesh_t, "bsh">;
  const std::array<std::size_t, 3> xe{5, 3, 7};
  const std::array<std::size_t, 2> we{7, 4};
  autodiff::tape t;
  auto x = t.parameter(make_tensor<x_t>(m, xe, 1));
  auto w = t.parameter(make_tensor<w_t>(m, we, 2));
  auto r = t.constant(make_tensor<r_t>(m, {5, 3, 4}, 3));

  m.reset_stats();
  auto y = autodiff::einsum<"bsm,mh->bsh">(x, w);  // w all-gathered on use
  auto loss = autodiff::sum(y * r);
  const comm_stats forward = m.stats();
  m.reset_stats();
  autodiff::backward(loss);
  const comm_stats backward = m.stats();

  static_assert(std::is_same_v<std::remove_cvref_t<decltype(w.grad())>, w_t>,
                "stored layout, no ZeRO code");
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(x.grad())>, x_t>);
  CHECK(forward.by_kind[static_cast<std::size_t>(collective::all_gather)].calls == 1);
  CHECK(forward.calls() == 1);
  // backward: dx = "bsh,mh->bsm" gathers w again; dw = "bsm,bsh->mh" is partial(dp), then
  // reduce-scattered to split(m:dp).
  CHECK(backward.by_kind[static_cast<std::size_t>(collective::all_gather)].calls == 1);
  CHECK(backward.by_kind[static_cast<std::size_t>(collective::reduce_scatter)].calls == 1);
  CHECK(backward.calls() == 2);
  // The local shard of the gradient is exactly this rank's block of m.
  CHECK(w.grad().local_extents()[0] == w.value().local_extents()[0]);

  // Values: dw = sum_bs x * r, dx = sum_h r * w, against single-rank references.
  const einsum_spec dw_spec = parse_einsum("bsm,bsh->mh");
  const einsum_spec dx_spec = parse_einsum("bsh,mh->bsm");
  std::vector<std::size_t> oe;
  const auto xg = global_values(xe, 1), wg = global_values(we, 2),
             rg = global_values(std::array<std::size_t, 3>{5, 3, 4}, 3);
  const auto dw_want =
      reference_einsum(dw_spec, {dense{"bsm", {5, 3, 7}, xg}, dense{"bsh", {5, 3, 4}, rg}}, oe);
  const auto dx_want =
      reference_einsum(dx_spec, {dense{"bsh", {5, 3, 4}, rg}, dense{"mh", {7, 4}, wg}}, oe);
  CHECK(relative_error(to_global(w.grad()), dw_want) < 1e-12);
  CHECK(relative_error(to_global(x.grad()), dx_want) < 1e-12);
}

TEST_CASE("a variable used twice accumulates its gradient; add, sub, scale, redistribute") {
  using mesh_t = mesh<"dp">;
  mesh_t m(MPI_COMM_WORLD, {world_size()});
  using a_t = tensor<double, mesh_t, "ij", layout<split<'i', "dp">>>;
  using b_t = tensor<double, mesh_t, "ij", layout<partial<"dp">>>;
  const std::array<std::size_t, 2> e{5, 3};
  autodiff::tape t;
  auto a = t.parameter(make_tensor<a_t>(m, e, 1));
  auto b = t.parameter(make_tensor<b_t>(m, e, 2));
  auto r = t.constant(make_tensor<tensor<double, mesh_t, "ij">>(m, e, 3));
  // loss = sum((2a + b - a) * r) + sum(redistribute<replicate>(a) * r): d/da = 2r, d/db = r.
  auto u = autodiff::scale(a, 2.0) + b - a;
  auto v = autodiff::redistribute<layout<>>(a);
  auto loss = autodiff::sum(u * r + v * r);
  autodiff::backward(loss);
  static_assert(
      std::is_same_v<std::remove_cvref_t<decltype(b.grad())>, tensor<double, mesh_t, "ij">>);
  const auto rg = global_values(e, 3);
  std::vector<double> two_r(rg);
  for (auto& x : two_r) x *= 2;
  CHECK(relative_error(to_global(a.grad()), two_r) < 1e-12);
  CHECK(relative_error(to_global(b.grad()), rg) < 1e-12);
}
}  // namespace
