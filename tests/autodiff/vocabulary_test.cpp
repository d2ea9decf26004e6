// The op vocabulary of zest/autodiff/elementwise.hpp and ops.hpp (exp, log, tanh, sigmoid,
// silu, relu, sqrt, rsqrt, pow (a number or a tensor exponent), abs, shift, maximum,
// minimum, where, mean and variance over a dim, softmax and log-softmax over any dim,
// rms_norm) and the op definition API of op.hpp (unary with two lambdas, rowwise, custom):
// values against single-rank references written here, gradients of loss = sum(op(...) * R)
// against central differences (double) of the sharded forward, at about 16 elements of each
// input. Each on the host backend (mesh<"dp",
// "tp">; a user's ops also on the emulated one, emulated_mesh, the GPU's code paths), at
// every 2-D mesh shape of the world, replicated, split over dp, and split over dp and tp;
// b = 5 and m = 6 do not split evenly over 2 or 4 ranks.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/mesh/emulated_mesh.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

using globals = std::vector<std::vector<double>>;
using extents3 = std::array<std::size_t, 3>;

template <class V>
std::vector<double> as_double(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

struct run_result {
  double loss = 0;
  std::vector<double> value;
  globals grads;
};

// One run: inputs from global arrays, y = op(inputs...), loss = sum(y * R) with R replicated.
template <class... X, class Op, class M>
run_result run_once(const M& m, Op op, const std::tuple<typename X::extents_type...>& extents,
                    const globals& in, bool grads) {
  ad::tape t;
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto vars = std::make_tuple(t.parameter(X::from_global(m, std::get<I>(extents), in[I]))...);
    auto y = op(std::get<I>(vars)...);
    using y_t = typename decltype(y)::tensor_type;
    using r_t = basic_tensor<double, M, y_t::dims, replicated_layout(M::axis_count)>;
    const auto rg = global_values(y.value().extents(), 99);
    auto r = t.constant(r_t::from_global(m, y.value().extents(), rg));
    auto loss = ad::sum(y * r);
    run_result out;
    out.loss = to_global(loss.value())[0];
    if (!grads) return out;
    out.value = as_double(to_global(y.value()));
    ad::backward(loss);
    (out.grads.push_back(as_double(to_global(std::get<I>(vars).grad()))), ...);
    return out;
  }
  (std::index_sequence_for<X...>{});
}

// The value against `want`, every gradient against central differences.
template <class... X, class Op, class M>
void check_op(const M& m, Op op, const std::tuple<typename X::extents_type...>& extents,
              const globals& in, const std::vector<double>& want) {
  const run_result base = run_once<X...>(m, op, extents, in, true);
  CHECK(relative_error(base.value, want) < 1e-12);
  REQUIRE(base.grads.size() == in.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < in.size(); ++i) {
    CAPTURE(i);
    REQUIRE(base.grads[i].size() == in[i].size());
    double worst = 0, scale = 1;
    // About 16 elements of each input, spread over it (every rank's block has some).
    const std::size_t step = std::max<std::size_t>(1, in[i].size() / 16);
    for (std::size_t e = i % step; e < in[i].size(); e += step) {
      globals plus = in, minus = in;
      plus[i][e] += h;
      minus[i][e] -= h;
      const double fd = (run_once<X...>(m, op, extents, plus, false).loss -
                         run_once<X...>(m, op, extents, minus, false).loss) /
                        (2 * h);
      worst = std::max(worst, std::abs(fd - base.grads[i][e]));
      scale = std::max(scale, std::abs(fd));
    }
    CHECK(worst / scale < 1e-6);
  }
}

// f(mesh) on mesh<"dp", "tp"> at each mesh shape, and with Devices on emulated_mesh<"dp",
// "tp"> too. The vocabulary's device code paths are compared with the host's, op by op, by
// the conformance suite (tests/backend/conformance); a user's ops (unary with lambdas,
// rowwise, custom) are not in its table, so their cases run here on both backends.
template <bool Devices = false, class F>
void on_every_mesh(F f) {
  for (const auto& shape : mesh_shapes()) {
    mesh<"dp", "tp"> m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    f(m);
    if constexpr (Devices) {
      emulated_mesh<"dp", "tp"> emulated(MPI_COMM_WORLD, shape);
      f(emulated);
    }
  }
}

