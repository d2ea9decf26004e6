// zest::testing::check_gradients (zest/testing/check_gradients.hpp) at 1, 2 and 4 ranks:
//   - correct ops pass: einsums (ZeRO-3 split weights, tensor-parallel splits, a partial
//     input, uneven extents), a product, and x^3 written with the tape's public pieces, on
//     mesh<"dp"> and every mesh<"dp", "tp"> shape of the world, in double and in float;
//   - a deliberately wrong backward fails: x^3 whose backward says 2x^2 fails at every
//     element, with the reported values equal to 2x^2 and 3x^2 (computed here, independently);
//     one wrong only at one global element fails there alone, wherever that element's shard
//     lives, and the report names the input, the global index and both values;
//   - the defaults (double: h 1e-6, rtol 1e-6, atol 1e-8) hold for zest's own nonlinear ops
//     (gelu, softmax, log-softmax, causal softmax, layer norm, cross-entropy) on sharded inputs;
//   - an element-wise op defined with the public op API (autodiff::unary, a value function
//     and its derivative) passes with the right derivative and fails with a wrong one, on
//     the host and on the emulated backend (the GPU's code paths on the host);
//   - the options: names, max_elements sampling, tolerances.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/op.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/mesh/emulated_mesh.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/testing/check_gradients.hpp"

namespace {
using namespace zest;
namespace ad = zest::autodiff;
using zest::testing::check_gradients;
using zest::testing::gradient_check_options;
using zest::testing::gradient_report;
using zest::testing::weighted_sum;

using mesh1 = mesh<"dp">;
using mesh2 = mesh<"dp", "tp">;
constexpr std::size_t nowhere = std::numeric_limits<std::size_t>::max();

// y = x^3 element-wise, recorded with the tape's public pieces (a user's op). Its backward
// multiplies the incoming gradient by k x^2 (k = 3 is right), or by (k + 1) x^2 at the
// element whose row-major global position is `wrong_at`.
template <sharded_tensor X>
ad::variable<X> cube(const ad::variable<X>& x, double k, std::size_t wrong_at = nowhere) {
  X y = x.value();
  for (auto& v : y.local()) v = v * v * v;
  ad::variable<X> out(x.owner(), std::move(y), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), k, wrong_at] {
      if (!on->grad) return;
      using T = typename X::value_type;
      ad::dual_tensor<X> g = *on->grad;  // same local blocks as x (dual: split stays split)
      const auto& e = xn->value.extents();
      const auto& lo = xn->value.local_offsets();
      const auto& le = xn->value.local_extents();
      auto gl = g.local();
      const auto xl = xn->value.local();
      for (std::size_t i = 0; i < gl.size(); ++i) {
        std::size_t rest = i, flat = 0, stride = 1;
        for (std::size_t d = X::rank; d-- > 0;) {
          flat += (lo[d] + rest % le[d]) * stride;
          rest /= le[d];
          stride *= e[d];
        }
        const double kk = flat == wrong_at ? k + 1 : k;
        gl[i] = static_cast<T>(gl[i] * kk * xl[i] * xl[i]);
      }
      xn->accumulate(std::move(g));
    });
  }
  return out;
}

template <class X>
X filled(const typename X::mesh_type& m, const typename X::extents_type& e, std::uint32_t salt) {
  return X::generate(m, e, [&](const auto& i) { return zest::testing::value_at(i, salt) + 0.25; });
}

// ---------------------------------------------------------------------------------------
// Correct ops pass.

template <class T, class XL, class WL, class Mesh>
void check_einsum(const Mesh& m) {
  using x_t = tensor<T, Mesh, "bsm", XL>;
  using w_t = tensor<T, Mesh, "mh", WL>;
  const auto x = filled<x_t>(m, {5, 2, 3}, 1);  // 5 rows: uneven over 2 and 4 ranks
  const auto w = filled<w_t>(m, {3, 3}, 2);
  const gradient_report r = check_gradients(
      {.names = {"x", "w"}},
      [](ad::tape& t, const auto& xv, const auto& wv) {
        return weighted_sum(t, ad::einsum<"bsm,mh->bsh">(xv, wv));
      },
      x, w);
  CAPTURE(layout_string<x_t>());
  CAPTURE(layout_string<w_t>());
  INFO(r.message());
  CHECK(r.ok());
  CHECK(r.checked == x.size() + w.size());
  CHECK(r.failed == 0);
}

