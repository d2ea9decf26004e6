// The nonlinear and broadcasting operations of the tape (zest/autodiff/ops.hpp): values
// against hand-written single-rank references, gradients of loss = sum(op(...) * R) against
// central differences (double) of the sharded forward, on mesh<"dp"> (replicated, split over
// dp) and on each 2-D mesh<"dp", "tp"> shape (a second split over tp), with the layouts of
// results and the run-time errors; dropout's output does not depend on the number of ranks;
// a small model in float agrees with the same model in double.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/ops.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

using mesh1 = mesh<"dp">;
using mesh2 = mesh<"dp", "tp">;
using globals = std::vector<std::vector<double>>;
constexpr double inf = std::numeric_limits<double>::infinity();

template <class V>
std::vector<double> as_double(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

// One run of a sharded forward: the loss on every rank, and (for the unperturbed run) the
// operation's value and the inputs' gradients, all as global arrays.
struct run_result {
  double loss = 0;
  std::vector<double> value;
  globals grads;
};

template <class S, class... P>
run_result finish_loss(const ad::variable<S>& loss, bool grads, std::vector<double> value,
                       const ad::variable<P>&... params) {
  run_result out;
  out.loss = static_cast<double>(to_global(loss.value())[0]);
  if (!grads) return out;
  out.value = std::move(value);
  ad::backward(loss);
  (out.grads.push_back(as_double(to_global(params.grad()))), ...);
  return out;
}

// loss = sum(y * R), R a fixed replicated tensor.
template <class Y, class... P>
run_result finish(ad::tape& t, const ad::variable<Y>& y, bool grads,
                  const ad::variable<P>&... params) {
  using mesh_t = typename Y::mesh_type;
  using r_t =
      basic_tensor<typename Y::value_type, mesh_t, Y::dims, replicated_layout(mesh_t::axis_count)>;
  const auto rg = global_values(y.value().extents(), 99);
  const std::vector<typename Y::value_type> rv(rg.begin(), rg.end());
  auto r = t.constant(r_t::from_global(y.value().mesh(), y.value().extents(), rv));
  return finish_loss(ad::sum(y * r), grads,
                     grads ? as_double(to_global(y.value())) : std::vector<double>{}, params...);
}

// The value against `want`, then each input's gradient against central differences of the
// loss, every rank perturbing the same global element.
template <class Run>
void check_op(Run run, const globals& in, const std::vector<double>& want) {
  const run_result base = run(in, true);
  CHECK(relative_error(base.value, want) < 1e-12);
  REQUIRE(base.grads.size() == in.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < in.size(); ++i) {
    CAPTURE(i);
    REQUIRE(base.grads[i].size() == in[i].size());
    double worst = 0, scale = 1;
    for (std::size_t e = 0; e < in[i].size(); ++e) {
      globals plus = in, minus = in;
      plus[i][e] += h;
      minus[i][e] -= h;
      const double fd = (run(plus, false).loss - run(minus, false).loss) / (2 * h);
      worst = std::max(worst, std::abs(fd - base.grads[i][e]));
      scale = std::max(scale, std::abs(fd));
    }
    CHECK(worst / scale < 1e-6);
  }
}

// Row-major strides of global extents.
template <std::size_t R>
std::array<std::size_t, R> strides_of(const std::array<std::size_t, R>& e) {
  std::array<std::size_t, R> s{};
  std::size_t n = 1;
  for (std::size_t k = R; k-- > 0;) {
    s[k] = n;
    n *= e[k];
  }
  return s;
}
// The multi-index of flat index f.
template <std::size_t R>
std::array<std::size_t, R> unflatten(std::size_t f, const std::array<std::size_t, R>& e) {
  std::array<std::size_t, R> i{};
  for (std::size_t k = R; k-- > 0;) {
    i[k] = f % e[k];
    f /= e[k];
  }
  return i;
}
// The flat index, in a tensor with dims `small`, of the element at index i of `big`.
template <std::size_t R>
std::size_t sub_flat(std::string_view big, const std::array<std::size_t, R>& i,
                     const std::array<std::size_t, R>& e, std::string_view small) {
  std::size_t f = 0;
  for (char c : small) {
    const std::size_t k = big.find(c);
    f = f * e[k] + i[k];
  }
  return f;
}
template <class Extents>
std::size_t count_of(const Extents& e) {
  std::size_t n = 1;
  for (auto v : e) n *= v;
  return n;
}

// The naive rows of a global array around dim d: calls f(indices of the row's elements).
template <std::size_t R, class F>
void reference_rows(const std::array<std::size_t, R>& e, std::size_t d, F f) {
  const auto s = strides_of(e);
  for (std::size_t flat = 0; flat < count_of(e); ++flat) {
    if (unflatten(flat, e)[d] != 0) continue;
    std::vector<std::size_t> row;
    for (std::size_t j = 0; j < e[d]; ++j) row.push_back(flat + j * s[d]);
    f(row);
  }
}

std::vector<double> reference_softmax(const std::vector<double>& x,
                                      const std::array<std::size_t, 3>& e, std::size_t d,
                                      bool log) {
  std::vector<double> y(x.size());
  reference_rows(e, d, [&](const std::vector<std::size_t>& row) {
    double m = -inf, sum = 0;
    for (auto i : row) m = std::max(m, x[i]);
    for (auto i : row) sum += std::exp(x[i] - m);
    for (auto i : row) y[i] = log ? x[i] - m - std::log(sum) : std::exp(x[i] - m) / sum;
  });
  return y;
}

// x "bqk" with -infinity where k > q.
std::vector<double> reference_mask(std::vector<double> x, const std::array<std::size_t, 3>& e) {
  for (std::size_t f = 0; f < x.size(); ++f) {
    const auto i = unflatten(f, e);
    if (i[2] > i[1]) x[f] = -inf;
  }
  return x;
}

// ---------------------------------------------------------------------------------------
// 1, 2. broadcast_add, broadcast_multiply.

template <bool Multiply, fixed_string YDims, class XL, class YL, class Mesh>
void check_broadcast(const Mesh& m) {
  using x_t = tensor<double, Mesh, "btm", XL>;
  using y_t = tensor<double, Mesh, YDims, YL>;
  const std::array<std::size_t, 3> xe{5, 3, 4};
  typename y_t::extents_type ye{};
  for (std::size_t k = 0; k < y_t::rank; ++k) ye[k] = xe[std::string_view("btm").find(YDims[k])];
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, xe, in[0]));
    auto y = t.parameter(y_t::from_global(m, ye, in[1]));
    auto z = [&] {
      if constexpr (Multiply) {
        return ad::broadcast_multiply(x, y);
      } else {
        return ad::broadcast_add(x, y);
      }
    }();
    static_assert(std::is_same_v<typename decltype(z)::tensor_type, x_t>);
    return finish(t, z, grads, x, y);
  };
  const globals in{global_values(xe, 1), global_values(ye, 2)};
  std::vector<double> want(in[0].size());
  for (std::size_t f = 0; f < want.size(); ++f) {
    const double b = in[1][sub_flat("btm", unflatten(f, xe), xe, view_of<YDims>)];
    want[f] = Multiply ? in[0][f] * b : in[0][f] + b;
  }
  check_op(run, in, want);
}