// The three layouts of "btm" each op is checked in (for ops along m, tp splits t instead).
template <bool AlongM = false, class F>
void on_every_layout(F f) {
  f.template operator()<layout<>>();
  f.template operator()<layout<split<'b', "dp">>>();
  if constexpr (AlongM) {
    f.template operator()<layout<split<'b', "dp">, split<'t', "tp">>>();
  } else {
    f.template operator()<layout<split<'b', "dp">, split<'m', "tp">>>();
  }
}

const extents3 xe{5, 3, 6};

// Inputs of pattern `salt`, times `scale`, plus `offset`.
std::vector<double> inputs(std::uint32_t salt, double scale = 1, double offset = 0) {
  auto v = global_values(xe, salt);
  for (auto& x : v) x = x * scale + offset;
  return v;
}

// A unary op against its element-wise reference.
template <bool Devices = false, class Op, class Ref>
void check_unary(Op op, Ref ref, double scale = 1, double offset = 0) {
  on_every_mesh<Devices>([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    on_every_layout([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      const globals in{inputs(1, scale, offset)};
      std::vector<double> want;
      for (double v : in[0]) want.push_back(ref(v));
      auto checked = [&](const auto& x) {
        auto y = op(x);
        static_assert(std::is_same_v<typename decltype(y)::tensor_type, x_t>);
        return y;
      };
      check_op<x_t>(m, checked, std::tuple{xe}, in, want);
    });
  });
}

// The naive rows of a global "btm" array along dim d: f(indices of the row's elements).
template <class F>
void reference_rows(std::size_t d, F f) {
  const extents3 s{xe[1] * xe[2], xe[2], 1};
  for (std::size_t flat = 0; flat < xe[0] * xe[1] * xe[2]; ++flat) {
    if ((flat / s[d]) % xe[d] != 0) continue;
    std::vector<std::size_t> row;
    for (std::size_t j = 0; j < xe[d]; ++j) row.push_back(flat + j * s[d]);
    f(row);
  }
}

// ---------------------------------------------------------------------------------------

TEST_CASE("exp, log, tanh, sigmoid, silu") {
  check_unary([](const auto& x) { return ad::exp(x); }, [](double v) { return std::exp(v); });
  check_unary([](const auto& x) { return ad::log(x); }, [](double v) { return std::log(v); }, 0.1,
              1.0);  // positive inputs
  check_unary([](const auto& x) { return ad::tanh(x); }, [](double v) { return std::tanh(v); }, 2);
  check_unary([](const auto& x) { return ad::sigmoid(x); },
              [](double v) { return 1 / (1 + std::exp(-v)); }, 8);  // both branches
  check_unary([](const auto& x) { return ad::silu(x); },
              [](double v) { return v / (1 + std::exp(-v)); }, 4);
}

TEST_CASE("relu, abs, sqrt, rsqrt, pow, shift") {
  // Inputs shifted off the kinks at 0.
  check_unary([](const auto& x) { return ad::relu(x); }, [](double v) { return v > 0 ? v : 0.0; },
              1, 0.0137);
  check_unary([](const auto& x) { return ad::abs(x); }, [](double v) { return std::abs(v); }, 1,
              0.0137);
  check_unary([](const auto& x) { return ad::sqrt(x); }, [](double v) { return std::sqrt(v); }, 0.2,
              1.5);
  check_unary([](const auto& x) { return ad::rsqrt(x); }, [](double v) { return 1 / std::sqrt(v); },
              0.2, 1.5);
  check_unary([](const auto& x) { return ad::pow(x, 2.5); },
              [](double v) { return std::pow(v, 2.5); }, 0.2, 1.5);
  check_unary([](const auto& x) { return ad::pow(x, 3.0); },
              [](double v) { return v * v * v; });  // negative bases, integer exponent
  check_unary([](const auto& x) { return ad::shift(x, 0.75); }, [](double v) { return v + 0.75; });
}

TEST_CASE("unary with two lambdas: a user's element-wise op") {
  check_unary<true>(
      [](const auto& x) {
        return ad::unary<"cube_plus">(
            x, [] ZEST_HOST_DEVICE(auto v) { return v * v * v + v; },
            [] ZEST_HOST_DEVICE(auto v, auto) { return 3 * v * v + 1; });
      },
      [](double v) { return v * v * v + v; });
}

