// autodiff::rope (zest/autodiff/rope.hpp) at 1, 2 and 4 ranks: values against a rotation
// computed here with plain loops over global row-major arrays (the "rotate_half" pairs
// (i, i + D/2), angle (pos + offset) * base^(-2i/D)), gradients with
// zest::testing::check_gradients (double, default tolerances), and the result layout (x's).
// q "btnd" replicated, split over dp (batch), over dp x tp (batch, heads), along the positions
// (t over dp, and over dp and tp together), along the rotated dim (d over tp: gathered first),
// and partial over tp; b = 3, t = 7, n = 3 and d = 6 do not split evenly over 2 or 4 ranks.
// Also "bkgtd" (grouped-query heads) and "bdt" (the position dim after the rotated one), a
// float run, and the run-time checks. Each on the host backend (mesh<"dp", "tp">) and the
// emulated one (emulated_mesh, the GPU's code paths), at every 2-D mesh shape of the world.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/rope.hpp"
#include "zest/mesh/emulated_mesh.hpp"
#include "zest/testing/check_gradients.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

template <class F>
void on_every_mesh(F f) {
  for (const auto& shape : mesh_shapes()) {
    mesh<"dp", "tp"> host(MPI_COMM_WORLD, shape);
    CAPTURE(host.describe());
    f(host);
    emulated_mesh<"dp", "tp"> emulated(MPI_COMM_WORLD, shape);
    f(emulated);
  }
}

gradient_check_options options() {
  gradient_check_options o;
  o.max_elements = 8;
  return o;
}

// The reference: rotate a global row-major array of extents e, positions along dim `pos`,
// pairs along dim `dim`.
template <std::size_t Rank>
std::vector<double> reference_rope(const std::vector<double>& x,
                                   const std::array<std::size_t, Rank>& e, std::size_t pos,
                                   std::size_t dim, double base, std::size_t offset) {
  std::array<std::size_t, Rank> stride{};
  std::size_t s = 1;
  for (std::size_t k = Rank; k-- > 0;) {
    stride[k] = s;
    s *= e[k];
  }
  const std::size_t d = e[dim], half = d / 2;
  std::vector<double> y(x.size());
  for (std::size_t flat = 0; flat < x.size(); ++flat) {
    const std::size_t p = (flat / stride[pos]) % e[pos];
    const std::size_t j = (flat / stride[dim]) % d;
    const std::size_t i = j < half ? j : j - half;
    const double angle = static_cast<double>(p + offset) *
                         std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    const double c = std::cos(angle), sn = std::sin(angle);
    if (j < half) {
      y[flat] = x[flat] * c - x[flat + half * stride[dim]] * sn;
    } else {
      y[flat] = x[flat] * c + x[flat - half * stride[dim]] * sn;
    }
  }
  return y;
}

template <class T>
std::vector<double> global_of(const T& t) {
  const auto g = to_global(t);
  return std::vector<double>(g.begin(), g.end());
}

// rope<Pos, Dim> of x_t against the reference, and its gradient.
template <char Pos, char Dim, class X, std::size_t Rank>
void check_rope(const typename X::mesh_type& m, const std::array<std::size_t, Rank>& e,
                ad::rope_options o, bool gradients = true) {
  CAPTURE(layout_string<X>());
  CAPTURE(o.base);
  CAPTURE(o.offset);
  constexpr std::size_t pos = X::dim_index(Pos), dim = X::dim_index(Dim);
  const auto in = global_values(e, 3);
  const X x = X::from_global(m, e, std::vector<typename X::value_type>(in.begin(), in.end()));
  {
    ad::tape t;
    auto y = ad::rope<Pos, Dim>(t.constant(X(x)), o);
    static_assert(std::is_same_v<typename decltype(y)::tensor_type, X>);
    const double tolerance = std::is_same_v<typename X::value_type, float> ? 1e-5 : 1e-13;
    CHECK(relative_error(global_of(y.value()), reference_rope(in, e, pos, dim, o.base, o.offset)) <
          tolerance);
  }
  if constexpr (std::is_same_v<typename X::value_type, double>) {
    if (!gradients) return;
    const auto r = check_gradients(
        options(),
        [&](ad::tape& t, const auto& v) { return weighted_sum(t, ad::rope<Pos, Dim>(v, o)); }, x);
    CHECK_MESSAGE(r.ok(), r);
  }
}

using extents4 = std::array<std::size_t, 4>;
const extents4 btnd{3, 7, 3, 6};