template <bool Multiply>
void check_broadcasts() {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_broadcast<Multiply, "m", layout<>, layout<>>(m);
  check_broadcast<Multiply, "m", layout<split<'b', "dp">>, layout<>>(m);
  check_broadcast<Multiply, "bt", layout<split<'b', "dp">>, layout<>>(m);  // broadcast over m
  check_broadcast<Multiply, "bm", layout<split<'t', "dp">>, layout<split<'m', "dp">>>(m);
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_broadcast<Multiply, "m", layout<split<'b', "dp">, split<'m', "tp">>, layout<>>(m2);
  }
}

TEST_CASE("broadcast_add: values and gradients") { check_broadcasts<false>(); }
TEST_CASE("broadcast_multiply: values and gradients") { check_broadcasts<true>(); }

TEST_CASE(
    "broadcast_add: a bias on split(b:dp) activations gets a partial(dp) gradient, no "
    "collective") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  using x_t = tensor<double, mesh1, "btm", layout<split<'b', "dp">>>;
  using b_t = tensor<double, mesh1, "m">;
  using r_t = tensor<double, mesh1, "btm">;
  ad::tape t;
  auto x = t.parameter(make_tensor<x_t>(m, {5, 3, 4}, 1));
  auto bias = t.parameter(make_tensor<b_t>(m, {4}, 2));
  auto r = t.constant(make_tensor<r_t>(m, {5, 3, 4}, 3));
  m.reset_stats();
  auto loss = ad::sum(ad::broadcast_add(x, bias) * r);
  ad::backward(loss);
  CHECK(m.stats().calls() == 0);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(bias.grad())>,
                               tensor<double, mesh1, "m", layout<partial<"dp">>>>);
  // The bias gradient is the sum of r over b and t.
  const auto rg = global_values(std::array<std::size_t, 3>{5, 3, 4}, 3);
  std::vector<double> want(4, 0.0);
  for (std::size_t f = 0; f < rg.size(); ++f) want[f % 4] += rg[f];
  CHECK(relative_error(to_global(bias.grad()), want) < 1e-12);
}

// ---------------------------------------------------------------------------------------
// 3. gelu.

template <class XL, class Mesh>
void check_gelu(const Mesh& m) {
  using x_t = tensor<double, Mesh, "btm", XL>;
  const std::array<std::size_t, 3> xe{5, 3, 4};
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, xe, in[0]));
    auto y = ad::gelu(x);
    static_assert(std::is_same_v<typename decltype(y)::tensor_type, x_t>);
    return finish(t, y, grads, x);
  };
  globals in{global_values(xe, 4)};
  for (auto& v : in[0]) v *= 4;  // reach both tails
  std::vector<double> want;
  for (double v : in[0]) {
    want.push_back(0.5 * v *
                   (1 + std::tanh(std::sqrt(2 / 3.141592653589793) * (v + 0.044715 * v * v * v))));
  }
  check_op(run, in, want);
}