// maximum, minimum (y in its own layout, brought to x's) and where.
TEST_CASE("maximum, minimum, where") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    on_every_layout([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      using y_t = tensor<double, M, "btm", layout<split<'t', "dp">>>;
      using mask_t = tensor<std::uint8_t, M, "btm", layout<split<'m', "dp">>>;
      const globals in{inputs(1), inputs(2, 1, 0.0011)};
      std::vector<double> hi, lo, picked;
      std::vector<std::uint8_t> mask;
      for (std::size_t i = 0; i < in[0].size(); ++i) {
        hi.push_back(std::max(in[0][i], in[1][i]));
        lo.push_back(std::min(in[0][i], in[1][i]));
        mask.push_back(static_cast<std::uint8_t>(i % 3 == 1 ? 0 : 1 + i % 2));
        picked.push_back(mask.back() != 0 ? in[0][i] : in[1][i]);
      }
      const auto both = std::tuple{xe, xe};
      check_op<x_t, y_t>(
          m, [](const auto& x, const auto& y) { return ad::maximum(x, y); }, both, in, hi);
      check_op<x_t, y_t>(
          m, [](const auto& x, const auto& y) { return ad::minimum(x, y); }, both, in, lo);
      const auto c = mask_t::from_global(m, xe, mask);
      check_op<x_t, y_t>(
          m, [&](const auto& x, const auto& y) { return ad::where(c, x, y); }, both, in, picked);
    });
  });
}

// pow(x, y) with a tensor exponent: x > 0 (its domain), y of both signs, y in its own layout.
TEST_CASE("pow with a tensor exponent") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    on_every_layout([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      using y_t = tensor<double, M, "btm", layout<split<'t', "dp">>>;
      const globals in{inputs(1, 0.4, 1.5), inputs(2, 2)};
      std::vector<double> want;
      for (std::size_t i = 0; i < in[0].size(); ++i) want.push_back(std::pow(in[0][i], in[1][i]));
      check_op<x_t, y_t>(
          m, [](const auto& x, const auto& y) { return ad::pow(x, y); }, std::tuple{xe, xe}, in,
          want);
    });
  });
}

// pow(x, y) at x <= 0: std::pow's values; at x = 0 (y >= 0) y's gradient is 0 and x's is 0
// where y = 0; at x < 0 y's gradient is NaN (no real derivative in y).
TEST_CASE("pow with a tensor exponent at x <= 0") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using v_t = tensor<double, M, "m", layout<split<'m', "dp">>>;
    const std::array<std::size_t, 1> e{5};
    const std::vector<double> xs{0.0, 0.0, 0.0, -2.0, 2.0}, ys{0.0, 1.0, 2.5, 3.0, 0.5};
    ad::tape t;
    auto x = t.parameter(v_t::from_global(m, e, xs));
    auto y = t.parameter(v_t::from_global(m, e, ys));
    auto z = ad::pow(x, y);
    ad::backward(ad::sum(z));
    const auto zv = to_global(z.value()), dx = to_global(x.grad()), dy = to_global(y.grad());
    CHECK(zv[0] == 1.0);  // 0^0
    CHECK(zv[1] == 0.0);
    CHECK(zv[2] == 0.0);
    CHECK(zv[3] == -8.0);
    CHECK(dx[0] == 0.0);  // y = 0: x^0 does not depend on x
    CHECK(dx[1] == 1.0);
    CHECK(dx[2] == 0.0);
    CHECK(dx[3] == doctest::Approx(12.0));
    CHECK(dy[0] == 0.0);
    CHECK(dy[1] == 0.0);
    CHECK(dy[2] == 0.0);
    CHECK(std::isnan(dy[3]));
    CHECK(dy[4] == doctest::Approx(std::sqrt(2.0) * std::log(2.0)));
  });
}

