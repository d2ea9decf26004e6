// The autodiff operations on the emulated backend (the call operators of the function objects
// of zest/autodiff/kernels.hpp, which a GPU runs as kernels) against the same operations on
// the host backend (those function objects' host-vectorised members where they have one,
// tested by ops_test.cpp): the same inputs
// and layouts on mesh<...> and emulated_mesh<...>, the forward values and every gradient
// compared as global arrays, in float and double, replicated and split (rows split over the
// ranks, strided rows along a dim that is not the last, causal masks under a split of q);
// shards without rows; bad ids and targets throw the same shape_error.
//
// tests/cuda/cuda_autodiff_test.cu compiles this file with ZEST_TEST_DEVICE_MESH = cuda_mesh:
// the same comparisons with the kernels on a GPU.
#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/ops.hpp"
#if !defined(ZEST_TEST_DEVICE_MESH)
#include "zest/mesh/emulated_mesh.hpp"
#define ZEST_TEST_DEVICE_MESH emulated_mesh
#endif

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

// Forward values and gradients, as global arrays.
using outcome = std::vector<std::vector<double>>;

template <class T>
constexpr double tolerance = std::is_same_v<T, float> ? 1e-6 : 1e-12;

template <sharded_tensor X>
std::vector<double> global_of(const X& x) {
  const auto g = to_global(x);
  return std::vector<double>(g.begin(), g.end());
}

// Global values of pattern `salt` (times `scale`) laid out as X on mesh m.
template <class X>
X make(const typename X::mesh_type& m, const typename X::extents_type& e, std::uint32_t salt,
       double scale = 1) {
  const auto g = global_values(e, salt);
  std::vector<typename X::value_type> v(g.size());
  for (std::size_t i = 0; i < g.size(); ++i)
    v[i] = static_cast<typename X::value_type>(g[i] * scale);
  return X::from_global(m, e, v);
}

// loss = sum(y * r) + sum(0.5 * y), r a fixed replicated tensor (y used twice: its gradient
// is accumulated); then backward. The outcome: y's value, the loss, each parameter's gradient.
template <class Y, class... P>
outcome finish(ad::tape& t, const ad::variable<Y>& y, const ad::variable<P>&... params) {
  using mesh_t = typename Y::mesh_type;
  using r_t =
      basic_tensor<typename Y::value_type, mesh_t, Y::dims, replicated_layout(mesh_t::axis_count)>;
  auto r = t.constant(make<r_t>(y.value().mesh(), y.value().extents(), 99));
  auto loss = ad::sum(y * r) + ad::sum(ad::scale(y, typename Y::value_type(0.5)));
  ad::backward(loss);
  outcome out{global_of(y.value()), global_of(loss.value())};
  (out.push_back(global_of(params.grad())), ...);
  return out;
}

// float_tolerance: where the host's Eigen functions (vectorised tanh, a few ulp from
// std::tanh) differ from <cmath>'s by more than rounding.
template <class T>
void compare(const outcome& host, const outcome& emulated, double float_tolerance) {
  REQUIRE(host.size() == emulated.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    CAPTURE(i);  // 0: the value, 1: the loss, then the gradients
    // The loss (i == 1) adds every float term of the shard: a looser bound.
    const double tol = !std::is_same_v<T, float> ? tolerance<T> : i == 1 ? 1e-5 : float_tolerance;
    CHECK(relative_error(emulated[i], host[i]) < tol);
  }
}

// run(mesh) on mesh<"dp"> and on emulated_mesh<"dp"> over all ranks: the same outcome.
template <class T, class Run>
void same_on_both(Run run, double float_tolerance = tolerance<float>) {
  mesh<"dp"> host(MPI_COMM_WORLD, {world_size()});
  ZEST_TEST_DEVICE_MESH<"dp"> emulated(MPI_COMM_WORLD, {world_size()});
  compare<T>(run(host), run(emulated), float_tolerance);
}
// The same on each 2-D shape of mesh<"dp", "tp">.
template <class T, class Run>
void same_on_both_2d(Run run, double float_tolerance = tolerance<float>) {
  for (const auto& shape : mesh_shapes()) {
    mesh<"dp", "tp"> host(MPI_COMM_WORLD, shape);
    ZEST_TEST_DEVICE_MESH<"dp", "tp"> emulated(MPI_COMM_WORLD, shape);
    CAPTURE(host.describe());
    compare<T>(run(host), run(emulated), float_tolerance);
  }
}

template <class M>
using mesh_of = std::remove_cvref_t<M>;

using ids_values = std::vector<std::int32_t>;
ids_values ids_pattern(std::size_t n, std::size_t rows) {
  ids_values v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((i * 5 + 3) % rows);
  return v;
}