TEST_CASE("gelu: values and gradients") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_gelu<layout<>>(m);
  check_gelu<layout<split<'b', "dp">>>(m);
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_gelu<layout<split<'b', "dp">, split<'m', "tp">>>(m2);
  }
}

// ---------------------------------------------------------------------------------------
// 4. softmax, log_softmax.

template <bool Log, char D, class XL, class Mesh>
void check_softmax(const Mesh& m) {
  using x_t = tensor<double, Mesh, "bqk", XL>;
  const std::array<std::size_t, 3> xe{3, 4, 5};
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, xe, in[0]));
    auto y = [&] {
      if constexpr (Log) {
        return ad::log_softmax<D>(x);
      } else {
        return ad::softmax<D>(x);
      }
    }();
    static_assert(std::is_same_v<typename decltype(y)::tensor_type, x_t>);
    return finish(t, y, grads, x);
  };
  globals in{global_values(xe, 5)};
  for (auto& v : in[0]) v *= 3;
  check_op(run, in, reference_softmax(in[0], xe, x_t::dim_index(D), Log));
}

template <bool Log>
void check_softmaxes() {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_softmax<Log, 'k', layout<>>(m);
  check_softmax<Log, 'k', layout<split<'b', "dp">>>(m);
  check_softmax<Log, 'q', layout<split<'k', "dp">>>(m);  // rows along a middle dim
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_softmax<Log, 'k', layout<split<'b', "dp">, split<'q', "tp">>>(m2);
  }
}

TEST_CASE("softmax: values and gradients") { check_softmaxes<false>(); }
TEST_CASE("log_softmax: values and gradients") { check_softmaxes<true>(); }

// ---------------------------------------------------------------------------------------
// 5. causal_mask, causal_softmax.

// Which composition of the mask is checked.
enum class causal { mask_then_softmax, fused, fused_along_q, mask_then_log_softmax };

template <causal Kind, class XL, class Mesh>
void check_causal(const Mesh& m) {
  using x_t = tensor<double, Mesh, "bqk", XL>;
  const std::array<std::size_t, 3> xe{3, 5, 4};  // k <= q: every row along q keeps one entry
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, xe, in[0]));
    auto y = [&] {
      if constexpr (Kind == causal::mask_then_softmax) {
        return ad::softmax<'k'>(ad::causal_mask<'q', 'k'>(x));
      } else if constexpr (Kind == causal::fused) {
        return ad::causal_softmax<'q', 'k'>(x);
      } else if constexpr (Kind == causal::fused_along_q) {
        return ad::causal_softmax<'q', 'k', 'q'>(x);
      } else {
        // exp(log_softmax) keeps -infinity out of the loss.
        auto l = ad::log_softmax<'k'>(ad::causal_mask<'q', 'k'>(x));
        return ad::softmax<'k'>(l);
      }
    }();
    static_assert(std::is_same_v<typename decltype(y)::tensor_type, x_t>);
    return finish(t, y, grads, x);
  };
  globals in{global_values(xe, 6)};
  const auto masked = reference_mask(in[0], xe);
  std::vector<double> want =
      reference_softmax(masked, xe, Kind == causal::fused_along_q ? 1 : 2, false);
  if (Kind == causal::mask_then_log_softmax) {
    want = reference_softmax(reference_softmax(masked, xe, 2, true), xe, 2, false);
  }
  check_op(run, in, want);
}

TEST_CASE("causal_mask and causal_softmax: values and gradients under splits of q and k") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_causal<causal::mask_then_softmax, layout<>>(m);
  check_causal<causal::fused, layout<>>(m);
  check_causal<causal::fused_along_q, layout<>>(m);
  check_causal<causal::mask_then_softmax, layout<split<'q', "dp">>>(m);  // offsets along q
  check_causal<causal::fused, layout<split<'q', "dp">>>(m);
  check_causal<causal::fused_along_q, layout<split<'k', "dp">>>(m);
  check_causal<causal::mask_then_log_softmax, layout<split<'b', "dp">>>(m);
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_causal<causal::fused, layout<split<'b', "dp">, split<'q', "tp">>>(m2);
    check_causal<causal::fused_along_q, layout<split<'b', "dp">, split<'k', "tp">>>(m2);
  }
}

template <class XL, class Mesh>
void check_mask_backward(const Mesh& m) {
  using x_t = tensor<double, Mesh, "bqk", XL>;
  const std::array<std::size_t, 3> xe{2, 5, 6};
  const auto xg = global_values(xe, 7);
  ad::tape t;
  auto x = t.parameter(x_t::from_global(m, xe, xg));
  auto y = ad::causal_mask<'q', 'k'>(x);
  const auto got = to_global(y.value());
  const auto want = reference_mask(xg, xe);
  REQUIRE(got.size() == want.size());
  for (std::size_t f = 0; f < want.size(); ++f) CHECK(got[f] == want[f]);
  // Seed dy = 1 by hand and run the recorded step.
  y.node()->grad.emplace(ad::dual_tensor<x_t>::generate(m, xe, [](const auto&) { return 1.0; }));
  t.run_backward();
  const auto g = to_global(x.grad());
  for (std::size_t f = 0; f < want.size(); ++f) CHECK(g[f] == (std::isinf(want[f]) ? 0.0 : 1.0));
}