// Element-wise operands of one type but other extents: refused by name before any element is
// read (a {5, 3, 4} and a {5, 6, 4} shard would be read past the smaller one's end).
TEST_CASE("element-wise ops refuse operands of different extents") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using x_t = tensor<double, M, "btm", layout<split<'b', "dp">>>;
    ad::tape t;
    auto a = t.parameter(x_t(m, {5, 3, 4}));
    auto b = t.parameter(x_t(m, {5, 6, 4}));
    auto expect = [&](auto&& run, std::string_view op) {
      try {
        (void)run();
        FAIL("no shape_error for ", op);
      } catch (const shape_error& err) {
        const std::string what = err.what();
        CHECK_MESSAGE(what.find(op) != std::string::npos, what);
        CHECK_MESSAGE(what.find("[5, 3, 4]") != std::string::npos, what);
        CHECK_MESSAGE(what.find("[5, 6, 4]") != std::string::npos, what);
      }
    };
    expect([&] { return a + b; }, "x + y");
    expect([&] { return a - b; }, "x - y");
    expect([&] { return a * b; }, "x * y");
    expect([&] { return ad::maximum(a, b); }, "maximum");
    expect([&] { return ad::pow(a, b); }, "pow");
    const auto mask = tensor<std::uint8_t, M, "btm">(m, {5, 3, 4});
    expect([&] { return ad::where(mask, a, b); }, "where");
    const auto wide_mask = tensor<std::uint8_t, M, "btm">(m, {5, 6, 4});
    expect([&] { return ad::where(wide_mask, a, a); }, "where");
  });
}

// pow(x, p) for a fixed p at x = 0: p = 0 is the constant 1 (gradient 0, not 0 * 0^-1), p = 1
// the identity, p = 2 the square.
TEST_CASE("pow with a fixed exponent at x = 0") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using v_t = tensor<double, M, "m", layout<split<'m', "dp">>>;
    const std::array<std::size_t, 1> e{3};
    const std::vector<double> xs{0.0, 0.0, 3.0};
    for (double p : {0.0, 1.0, 2.0}) {
      ad::tape t;
      auto x = t.parameter(v_t::from_global(m, e, xs));
      ad::backward(ad::sum(ad::pow(x, p)));
      const auto dx = to_global(x.grad());
      CHECK(dx[0] == (p == 1.0 ? 1.0 : 0.0));
      CHECK(dx[1] == dx[0]);
      CHECK(dx[2] == doctest::Approx(p * std::pow(3.0, p - 1.0)));
    }
  });
}

// softmax and log-softmax along each dim; mean and variance over each dim.
template <char D>
void check_rows() {
  constexpr std::size_t d = std::string_view("btm").find(D);
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    // Layouts that keep D whole: a split of another dim over dp, and over both axes.
    auto layouts = [&](auto f) {
      f.template operator()<layout<>>();
      if constexpr (D == 'b') {
        f.template operator()<layout<split<'t', "dp">>>();
        f.template operator()<layout<split<'t', "dp">, split<'m', "tp">>>();
      } else if constexpr (D == 't') {
        f.template operator()<layout<split<'b', "dp">>>();
        f.template operator()<layout<split<'b', "dp">, split<'m', "tp">>>();
      } else {
        f.template operator()<layout<split<'b', "dp">>>();
        f.template operator()<layout<split<'b', "dp">, split<'t', "tp">>>();
      }
    };
    layouts([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      const globals in{inputs(3, 3)};
      std::vector<double> soft(in[0].size()), logsoft(in[0].size()), mean_of, var_of;
      reference_rows(d, [&](const std::vector<std::size_t>& row) {
        double mx = -1e300, sum = 0, s1 = 0;
        for (auto i : row) mx = std::max(mx, in[0][i]);
        for (auto i : row) sum += std::exp(in[0][i] - mx);
        for (auto i : row) {
          soft[i] = std::exp(in[0][i] - mx) / sum;
          logsoft[i] = in[0][i] - mx - std::log(sum);
          s1 += in[0][i];
        }
        const double mu = s1 / static_cast<double>(row.size());
        double v = 0;
        for (auto i : row) v += (in[0][i] - mu) * (in[0][i] - mu);
        mean_of.push_back(mu);
        var_of.push_back(v / static_cast<double>(row.size()));
      });
      const auto one = std::tuple{xe};
      check_op<x_t>(
          m, [](const auto& x) { return ad::softmax<D>(x); }, one, in, soft);
      check_op<x_t>(
          m, [](const auto& x) { return ad::log_softmax<D>(x); }, one, in, logsoft);
      check_op<x_t>(
          m, [](const auto& x) { return ad::mean<D>(x); }, one, in, mean_of);
      check_op<x_t>(
          m, [](const auto& x) { return ad::variance<D>(x); }, one, in, var_of);
    });
  });
}

TEST_CASE("softmax, log_softmax, mean, variance along b") { check_rows<'b'>(); }
TEST_CASE("softmax, log_softmax, mean, variance along t") { check_rows<'t'>(); }
TEST_CASE("softmax, log_softmax, mean, variance along m") { check_rows<'m'>(); }