TEST_CASE("rope on q \"btnd\": every layout, uneven shards") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    auto each = [&]<class L>() {
      using x_t = tensor<double, M, "btnd", L>;
      check_rope<'t', 'd', x_t>(m, btnd, {});
      check_rope<'t', 'd', x_t>(m, btnd, {.base = 100.0, .offset = 5}, /*gradients=*/false);
    };
    each.template operator()<layout<>>();
    each.template operator()<layout<split<'b', "dp">>>();
    each.template operator()<layout<split<'b', "dp">, split<'n', "tp">>>();
    each.template operator()<layout<split<'t', "dp">>>();                    // positions split
    each.template operator()<layout<split<'t', "dp", "tp">>>();              // over both axes
    each.template operator()<layout<split<'b', "dp">, split<'d', "tp">>>();  // gathered first
    each.template operator()<layout<split<'t', "dp">, partial<"tp">>>();     // stays pending
  });
}

TEST_CASE("rope keeps a pending sum pending") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using x_t = tensor<double, M, "btnd", layout<split<'b', "dp">, partial<"tp">>>;
    using y_t =
        typename decltype(ad::rope<'t', 'd'>(std::declval<ad::variable<x_t>>()))::tensor_type;
    static_assert(std::is_same_v<y_t, x_t>);
    // Genuine summands (make_tensor: each rank of tp holds a different one): rotating each
    // summand rotates their sum.
    const auto x = make_tensor<x_t>(m, btnd, 4);
    ad::tape t;
    auto y = ad::rope<'t', 'd'>(t.constant(x_t(x)));
    CHECK(relative_error(global_of(y.value()), reference_rope(global_of(x), btnd, 1, 3, 1e4, 0)) <
          1e-13);
  });
}

TEST_CASE("rope on grouped-query heads \"bkgtd\" and with the position after the dim \"bdt\"") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    const std::array<std::size_t, 5> bkgtd{2, 3, 2, 5, 4};
    check_rope<'t', 'd', tensor<double, M, "bkgtd", layout<split<'b', "dp">, split<'k', "tp">>>>(
        m, bkgtd, {.base = 50.0, .offset = 2});
    check_rope<'t', 'd', tensor<double, M, "bkgtd", layout<split<'t', "tp">, split<'g', "dp">>>>(
        m, bkgtd, {});
    const std::array<std::size_t, 3> bdt{3, 8, 5};
    check_rope<'t', 'd', tensor<double, M, "bdt", layout<>>>(m, bdt, {.base = 30.0});
    check_rope<'t', 'd', tensor<double, M, "bdt", layout<split<'t', "dp">, split<'d', "tp">>>>(
        m, bdt, {.base = 30.0, .offset = 1});
  });
}

TEST_CASE("rope in float") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    check_rope<'t', 'd', tensor<float, M, "btnd", layout<split<'b', "dp">, split<'t', "tp">>>>(
        m, btnd, {.base = 10000.0, .offset = 3});
  });
}

TEST_CASE("rope's inverse undoes it, and the gradient is the inverse rotation") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using x_t = tensor<double, M, "btnd", layout<split<'t', "dp">, split<'n', "tp">>>;
    const auto in = global_values(btnd, 5);
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, btnd, in));
    auto y = ad::rope<'t', 'd'>(x, {.base = 10.0, .offset = 7});
    // sum(y * y) = sum(x * x) (a rotation keeps lengths): its gradient 2 R^T y = 2 x.
    auto loss = ad::sum(y * y);
    ad::backward(loss);
    double total = 0;
    for (double v : in) total += v * v;
    CHECK(std::abs(to_global(loss.value())[0] - total) < 1e-12 * total);
    std::vector<double> twice;
    for (double v : in) twice.push_back(2 * v);
    CHECK(relative_error(global_of(x.grad()), twice) < 1e-13);
  });
}

TEST_CASE("rope: an odd rotated dim and a bad base throw, naming the op, dim and extent") {
  mesh<"dp", "tp"> m(MPI_COMM_WORLD, mesh_shapes()[0]);
  using x_t = tensor<double, mesh<"dp", "tp">, "btnd", layout<split<'b', "dp">>>;
  const extents4 odd{2, 3, 2, 5};
  ad::tape t;
  auto x = t.constant(x_t::from_global(m, odd, global_values(odd, 1)));
  try {
    (void)ad::rope<'t', 'd'>(x);
    FAIL("no shape_error");
  } catch (const shape_error& e) {
    const std::string what = e.what();
    CHECK(what.find("rope<'t', 'd'>") != std::string::npos);
    CHECK(what.find("dim 'd'") != std::string::npos);
    CHECK(what.find("extent 5") != std::string::npos);
  }
  auto even = t.constant(x_t::from_global(m, btnd, global_values(btnd, 1)));
  auto with_base = [&](double base) { (void)ad::rope<'t', 'd'>(even, {.base = base}); };
  CHECK_THROWS_AS(with_base(0.0), shape_error);
  CHECK_THROWS_AS(with_base(-2.0), shape_error);
  CHECK_NOTHROW(with_base(2.0));
}

}  // namespace