TEST_CASE("causal_mask: -infinity above the diagonal, its gradient passes only where kept") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_mask_backward<layout<split<'k', "dp">>>(m);
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_mask_backward<layout<split<'q', "dp">, split<'k', "tp">>>(m2);
  }
}

TEST_CASE("causal_mask and causal_softmax with k before q: strided rows, q in the inner dims") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  using x_t = tensor<double, mesh1, "kbq", layout<split<'q', "dp">>>;
  const std::array<std::size_t, 3> xe{4, 2, 5};
  const auto xg = global_values(xe, 17);
  std::vector<double> masked = xg;
  for (std::size_t f = 0; f < xg.size(); ++f) {
    const auto i = unflatten(f, xe);
    if (i[0] > i[2]) masked[f] = -inf;
  }
  ad::tape t;
  auto x = t.constant(x_t::from_global(m, xe, xg));
  const auto got = to_global(ad::causal_mask<'q', 'k'>(x).value());
  REQUIRE(got.size() == masked.size());
  for (std::size_t f = 0; f < masked.size(); ++f) CHECK(got[f] == masked[f]);
  CHECK(relative_error(to_global(ad::causal_softmax<'q', 'k'>(x).value()),
                       reference_softmax(masked, xe, 0, false)) < 1e-14);
}

TEST_CASE("causal_softmax equals softmax(causal_mask(x))") {
  for (const auto& shape : mesh_shapes()) {
    mesh2 m(MPI_COMM_WORLD, shape);
    using x_t = tensor<double, mesh2, "bhqk", layout<split<'b', "dp">, split<'q', "tp">>>;
    const std::array<std::size_t, 4> xe{3, 2, 7, 7};
    ad::tape t;
    auto x = t.constant(make_tensor<x_t>(m, xe, 8));
    const auto fused = to_global(ad::causal_softmax<'q', 'k'>(x).value());
    const auto composed = to_global(ad::softmax<'k'>(ad::causal_mask<'q', 'k'>(x)).value());
    CHECK(relative_error(fused, as_double(composed)) < 1e-15);
  }
}

// ---------------------------------------------------------------------------------------
// 6. layer_norm.

template <char D>
constexpr fixed_string<2> dim_name() {
  fixed_string<2> s;
  s.set(0, D);
  return s;
}

template <char D, class XL, class GL, class Mesh>
void check_layer_norm(const Mesh& m) {
  using x_t = tensor<double, Mesh, "btm", XL>;
  using g_t = tensor<double, Mesh, dim_name<D>(), GL>;
  const std::array<std::size_t, 3> xe{5, 3, 6};
  const std::size_t d = x_t::dim_index(D);
  const std::array<std::size_t, 1> ge{xe[d]};
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, xe, in[0]));
    auto gamma = t.parameter(g_t::from_global(m, ge, in[1]));
    auto beta = t.parameter(g_t::from_global(m, ge, in[2]));
    auto y = ad::layer_norm<D>(x, gamma, beta);
    static_assert(std::is_same_v<typename decltype(y)::tensor_type, x_t>);
    return finish(t, y, grads, x, gamma, beta);
  };
  const globals in{global_values(xe, 9), global_values(ge, 10), global_values(ge, 11)};
  std::vector<double> want(in[0].size());
  reference_rows(xe, d, [&](const std::vector<std::size_t>& row) {
    double mu = 0, var = 0;
    for (auto i : row) mu += in[0][i];
    mu /= static_cast<double>(row.size());
    for (auto i : row) var += (in[0][i] - mu) * (in[0][i] - mu);
    var /= static_cast<double>(row.size());
    for (std::size_t j = 0; j < row.size(); ++j) {
      want[row[j]] = (in[0][row[j]] - mu) / std::sqrt(var + 1e-5) * in[1][j] + in[2][j];
    }
  });
  check_op(run, in, want);
}

TEST_CASE("layer_norm: values and gradients") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_layer_norm<'m', layout<>, layout<>>(m);
  check_layer_norm<'m', layout<split<'b', "dp">>, layout<>>(m);
  check_layer_norm<'t', layout<split<'b', "dp">>, layout<>>(m);  // rows along a middle dim
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    // gamma and beta stored split over dp (ZeRO-3): gathered on use, gradients reduce-scattered.
    check_layer_norm<'m', layout<split<'b', "dp">, split<'t', "tp">>, layout<split<'m', "dp">>>(m2);
  }
}

// ---------------------------------------------------------------------------------------
// 7. embedding.