TEST_CASE("mean over a split dim: a pending sum, reduced by the loss") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using x_t = tensor<double, M, "btm", layout<split<'b', "dp">, split<'m', "tp">>>;
    using y_t = typename decltype(ad::mean<'m'>(std::declval<ad::variable<x_t>>()))::tensor_type;
    static_assert(y_t::layout.any_partial());  // pending over tp
    const globals in{inputs(4)};
    std::vector<double> want;
    reference_rows(2, [&](const std::vector<std::size_t>& row) {
      double s = 0;
      for (auto i : row) s += in[0][i];
      want.push_back(s / static_cast<double>(row.size()));
    });
    check_op<x_t>(
        m,
        [](const auto& x) { return ad::redistribute<layout<split<'b', "dp">>>(ad::mean<'m'>(x)); },
        std::tuple{xe}, in, want);
  });
}

TEST_CASE("rms_norm along m") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    on_every_layout<true>([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      using g_t = tensor<double, M, "m", layout<split<'m', "dp">>>;  // ZeRO-style storage
      const globals in{inputs(5, 2), global_values(std::array<std::size_t, 1>{xe[2]}, 6)};
      std::vector<double> want(in[0].size());
      reference_rows(2, [&](const std::vector<std::size_t>& row) {
        double ms = 0;
        for (auto i : row) ms += in[0][i] * in[0][i];
        const double r = 1 / std::sqrt(ms / static_cast<double>(row.size()) + 1e-6);
        for (std::size_t j = 0; j < row.size(); ++j) want[row[j]] = in[0][row[j]] * r * in[1][j];
      });
      check_op<x_t, g_t>(
          m, [](const auto& x, const auto& g) { return ad::rms_norm<'m'>(x, g); },
          std::tuple{xe, std::array<std::size_t, 1>{xe[2]}}, in, want);
    });
  });
}

// A user's row op: y = x - max(x) along the row (the gradient: dx = dy - onehot(argmax) sum(dy)).
struct minus_max {
  template <class T>
  ZEST_HOST_DEVICE void forward(ad::row<const T> x, ad::row<T> y) const {
    T mx = x[0];
    for (std::size_t j = 1; j < x.size(); ++j) mx = x[j] > mx ? x[j] : mx;
    for (std::size_t j = 0; j < x.size(); ++j) y[j] = x[j] - mx;
  }
  template <class T>
  ZEST_HOST_DEVICE void backward(ad::row<const T> x, ad::row<const T>, ad::row<const T> dy,
                                 ad::row<T> dx) const {
    std::size_t arg = 0;
    T total = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      if (x[j] > x[arg]) arg = j;
      total += dy[j];
    }
    for (std::size_t j = 0; j < x.size(); ++j) dx[j] = dy[j] - (j == arg ? total : T(0));
  }
};

TEST_CASE("rowwise and custom: a user's row op and general op") {
  on_every_mesh<true>([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    on_every_layout<true>([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      const globals in{inputs(7)};
      std::vector<double> want(in[0].size());
      reference_rows(2, [&](const std::vector<std::size_t>& row) {
        double mx = -1e300;
        for (auto i : row) mx = std::max(mx, in[0][i]);
        for (auto i : row) want[i] = in[0][i] - mx;
      });
      check_op<x_t>(
          m, [](const auto& x) { return ad::rowwise<'m', "minus_max">(x, minus_max{}); },
          std::tuple{xe}, in, want);
      // custom: y = 2 x computed on the tensors, its backward by hand, returned replicated
      // (any layout: redistributed to x's gradient layout).
      std::vector<double> twice;
      for (double v : in[0]) twice.push_back(2 * v);
      check_op<x_t>(
          m,
          [](const auto& x) {
            using g_t = tensor<double, M, "btm">;
            auto v = x.value();
            for (auto& e : v.local()) e *= 2;
            return ad::custom<"twice">(
                std::move(v),
                [](const auto& dy, const auto&, const auto&) {
                  auto g = redistribute_to<replicated_layout(M::axis_count)>(dy);
                  for (auto& e : g.local()) e *= 2;
                  return g_t(std::move(g));
                },
                x);
          },
          std::tuple{xe}, in, twice);
    });
  });
}

}  // namespace