TEST_CASE("check_gradients: einsums of any layout pass") {
  const mesh1 m(MPI_COMM_WORLD, {zest::testing::world_size()});
  check_einsum<double, layout<>, layout<>>(m);
  check_einsum<double, layout<split<'b', "dp">>, layout<split<'m', "dp">>>(m);  // ZeRO-3
  check_einsum<double, layout<partial<"dp">>, layout<>>(m);  // a pending-sum input
  check_einsum<float, layout<split<'b', "dp">>, layout<split<'m', "dp">>>(m);
  for (const auto& shape : zest::testing::mesh_shapes()) {
    const mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_einsum<double, layout<split<'b', "dp">>, layout<split<'h', "tp">>>(m2);
    check_einsum<double, layout<split<'b', "dp">, split<'m', "tp">>, layout<split<'m', "tp">>>(m2);
    check_einsum<double, layout<split<'s', "tp">, partial<"dp">>, layout<split<'m', "dp", "tp">>>(
        m2);
  }
}

TEST_CASE("check_gradients: a product and a user's op with the right derivative pass") {
  for (const auto& shape : zest::testing::mesh_shapes()) {
    const mesh2 m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    using x_t = tensor<double, mesh2, "bm", layout<split<'b', "dp">, split<'m', "tp">>>;
    using y_t = tensor<double, mesh2, "bm", layout<split<'m', "dp">>>;
    const auto x = filled<x_t>(m, {5, 3}, 3);
    const auto y = filled<y_t>(m, {5, 3}, 4);
    const auto r = check_gradients(
        [](ad::tape& t, const auto& a, const auto& b) { return weighted_sum(t, cube(a, 3) * b); },
        x, y);
    INFO(r.message());
    CHECK(r.ok());
    CHECK(r.checked == 30);
    // The variable-only form of the loss function.
    const auto r2 = check_gradients([](const auto& a) { return ad::sum(cube(a, 3.0)); }, x);
    INFO(r2.message());
    CHECK(r2.ok());
    // In float, with float's defaults.
    using f_t = tensor<float, mesh2, "bm", layout<split<'b', "dp">>>;
    const auto f = filled<f_t>(m, {5, 3}, 3);
    const auto r3 = check_gradients([](const auto& a) { return ad::sum(cube(a, 3.0)); }, f);
    INFO(r3.message());
    CHECK(r3.ok());
  }
}

TEST_CASE("check_gradients: the defaults hold for zest's own nonlinear ops, sharded") {
  for (const auto& shape : zest::testing::mesh_shapes()) {
    const mesh2 m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    using x_t = tensor<double, mesh2, "btm", layout<split<'b', "dp">, split<'t', "tp">>>;
    using g_t = tensor<double, mesh2, "m">;
    using s_t = tensor<double, mesh2, "hqk", layout<split<'h', "dp">>>;
    using l_t = tensor<double, mesh2, "btv", layout<split<'t', "dp">>>;
    using ids_t = tensor<std::int32_t, mesh2, "bt", layout<split<'t', "dp">>>;
    const auto x = filled<x_t>(m, {5, 3, 4}, 9);
    const auto gamma = filled<g_t>(m, {4}, 10);
    const auto beta = filled<g_t>(m, {4}, 11);
    const auto scores = filled<s_t>(m, {3, 4, 4}, 12);
    const auto logits = filled<l_t>(m, {2, 3, 5}, 13);
    const auto targets = ids_t::generate(
        m, {2, 3}, [](const auto& i) { return std::int32_t((i[0] * 3 + i[1]) % 5); });
    auto expect_ok = [](const gradient_report& r, std::size_t count) {
      INFO(r.message());
      CHECK(r.ok());
      CHECK(r.checked == count);
    };
    expect_ok(
        check_gradients([](ad::tape& t, const auto& v) { return weighted_sum(t, ad::gelu(v)); }, x),
        60);
    expect_ok(
        check_gradients(
            [](ad::tape& t, const auto& v) { return weighted_sum(t, ad::softmax<'m'>(v)); }, x),
        60);
    expect_ok(
        check_gradients(
            [](ad::tape& t, const auto& v) { return weighted_sum(t, ad::log_softmax<'m'>(v)); }, x),
        60);
    expect_ok(check_gradients(
                  [](ad::tape& t, const auto& v) {
                    return weighted_sum(t, ad::causal_softmax<'q', 'k'>(v));
                  },
                  scores),
              48);
    expect_ok(
        check_gradients([](ad::tape& t, const auto& v, const auto& g,
                           const auto& b) { return weighted_sum(t, ad::layer_norm<'m'>(v, g, b)); },
                        x, gamma, beta),
        68);
    expect_ok(check_gradients(
                  [&targets](const auto& v) { return ad::cross_entropy<'v'>(v, targets); }, logits),
              30);
  }
}