// The what() of the shape_error that f throws ("" when it throws none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const shape_error& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("emulated tape: add, sub, multiply (one operand pending), scale, sum", T, float,
                   double) {
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
    using y_t = tensor<T, M, "btm", layout<split<'t', "dp">>>;
    using w_t = tensor<T, M, "m">;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 4}, 1));
    auto y = t.parameter(make<y_t>(m, {5, 3, 4}, 2));
    auto w = t.parameter(make<w_t>(m, {4}, 3));
    auto d = ad::scale(x - y, T(1.5)) + x;
    auto s = ad::reduce_sum<"m">(d);  // partial(dp)
    auto z = s * w;                   // w whole where s is pending
    return finish(t, z, x, y, w);
  });
}

TEST_CASE_TEMPLATE("emulated broadcast_add and broadcast_multiply", T, float, double) {
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
    using b_t = tensor<T, M, "m">;
    using c_t = tensor<T, M, "bt">;  // broadcast over the last dim
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 4}, 1));
    auto b = t.parameter(make<b_t>(m, {4}, 2));
    auto c = t.parameter(make<c_t>(m, {5, 3}, 3));
    auto y = ad::broadcast_multiply(ad::broadcast_add(x, b), c);
    return finish(t, y, x, b, c);
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'t', "dp">>>;
    using y_t = tensor<T, M, "bm", layout<split<'m', "dp">>>;  // moved to the layout of x
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 6, 4}, 4));
    auto y = t.parameter(make<y_t>(m, {5, 4}, 5));
    auto z = ad::broadcast_add(ad::broadcast_multiply(x, y), y);
    return finish(t, z, x, y);
  });
  same_on_both<T>([](const auto& m) {  // at 4 ranks, one holds no rows
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
    using b_t = tensor<T, M, "m">;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {3, 2, 4}, 39));
    auto b = t.parameter(make<b_t>(m, {4}, 40));
    return finish(t, ad::softmax<'m'>(ad::broadcast_add(x, b)), x, b);
  });
  same_on_both_2d<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">, split<'m', "tp">>>;
    using b_t = tensor<T, M, "m">;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 6}, 6));
    auto b = t.parameter(make<b_t>(m, {6}, 7));
    return finish(t, ad::broadcast_multiply(x, b), x, b);
  });
}

// gelu's gradient in float: 1 - tanh^2 near the tails magnifies the host's vectorised tanh's
// few ulp.
constexpr double gelu_float_tolerance = 4e-6;

TEST_CASE_TEMPLATE("emulated gelu and dropout", T, float, double) {
  same_on_both<T>(
      [](const auto& m) {
        using M = mesh_of<decltype(m)>;
        using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
        ad::tape t;
        auto x = t.parameter(make<x_t>(m, {5, 3, 4}, 8, 4.0));
        return finish(t, ad::gelu(x), x);
      },
      gelu_float_tolerance);
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'t', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 7, 4}, 9));
    return finish(t, ad::dropout(x, 0.3, 1234), x);
  });
  same_on_both_2d<T>(
      [](const auto& m) {
        using M = mesh_of<decltype(m)>;
        using x_t = tensor<T, M, "btm", layout<split<'m', "dp">, split<'b', "tp">>>;
        ad::tape t;
        auto x = t.parameter(make<x_t>(m, {5, 3, 6}, 10));
        return finish(t, ad::dropout(ad::gelu(x), 0.25, 77), x);
      },
      gelu_float_tolerance);
}

TEST_CASE_TEMPLATE("emulated softmax and log_softmax, contiguous and strided rows", T, float,
                   double) {
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 7}, 11, 3.0));
    return finish(t, ad::softmax<'m'>(x), x);
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'m', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {3, 6, 5}, 12, 3.0));
    return finish(t, ad::softmax<'t'>(x), x);  // rows along t: 5 apart
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 7}, 13, 3.0));
    return finish(t, ad::log_softmax<'m'>(x), x);
  });
  same_on_both_2d<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">, split<'m', "tp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 6, 5}, 14, 3.0));
    return finish(t, ad::log_softmax<'t'>(x), x);
  });
}