template <class IL, class TL, class OutLayout, class Mesh>
void check_embedding(const Mesh& m) {
  using ids_t = tensor<std::int32_t, Mesh, "bt", IL>;
  using table_t = tensor<double, Mesh, "vm", TL>;
  const std::array<std::size_t, 2> ie{5, 3}, te{7, 4};
  std::vector<std::int32_t> ids_g(count_of(ie));
  for (std::size_t i = 0; i < ids_g.size(); ++i)
    ids_g[i] = static_cast<std::int32_t>((i * 5 + 1) % 6);
  const auto ids = ids_t::from_global(m, ie, ids_g);
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto table = t.parameter(table_t::from_global(m, te, in[0]));
    auto y = ad::embedding<"btm">(ids, table);
    static_assert(has_layout<typename decltype(y)::tensor_type, OutLayout>);
    return finish(t, y, grads, table);
  };
  const globals in{global_values(te, 12)};
  std::vector<double> want;
  for (auto id : ids_g) {
    for (std::size_t j = 0; j < te[1]; ++j)
      want.push_back(in[0][static_cast<std::size_t>(id) * te[1] + j]);
  }
  check_op(run, in, want);
}

TEST_CASE("embedding: values and gradients") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_embedding<layout<>, layout<>, layout<>>(m);
  check_embedding<layout<split<'b', "dp">>, layout<>, layout<split<'b', "dp">>>(m);
  // Both want dp: the ids keep it, the table is gathered.
  check_embedding<layout<split<'t', "dp">>, layout<split<'m', "dp">>, layout<split<'t', "dp">>>(m);
  check_embedding<layout<>, layout<split<'m', "dp">>, layout<split<'m', "dp">>>(m);
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_embedding<layout<split<'b', "dp">>, layout<split<'m', "tp">>,
                    layout<split<'b', "dp">, split<'m', "tp">>>(m2);
  }
}

TEST_CASE("embedding: a vocabulary-parallel table (rows split, unevenly) gives a pending sum") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_embedding<layout<>, layout<split<'v', "dp">>, layout<partial<"dp">>>(m);
  // Both split dp: the ids keep it, the table's rows are gathered.
  check_embedding<layout<split<'b', "dp">>, layout<split<'v', "dp">>, layout<split<'b', "dp">>>(m);
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_embedding<layout<split<'b', "dp">>, layout<split<'v', "tp">>,
                    layout<split<'b', "dp">, partial<"tp">>>(m2);
    check_embedding<layout<split<'t', "dp">>, layout<split<'v', "tp">, split<'m', "dp">>,
                    layout<split<'t', "dp">, partial<"tp">>>(m2);
    check_embedding<layout<>, layout<split<'v', "dp", "tp">>, layout<partial<"dp">, partial<"tp">>>(
        m2);
  }
}

// ---------------------------------------------------------------------------------------
// 8. cross_entropy.

// SL: the loss's layout (pending where the logits' token dims are split, replicated where V is).
template <class LL, class TL, class SL = void, class Mesh>
void check_cross_entropy(const Mesh& m) {
  using logits_t = tensor<double, Mesh, "btv", LL>;
  using targets_t = tensor<std::int32_t, Mesh, "bt", TL>;
  const std::array<std::size_t, 3> le{5, 3, 7};
  const std::array<std::size_t, 2> te{5, 3};
  std::vector<std::int32_t> tg(count_of(te));
  for (std::size_t i = 0; i < tg.size(); ++i) tg[i] = static_cast<std::int32_t>((i * 3 + 2) % 7);
  const auto targets = targets_t::from_global(m, te, tg);
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto logits = t.parameter(logits_t::from_global(m, le, in[0]));
    auto ce = ad::cross_entropy<'v'>(logits, targets);
    using s_t = typename decltype(ce)::tensor_type;
    static_assert(s_t::rank == 0);
    if constexpr (std::is_void_v<SL>) {
      static_assert(s_t::layout == ad::detail::scalar_sum_layout(logits_t::layout));
    } else {
      static_assert(has_layout<s_t, SL>);
    }
    const double value = to_global(ce.value())[0];
    return finish_loss(ad::scale(ce, 1.7), grads, {value}, logits);
  };
  globals in{global_values(le, 13)};
  for (auto& v : in[0]) v *= 3;
  double total = 0;
  for (std::size_t r = 0; r < tg.size(); ++r) {
    double m_ = -inf, sum = 0;
    for (std::size_t j = 0; j < 7; ++j) m_ = std::max(m_, in[0][r * 7 + j]);
    for (std::size_t j = 0; j < 7; ++j) sum += std::exp(in[0][r * 7 + j] - m_);
    total += m_ + std::log(sum) - in[0][r * 7 + static_cast<std::size_t>(tg[r])];
  }
  check_op(run, in, {total / static_cast<double>(tg.size())});
}