TEST_CASE("check_gradients: on the emulated backend (the GPU's code paths)") {
  using emesh = emulated_mesh<"dp", "tp">;
  for (const auto& shape : zest::testing::mesh_shapes()) {
    const emesh m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    using x_t = tensor<double, emesh, "btm", layout<split<'b', "dp">>>;
    using w_t = tensor<double, emesh, "mh", layout<split<'m', "dp">, split<'h', "tp">>>;
    const auto x = filled<x_t>(m, {5, 2, 3}, 14);
    const auto w = filled<w_t>(m, {3, 4}, 15);
    const auto r = check_gradients(
        [](ad::tape& t, const auto& a, const auto& b) {
          return weighted_sum(t, ad::gelu(ad::einsum<"btm,mh->bth">(a, b)));
        },
        x, w);
    INFO(r.message());
    CHECK(r.ok());
    CHECK(r.checked == 30 + 12);
  }
}

// ---------------------------------------------------------------------------------------
// A wrong backward fails.

template <class XL, class Mesh>
void check_wrong_everywhere(const Mesh& m) {
  using x_t = tensor<double, Mesh, "bm", XL>;
  const auto x = filled<x_t>(m, {5, 3}, 5);
  // loss = sum(x^3): the gradient is 3 x^2; the wrong backward gives 2 x^2.
  const auto r = check_gradients(
      {.names = {"x"}, .max_reported = 100}, [](const auto& a) { return ad::sum(cube(a, 2.0)); },
      x);
  CAPTURE(layout_string<x_t>());
  CHECK_FALSE(r.ok());
  CHECK_FALSE(static_cast<bool>(r));
  CHECK(r.checked == 15);
  REQUIRE(r.failed == 15);
  REQUIRE(r.mismatches.size() == 15);
  const auto whole = to_global(x);
  for (std::size_t k = 0; k < r.mismatches.size(); ++k) {
    const auto& mm = r.mismatches[k];
    CAPTURE(mm.describe());
    CHECK(mm.name == "x");
    CHECK(mm.input == 0);
    CHECK(mm.flat == k);
    CHECK(mm.index == std::vector<std::size_t>{k / 3, k % 3});
    const double v = whole[k];
    CHECK(mm.backward == doctest::Approx(2 * v * v).epsilon(1e-12));
    CHECK(mm.numeric == doctest::Approx(3 * v * v).epsilon(1e-6));
  }
}

TEST_CASE("check_gradients: a wrong derivative fails at every element, values reported") {
  const mesh1 m(MPI_COMM_WORLD, {zest::testing::world_size()});
  check_wrong_everywhere<layout<>>(m);
  check_wrong_everywhere<layout<split<'b', "dp">>>(m);
  check_wrong_everywhere<layout<split<'m', "dp">>>(m);
  for (const auto& shape : zest::testing::mesh_shapes()) {
    const mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_wrong_everywhere<layout<split<'b', "tp">, split<'m', "dp">>>(m2);
  }
}

template <class XL, class Mesh>
void check_wrong_at(const Mesh& m, std::size_t flat) {
  using x_t = tensor<double, Mesh, "bm", XL>;
  using w_t = tensor<double, Mesh, "mh", layout<>>;
  const auto x = filled<x_t>(m, {5, 3}, 6);
  const auto w = filled<w_t>(m, {3, 2}, 7);
  const auto r = check_gradients(
      {.names = {"x", "w"}},
      [flat](ad::tape& t, const auto& a, const auto& b) {
        return weighted_sum(t, ad::einsum<"bm,mh->bh">(cube(a, 3.0, flat), b));
      },
      x, w);
  CAPTURE(layout_string<x_t>());
  CAPTURE(flat);
  INFO(r.message());
  CHECK(r.checked == 15 + 6);
  REQUIRE(r.failed == 1);
  REQUIRE(r.mismatches.size() == 1);
  const auto& mm = r.mismatches[0];
  CHECK(mm.name == "x");
  CHECK(mm.flat == flat);
  CHECK(mm.index == std::vector<std::size_t>{flat / 3, flat % 3});
  CHECK(mm.tensor == "\"bm\" " + layout_string<x_t>());
  // Wrong by a factor 4/3 exactly: backward = (4/3) numeric.
  CHECK(mm.backward == doctest::Approx(4.0 / 3.0 * mm.numeric).epsilon(1e-6));
  const std::string text = mm.describe();
  CHECK(text.find("input \"x\"") != std::string::npos);
  CHECK(text.find("[b=" + std::to_string(flat / 3) + ", m=" + std::to_string(flat % 3) + "]") !=
        std::string::npos);
  CHECK(r.message().find(text) != std::string::npos);
}