TEST_CASE_TEMPLATE("emulated causal_mask and causal_softmax under splits of q and k", T, float,
                   double) {
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "bqk", layout<split<'q', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {2, 7, 7}, 15, 2.0));
    return finish(t, ad::causal_softmax<'q', 'k'>(x), x);
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "bqk", layout<split<'q', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {2, 6, 6}, 16, 2.0));
    // -infinity where masked; softmax gives 0 there, and the gradient passes where kept.
    return finish(t, ad::softmax<'k'>(ad::causal_mask<'q', 'k'>(x)), x);
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "bqk", layout<split<'k', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {2, 7, 7}, 17, 2.0));
    return finish(t, ad::causal_softmax<'q', 'k', 'q'>(x), x);  // along q: strided suffixes
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "bkq", layout<split<'q', "dp">>>;  // k before q: strided rows
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {2, 6, 6}, 18, 2.0));
    return finish(t, ad::causal_softmax<'q', 'k'>(x), x);
  });
}

TEST_CASE_TEMPLATE("emulated layer_norm", T, float, double) {
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
    using g_t = tensor<T, M, "m", layout<split<'m', "dp">>>;  // stored split, used whole
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 8}, 19, 2.0));
    auto gamma = t.parameter(make<g_t>(m, {8}, 20));
    auto beta = t.parameter(make<g_t>(m, {8}, 21));
    return finish(t, ad::layer_norm<'m'>(x, gamma, beta), x, gamma, beta);
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'m', "dp">>>;
    using g_t = tensor<T, M, "t">;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {3, 6, 5}, 22, 2.0));
    auto gamma = t.parameter(make<g_t>(m, {6}, 23));
    auto beta = t.parameter(make<g_t>(m, {6}, 24));
    return finish(t, ad::layer_norm<'t'>(x, gamma, beta), x, gamma, beta);  // strided rows
  });
  same_on_both<T>([](const auto& m) {  // only x wants a gradient
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'t', "dp">>>;
    using g_t = tensor<T, M, "m">;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {2, 5, 6}, 25));
    auto gamma = t.constant(make<g_t>(m, {6}, 26));
    auto beta = t.constant(make<g_t>(m, {6}, 27));
    return finish(t, ad::layer_norm<'m'>(x, gamma, beta), x);
  });
}

// Sums over more than kernels::sum_chunk rows take two passes (chunks of rows, then the
// chunks in order): a bias's gradient, reduce_sum, layer norm's gamma and beta. In float the
// chunked order differs from the host's running sum by rounding.
TEST_CASE_TEMPLATE("emulated sums over many rows (two passes)", T, float, double) {
  same_on_both<T>(
      [](const auto& m) {
        using M = mesh_of<decltype(m)>;
        using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
        using g_t = tensor<T, M, "m">;
        ad::tape t;
        auto x = t.parameter(make<x_t>(m, {16, 90, 6}, 41, 2.0));
        auto bias = t.parameter(make<g_t>(m, {6}, 42));
        auto gamma = t.parameter(make<g_t>(m, {6}, 43));
        auto beta = t.parameter(make<g_t>(m, {6}, 44));
        auto h = ad::layer_norm<'m'>(ad::broadcast_add(x, bias), gamma, beta);
        auto s = ad::reduce_sum<"m">(h);  // pending over dp
        return finish(t, s, x, bias, gamma, beta);
      },
      2e-5);
}

TEST_CASE_TEMPLATE("emulated embedding, with split ids and a split table", T, float, double) {
  const std::array<std::size_t, 2> ie{5, 3}, te{7, 4};
  const ids_values ids = ids_pattern(15, 7);  // repeated ids: their rows' gradients add up
  same_on_both<T>([&](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using ids_t = tensor<std::int32_t, M, "bt", layout<split<'b', "dp">>>;
    using table_t = tensor<T, M, "vm">;
    ad::tape t;
    auto table = t.parameter(make<table_t>(m, te, 28));
    return finish(t, ad::embedding<"btm">(ids_t::from_global(m, ie, ids), table), table);
  });
  same_on_both<T>([&](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using ids_t = tensor<std::int32_t, M, "bt", layout<split<'t', "dp">>>;
    using table_t = tensor<T, M, "vm", layout<split<'m', "dp">>>;  // gathered: ids keep dp
    ad::tape t;
    auto table = t.parameter(make<table_t>(m, te, 29));
    return finish(t, ad::embedding<"btm">(ids_t::from_global(m, ie, ids), table), table);
  });
  same_on_both_2d<T>([&](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using ids_t = tensor<std::int32_t, M, "bt", layout<split<'b', "dp">>>;
    using table_t = tensor<T, M, "vm", layout<split<'m', "tp">>>;
    ad::tape t;
    auto table = t.parameter(make<table_t>(m, te, 30));
    return finish(t, ad::embedding<"btm">(ids_t::from_global(m, ie, ids), table), table);
  });
}