TEST_CASE("cross_entropy: values and gradients") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_cross_entropy<layout<>, layout<>>(m);
  check_cross_entropy<layout<split<'b', "dp">>, layout<>>(m);  // targets sliced to match
  check_cross_entropy<layout<split<'t', "dp">>, layout<split<'b', "dp">>>(m);  // moved to match
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_cross_entropy<layout<split<'b', "dp">, split<'t', "tp">>, layout<split<'b', "dp">>>(m2);
  }
  // Vocabulary-parallel logits (V split, unevenly: 7 classes): the loss is replicated there.
  check_cross_entropy<layout<split<'v', "dp">>, layout<>, layout<>>(m);
  check_cross_entropy<layout<split<'v', "dp">>, layout<split<'b', "dp">>, layout<>>(m);
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_cross_entropy<layout<split<'b', "dp">, split<'v', "tp">>, layout<split<'b', "dp">>,
                        layout<partial<"dp">>>(m2);
    check_cross_entropy<layout<split<'t', "tp">, split<'v', "dp">>, layout<>,
                        layout<partial<"tp">>>(m2);
    check_cross_entropy<layout<split<'v', "tp", "dp">>, layout<>, layout<>>(m2);
  }
  static_assert(
      std::is_same_v<
          typename decltype(ad::cross_entropy<'v'>(
              std::declval<ad::variable<tensor<double, mesh1, "btv", layout<split<'b', "dp">>>>&>(),
              std::declval<tensor<std::int32_t, mesh1, "bt">&>()))::tensor_type,
          tensor<double, mesh1, "", layout<partial<"dp">>>>);
}

// ---------------------------------------------------------------------------------------
// 9. dropout.

// dropout on a one-process mesh over the whole tensor: the reference the sharded runs match.
std::vector<double> single_rank_dropout(const std::array<std::size_t, 3>& e,
                                        const std::vector<double>& x, double p,
                                        std::uint64_t seed) {
  local_mesh<"dp"> one;
  using t_t = tensor<double, local_mesh<"dp">, "btm">;
  ad::tape t;
  auto v = t.constant(t_t::from_global(one, e, x));
  return as_double(ad::dropout(v, p, seed).value().local());
}

template <class XL, class Mesh>
void check_dropout(const Mesh& m) {
  using x_t = tensor<double, Mesh, "btm", XL>;
  const std::array<std::size_t, 3> xe{5, 3, 4};
  const double p = 0.3;
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, xe, in[0]));
    auto y = ad::dropout(x, p, 1234);
    static_assert(std::is_same_v<typename decltype(y)::tensor_type, x_t>);
    return finish(t, y, grads, x);
  };
  const globals in{global_values(xe, 14)};
  const auto want = single_rank_dropout(xe, in[0], p, 1234);
  std::size_t kept = 0;
  for (std::size_t f = 0; f < want.size(); ++f) {
    const bool keep = want[f] != 0;
    kept += keep ? 1 : 0;
    if (keep) CHECK(want[f] == doctest::Approx(in[0][f] / (1 - p)).epsilon(1e-14));
  }
  CHECK(kept > 0);
  CHECK(kept < want.size());
  check_op(run, in, want);
}

TEST_CASE("dropout: the same mask at any number of ranks and layout; gradients") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_dropout<layout<>>(m);
  check_dropout<layout<split<'b', "dp">>>(m);
  check_dropout<layout<partial<"dp">>>(m);  // linear: a pending sum is fine
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_dropout<layout<split<'b', "dp">, split<'m', "tp">>>(m2);
  }
}

TEST_CASE("dropout: keeps about 1 - p, p == 0 is the identity, p outside [0, 1) throws") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  using x_t = tensor<double, mesh1, "btm", layout<split<'t', "dp">>>;
  const std::array<std::size_t, 3> xe{10, 40, 25};
  ad::tape t;
  auto x = t.parameter(x_t::generate(m, xe, [](const auto&) { return 1.0; }));
  const auto y = to_global(ad::dropout(x, 0.25, 7).value());
  const auto kept = static_cast<double>(std::count(y.begin(), y.end(), 1 / 0.75));
  CHECK(static_cast<double>(std::count(y.begin(), y.end(), 0.0)) + kept ==
        static_cast<double>(y.size()));
  CHECK(std::abs(kept / static_cast<double>(y.size()) - 0.75) < 0.02);
  // Another seed, another mask.
  CHECK(to_global(ad::dropout(x, 0.25, 8).value()) != y);

  auto same = ad::dropout(x, 0.0, 7);
  CHECK(to_global(same.value()) == to_global(x.value()));
  auto loss = ad::sum(ad::scale(same, 3.0));
  ad::backward(loss);
  for (double g : to_global(x.grad())) CHECK(g == 3.0);

  CHECK_THROWS_AS(ad::dropout(x, 1.0, 7), shape_error);
  CHECK_THROWS_AS(ad::dropout(x, -0.1, 7), shape_error);
  CHECK_THROWS_AS(ad::dropout(x, std::numeric_limits<double>::quiet_NaN(), 7), shape_error);
}

// ---------------------------------------------------------------------------------------
// 10. reduce_sum, mean.