// softplus(x) = log(1 + e^x), whose derivative is the sigmoid; Wrong scales the derivative
// by 1.1, as a slip in a user's formula would.
template <bool Wrong>
struct softplus_fn {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return x > T(0) ? x + zest::dmath::log(T(1) + zest::dmath::exp(-x))
                    : zest::dmath::log(T(1) + zest::dmath::exp(x));
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T x, T) const {
    return (Wrong ? T(1.1) : T(1)) / (T(1) + zest::dmath::exp(-x));
  }
};

template <class Mesh>
void check_unary(const Mesh& m) {
  using x_t = tensor<double, Mesh, "bm", layout<split<'b', "dp">, split<'m', "tp">>>;
  const auto x = filled<x_t>(m, {5, 3}, 16);
  const auto right = check_gradients(
      [](ad::tape& t, const auto& v) {
        return weighted_sum(t, ad::unary<"softplus">(v, softplus_fn<false>{}));
      },
      x);
  INFO(right.message());
  CHECK(right.ok());
  CHECK(right.checked == 15);
  const auto wrong = check_gradients(
      {.names = {"x"}, .max_reported = 15},
      [](ad::tape& t, const auto& v) {
        return weighted_sum(t, ad::unary<"softplus">(v, softplus_fn<true>{}));
      },
      x);
  CHECK(wrong.failed == 15);
  REQUIRE(wrong.mismatches.size() == 15);
  for (const auto& mm : wrong.mismatches) {
    CAPTURE(mm.describe());
    CHECK(mm.backward == doctest::Approx(1.1 * mm.numeric).epsilon(1e-6));
  }
}

TEST_CASE("check_gradients: a user's op from the public op API, right and wrong derivative") {
  for (const auto& shape : zest::testing::mesh_shapes()) {
    const mesh2 m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    check_unary(m);
    const emulated_mesh<"dp", "tp"> e(MPI_COMM_WORLD, shape);
    check_unary(e);
  }
}

TEST_CASE("check_gradients: a derivative wrong at one element fails there, on any rank's shard") {
  const mesh1 m(MPI_COMM_WORLD, {zest::testing::world_size()});
  for (std::size_t flat : {0U, 7U, 14U}) {
    check_wrong_at<layout<split<'b', "dp">>>(m, flat);
    check_wrong_at<layout<split<'m', "dp">>>(m, flat);
  }
  for (const auto& shape : zest::testing::mesh_shapes()) {
    const mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_wrong_at<layout<split<'b', "dp">, split<'m', "tp">>>(m2, 13);
  }
}

TEST_CASE("check_gradients: options") {
  const mesh1 m(MPI_COMM_WORLD, {zest::testing::world_size()});
  using x_t = tensor<double, mesh1, "bm", layout<split<'b', "dp">>>;
  const auto x = filled<x_t>(m, {5, 3}, 8);
  auto wrong = [](const auto& a) { return ad::sum(cube(a, 2.0)); };
  // Sampling: 4 evenly spaced elements, the first and the last included.
  const auto s = check_gradients({.max_elements = 4}, wrong, x);
  CHECK(s.checked == 4);
  REQUIRE(s.failed == 4);
  std::vector<std::size_t> at;
  for (const auto& mm : s.mismatches) at.push_back(mm.flat);
  CHECK(at == std::vector<std::size_t>{0, 4, 9, 14});
  CHECK(s.mismatches[0].name == "input 0");
  // The report keeps max_reported mismatches and counts the rest.
  const auto few = check_gradients({.max_reported = 2}, wrong, x);
  CHECK(few.failed == 15);
  CHECK(few.mismatches.size() == 2);
  CHECK(few.message().find("and 13 more") != std::string::npos);
  // A tolerance wide enough to accept a derivative 2/3 of the right one.
  const auto loose = check_gradients({.rtol = 0.5}, wrong, x);
  CHECK(loose.ok());
  CHECK(loose.worst_ratio > 0.5);
  // An input the loss does not use has a zero gradient, and its central differences agree.
  const auto unused =
      check_gradients([](const auto& a, const auto&) { return ad::sum(cube(a, 3.0)); }, x, x);
  INFO(unused.message());
  CHECK(unused.ok());
  CHECK(unused.checked == 30);
}

}  // namespace