TEST_CASE_TEMPLATE("emulated cross_entropy, rows split, and along a dim that is not the last", T,
                   float, double) {
  const std::array<std::size_t, 2> te{5, 3};
  const ids_values targets = ids_pattern(15, 7);
  same_on_both<T>([&](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using logits_t = tensor<T, M, "btv", layout<split<'b', "dp">>>;
    using targets_t = tensor<std::int32_t, M, "bt">;  // sliced to the logits' rows
    ad::tape t;
    auto logits = t.parameter(make<logits_t>(m, {5, 3, 7}, 31, 3.0));
    return finish(t, ad::cross_entropy<'v'>(logits, targets_t::from_global(m, te, targets)),
                  logits);
  });
  same_on_both<T>([&](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using logits_t = tensor<T, M, "bvt", layout<split<'t', "dp">>>;             // rows 3 apart
    using targets_t = tensor<std::int32_t, M, "bt", layout<split<'b', "dp">>>;  // moved
    ad::tape t;
    auto logits = t.parameter(make<logits_t>(m, {5, 7, 3}, 32, 3.0));
    return finish(t, ad::cross_entropy<'v'>(logits, targets_t::from_global(m, te, targets)),
                  logits);
  });
  same_on_both_2d<T>([&](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using logits_t = tensor<T, M, "btv", layout<split<'b', "dp">, split<'t', "tp">>>;
    using targets_t = tensor<std::int32_t, M, "bt", layout<split<'b', "dp">>>;
    ad::tape t;
    auto logits = t.parameter(make<logits_t>(m, {5, 3, 7}, 33, 3.0));
    return finish(t, ad::cross_entropy<'v'>(logits, targets_t::from_global(m, te, targets)),
                  logits);
  });
}

TEST_CASE_TEMPLATE("emulated reduce_sum and mean", T, float, double) {
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 4}, 34));
    return finish(t, ad::reduce_sum<"m">(x), x);  // partial(dp)
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'t', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 6, 4}, 35));
    return finish(t, ad::reduce_sum<"bt">(ad::reduce_sum<"btm">(x)), x);  // over the last dim
  });
  same_on_both_2d<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">, split<'m', "tp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 6}, 36));
    return finish(t, ad::reduce_sum<"bm">(x), x);
  });
  same_on_both<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'b', "dp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 4}, 37));
    return finish(t, ad::mean(x), x);
  });
  same_on_both_2d<T>([](const auto& m) {
    using M = mesh_of<decltype(m)>;
    using x_t = tensor<T, M, "btm", layout<split<'t', "tp">>>;
    ad::tape t;
    auto x = t.parameter(make<x_t>(m, {5, 3, 4}, 38));
    return finish(t, ad::mean(ad::reduce_sum<"bm">(x)), x);  // mean of a sum pending over tp
  });
}

TEST_CASE("emulated: a bad id or target throws the host's shape_error") {
  mesh<"dp"> host(MPI_COMM_WORLD, {world_size()});
  ZEST_TEST_DEVICE_MESH<"dp"> emulated(MPI_COMM_WORLD, {world_size()});
  const auto lookup = [](const auto& m, std::int32_t bad) {
    using M = mesh_of<decltype(m)>;
    using ids_t = tensor<std::int32_t, M, "bt">;
    using table_t = tensor<double, M, "vm">;
    ids_values ids = ids_pattern(6, 4);
    ids[4] = bad;
    ad::tape t;
    auto table = t.parameter(make<table_t>(m, {4, 3}, 1));
    return error_of([&] { (void)ad::embedding<"btm">(ids_t::from_global(m, {2, 3}, ids), table); });
  };
  const auto loss = [](const auto& m, std::int32_t bad) {
    using M = mesh_of<decltype(m)>;
    using logits_t = tensor<float, M, "btv">;
    using targets_t = tensor<std::int32_t, M, "bt">;
    ids_values targets = ids_pattern(6, 5);
    targets[5] = bad;
    ad::tape t;
    auto logits = t.parameter(make<logits_t>(m, {2, 3, 5}, 2));
    return error_of([&] {
      (void)ad::cross_entropy<'v'>(logits, targets_t::from_global(m, {2, 3}, targets));
    });
  };
  for (const std::int32_t bad : {-1, 4, 1000}) {
    CAPTURE(bad);
    const std::string want = lookup(host, bad);
    CHECK(want.find("embedding: id") != std::string::npos);
    CHECK(lookup(emulated, bad) == want);
  }
  for (const std::int32_t bad : {-2, 5}) {
    CAPTURE(bad);
    const std::string want = loss(host, bad);
    CHECK(want.find("cross_entropy: target") != std::string::npos);
    CHECK(loss(emulated, bad) == want);
  }
}

}  // namespace