template <fixed_string OutDims, class XL, class OutLayout, class Mesh>
void check_reduce_sum(const Mesh& m) {
  using x_t = tensor<double, Mesh, "btm", XL>;
  const std::array<std::size_t, 3> xe{5, 3, 4};
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, xe, in[0]));
    auto y = ad::reduce_sum<OutDims>(x);
    static_assert(has_layout<typename decltype(y)::tensor_type, OutLayout>);
    return finish(t, y, grads, x);
  };
  const globals in{global_values(xe, 15)};
  std::size_t out_count = 1;
  for (char c : view_of<OutDims>) out_count *= xe[std::string_view("btm").find(c)];
  std::vector<double> want(out_count, 0.0);
  for (std::size_t f = 0; f < in[0].size(); ++f) {
    want[sub_flat("btm", unflatten(f, xe), xe, view_of<OutDims>)] += in[0][f];
  }
  check_op(run, in, want);
}

template <class XL, class Mesh>
void check_mean(const Mesh& m) {
  using x_t = tensor<double, Mesh, "btm", XL>;
  const std::array<std::size_t, 3> xe{5, 3, 4};
  auto run = [&](const globals& in, bool grads) {
    ad::tape t;
    auto x = t.parameter(x_t::from_global(m, xe, in[0]));
    auto y = ad::mean(x);
    static_assert(std::is_same_v<typename decltype(y)::tensor_type,
                                 typename decltype(ad::sum(x))::tensor_type>);
    return finish_loss(ad::scale(y, 2.5), grads, as_double(to_global(y.value())), x);
  };
  const globals in{global_values(xe, 16)};
  double total = 0;
  for (double v : in[0]) total += v;
  check_op(run, in, {total / static_cast<double>(in[0].size())});
}

TEST_CASE("reduce_sum and mean: values, gradients, layouts") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  check_reduce_sum<"m", layout<>, layout<>>(m);
  check_reduce_sum<"m", layout<split<'b', "dp">>, layout<partial<"dp">>>(m);
  check_reduce_sum<"bt", layout<split<'b', "dp">>, layout<split<'b', "dp">>>(m);
  check_reduce_sum<"bm", layout<partial<"dp">>, layout<partial<"dp">>>(m);
  check_reduce_sum<"", layout<split<'t', "dp">>, layout<partial<"dp">>>(m);
  check_mean<layout<split<'b', "dp">>>(m);
  check_mean<layout<partial<"dp">>>(m);
  for (const auto& shape : mesh_shapes()) {
    mesh2 m2(MPI_COMM_WORLD, shape);
    CAPTURE(m2.describe());
    check_reduce_sum<"bm", layout<split<'b', "dp">, split<'m', "tp">>,
                     layout<split<'b', "dp">, split<'m', "tp">>>(m2);
    check_reduce_sum<"t", layout<split<'b', "dp">, split<'m', "tp">>,
                     layout<partial<"dp">, partial<"tp">>>(m2);
    check_mean<layout<split<'b', "dp">, split<'m', "tp">>>(m2);
  }
}

// ---------------------------------------------------------------------------------------
// Run-time errors: every rank holds the offending element (replicated data), so every rank
// throws.

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const shape_error& e) {
    return e.what();
  }
  return "";
}
bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

TEST_CASE("run-time errors name the operation, the dims and the extents") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  using x_t = tensor<double, mesh1, "btm", layout<split<'b', "dp">>>;
  using v_t = tensor<double, mesh1, "m">;
  ad::tape t;
  auto x = t.parameter(make_tensor<x_t>(m, {4, 3, 5}, 1));
  auto bad = t.parameter(make_tensor<v_t>(m, {4}, 2));
  auto good = t.parameter(make_tensor<v_t>(m, {5}, 2));

  std::string e = error_of([&] { (void)ad::broadcast_add(x, bad); });
  CAPTURE(e);
  CHECK(contains(e, "broadcast_add"));
  CHECK(contains(e, "'m' has extent 5"));
  CHECK(contains(e, "4 in y"));
  CHECK(contains(error_of([&] { (void)ad::broadcast_multiply(x, bad); }), "broadcast_multiply"));
  e = error_of([&] { (void)ad::layer_norm<'m'>(x, bad, bad); });
  CHECK(contains(e, "layer_norm"));
  CHECK(contains(e, "gamma"));
  e = error_of([&] { (void)ad::layer_norm<'m'>(x, good, bad); });
  CHECK(contains(e, "beta"));

  using ids_t = tensor<std::int32_t, mesh1, "bt">;
  using table_t = tensor<double, mesh1, "vm">;
  auto table = t.parameter(make_tensor<table_t>(m, {7, 5}, 3));
  std::vector<std::int32_t> ids_g(12, 1);
  ids_g[7] = 7;  // b = 2, t = 1
  e = error_of([&] { (void)ad::embedding<"btm">(ids_t::from_global(m, {4, 3}, ids_g), table); });
  CAPTURE(e);
  CHECK(contains(e, "embedding"));
  CHECK(contains(e, "id 7"));
  CHECK(contains(e, "b=2, t=1"));
  CHECK(contains(e, "[0, 7)"));
  ids_g[7] = -1;
  CHECK(contains(error_of([&] {
                   (void)ad::embedding<"btm">(ids_t::from_global(m, {4, 3}, ids_g), table);
                 }),
                 "id -1"));

  using logits_t = tensor<double, mesh1, "btv">;
  auto logits = t.parameter(make_tensor<logits_t>(m, {4, 3, 6}, 4));
  std::vector<std::int32_t> tg(12, 0);
  tg[5] = 6;  // b = 1, t = 2
  e = error_of([&] { (void)ad::cross_entropy<'v'>(logits, ids_t::from_global(m, {4, 3}, tg)); });
  CAPTURE(e);
  CHECK(contains(e, "cross_entropy"));
  CHECK(contains(e, "target 6"));
  CHECK(contains(e, "b=1, t=2"));
  CHECK(contains(e, "[0, 6)"));
  e = error_of([&] {
    (void)ad::cross_entropy<'v'>(logits,
                                 ids_t::from_global(m, {4, 2}, std::vector<std::int32_t>(8)));
  });
  CHECK(contains(e, "cross_entropy"));
  CHECK(contains(e, "'t' has extent 3"));

  CHECK(contains(error_of([&] { (void)ad::dropout(x, 1.5, 1); }), "dropout"));
}

// ---------------------------------------------------------------------------------------
// All operations in float: a small model agrees with the same model in double.

struct model_out {
  double loss = 0;
  globals grads;
};

template <class T>
model_out run_model(const mesh1& m) {
  using split_b = layout<split<'b', "dp">>;
  using ids_t = tensor<std::int32_t, mesh1, "bt", split_b>;
  using table_t = tensor<T, mesh1, "vm">;
  using vec_t = tensor<T, mesh1, "m">;
  using w_t = tensor<T, mesh1, "mv", layout<split<'v', "dp">>>;
  using s_t = tensor<T, mesh1, "bqk", split_b>;
  const std::array<std::size_t, 2> ie{4, 5};
  const std::array<std::size_t, 3> se{4, 5, 5};
  const std::size_t v = 9, d = 6;
  std::vector<std::int32_t> ids_g(count_of(ie)), tg(count_of(ie));
  for (std::size_t i = 0; i < ids_g.size(); ++i) {
    ids_g[i] = static_cast<std::int32_t>((i * 4 + 3) % v);
    tg[i] = static_cast<std::int32_t>((i * 7 + 1) % v);
  }
  const auto ids = ids_t::from_global(m, ie, ids_g);
  const auto targets = ids_t::from_global(m, ie, tg);
  ad::tape t;
  auto table = t.parameter(make_tensor<table_t>(m, {v, d}, 21));
  auto gamma = t.parameter(make_tensor<vec_t>(m, {d}, 22));
  auto beta = t.parameter(make_tensor<vec_t>(m, {d}, 23));
  auto bias = t.parameter(make_tensor<vec_t>(m, {d}, 24));
  auto gain = t.parameter(make_tensor<vec_t>(m, {d}, 25));
  auto w = t.parameter(make_tensor<w_t>(m, {d, v}, 26));
  auto scores = t.parameter(make_tensor<s_t>(m, se, 27));
  auto c1 = t.constant(make_tensor<s_t>(m, se, 28));
  auto c2 = t.constant(make_tensor<s_t>(m, se, 29));

  auto e = ad::embedding<"btm">(ids, table);
  auto n = ad::layer_norm<'m'>(e, gamma, beta);
  auto h = ad::gelu(ad::broadcast_add(n, bias));
  auto dr = ad::dropout(ad::broadcast_multiply(h, gain), 0.2, 42);
  auto logits = ad::einsum<"btm,mv->btv">(dr, w);
  auto ce = ad::cross_entropy<'v'>(logits, targets);
  auto p1 = ad::causal_softmax<'q', 'k'>(scores);
  auto p2 = ad::softmax<'k'>(ad::causal_mask<'q', 'k'>(scores));
  auto ls = ad::reduce_sum<"bv">(ad::log_softmax<'v'>(logits));
  auto loss = ce + ad::mean(p1 * c1) + ad::mean(p2 * c2) + ad::scale(ad::mean(ls), T(0.01));
  ad::backward(loss);
  model_out out;
  out.loss = static_cast<double>(to_global(loss.value())[0]);
  for (const auto& g : {as_double(to_global(table.grad())), as_double(to_global(gamma.grad())),
                        as_double(to_global(beta.grad())), as_double(to_global(bias.grad())),
                        as_double(to_global(gain.grad())), as_double(to_global(w.grad())),
                        as_double(to_global(scores.grad()))}) {
    out.grads.push_back(g);
  }
  return out;
}

TEST_CASE("every operation in float: a small model matches the double model") {
  mesh1 m(MPI_COMM_WORLD, {world_size()});
  const model_out f = run_model<float>(m);
  const model_out d = run_model<double>(m);
  CHECK(f.loss == doctest::Approx(d.loss).epsilon(1e-5));
  REQUIRE(f.grads.size() == d.grads.size());
  for (std::size_t i = 0; i < d.grads.size(); ++i) {
    CAPTURE(i);
    CHECK(relative_error(f.grads[i], d.grads[i]) < 1e-4);
  }
}

}  // namespace
