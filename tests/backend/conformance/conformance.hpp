// The harness of the backend-conformance suite (conformance_test.cpp, ops in
// conformance_ops.hpp): an op runs on the host backend (zest::mesh) and on a device backend
// (zest::emulated_mesh here, zest::cuda_mesh in tests/cuda/cuda_autodiff_test.cu) with the
// same inputs and layouts; its outcome, compared as global arrays, is
//
//   [0] the op's value y, [1] the loss sum(y * r) + sum(0.5 * y) (r a fixed replicated
//   tensor; y used twice, so its gradient is accumulated), then each parameter's gradient,
//   then what the op observed besides (integer outputs, plain tensors, statistics).
//
// Tolerance, per op and element type: the relative error max|device - host| / max(1,
// max|host|) of every array is at most k * epsilon(T), k given by the op's line; k = 0 means
// bit-equal, for ops whose host members keep the call operators' order of operations (shape
// ops, embedding, dropout, MoE routing and the index path, ...). k > 0 where the host runs
// Eigen's vectorised exp, log or tanh (a few ulp from <cmath>'s), or sums in another order
// (the device sums long reductions in chunks, then the chunks in order; the loss adds every
// term of the shard). ZEST_CONFORMANCE_REPORT=1 prints each op's worst error in units of
// epsilon(T); ZEST_CONFORMANCE_OP=text runs only the ops whose name contains text.
//
// A real GPU rounds apart from the host in two ways the emulated device cannot show (seen on
// an H200, 2026-12-04: 54 of 1189 bit-equality checks differed, all in floating values, no
// integer): nvcc contracts a * b + c into one fused multiply-add (one rounding, not two: the
// loss's products in double, combine's weighted sums), and CUDA's math library is not glibc's
// (pow, exp: the gating's softmax). Where the device is a GPU (ZEST_TEST_DEVICE_ROUNDING,
// defined by tests/cuda/cuda_autodiff_test.cu), every floating array is compared within at
// least `gpu_rounding`; arrays of integers (indices, routes, counts) stay bit-equal.
#pragma once

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/moe/routing.hpp"

namespace zest::testing::conformance {

namespace ad = zest::autodiff;

using outcome = std::vector<std::vector<double>>;

// k of the tolerance k * epsilon(T), for float and for double; exact: bit-equal.
struct tolerance {
  double float_k = 0, double_k = 0;
};
inline constexpr tolerance exact{};

#if defined(ZEST_TEST_DEVICE_ROUNDING)
inline constexpr bool device_rounds_apart = true;
#else
inline constexpr bool device_rounds_apart = false;
#endif
// The least tolerance of a floating array on a GPU: a few ulp per contracted or libm-evaluated
// term, times the terms a loss or a gradient sums (up to a few hundred here).
inline constexpr tolerance gpu_rounding{64, 1024};

// One line of the table: a name, the tolerance, the mesh it runs on (MeshRank 1: mesh<"dp">
// of every rank; 2: mesh<"dp", "tp"> in each 2-D shape of the world) and the op, a generic
// callable taking a context& and returning context::finish(...).
template <int MeshRank, class F>
struct op_case {
  static constexpr int mesh_rank = MeshRank;
  std::string_view name;
  tolerance tol;
  F run;
};
template <int MeshRank = 1, class F>
op_case<MeshRank, F> op(std::string_view name, tolerance tol, F run) {
  return {name, tol, run};
}

// A case that throws: the message on the device must be the host's (and name `what`).
template <class F>
struct error_case {
  std::string_view name;
  std::string_view what;
  F run;
};
template <class F>
error_case<F> error(std::string_view name, std::string_view what, F run) {
  return {name, what, run};
}

// What an op sees: the mesh, a tape, and its inputs, made from fixed global patterns (the
// same global values on either backend, whatever the layout). Each call of an input makes a
// new variable.
template <class T, class Mesh>
class context {
 public:
  using value_type = T;
  using mesh_type = Mesh;
  explicit context(const Mesh& m) : mesh_(m) {}
  const Mesh& mesh() const { return mesh_; }
  ad::tape& tape() { return tape_; }

  // X holding the global pattern `salt` times `scale` (positive: |v| * scale + 0.25).
  template <class X>
  X values(const typename X::extents_type& e, std::uint32_t salt, double scale = 1,
           bool positive = false) const {
    const auto g = global_values(e, salt);
    std::vector<typename X::value_type> v(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double x = positive ? std::abs(g[i]) * scale + 0.25 : g[i] * scale;
      v[i] = static_cast<typename X::value_type>(x);
    }
    return X::from_global(mesh_, e, std::span<const typename X::value_type>(v));
  }
  template <class X>
  auto param(const typename X::extents_type& e, std::uint32_t salt, double scale = 1,
             bool positive = false) {
    return tape_.parameter(values<X>(e, salt, scale, positive));
  }
  // An int32_t tensor of ids (i * 5 + 3) % bound over the global elements i.
  template <class I>
  I ids(const typename I::extents_type& e, std::size_t bound) const {
    std::size_t n = 1;
    for (auto v : e) n *= v;
    std::vector<std::int32_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((i * 5 + 3) % bound);
    return I::from_global(mesh_, e, std::span<const std::int32_t>(v));
  }

  // The inputs of the table. "btm" x: 5 rows over the ranks (uneven at 2 and 4).
  auto x() { return param<tensor<T, Mesh, "btm", layout<split<'b', "dp">>>>({5, 3, 4}, 1, 2.0); }
  auto x_positive() {
    return param<tensor<T, Mesh, "btm", layout<split<'b', "dp">>>>({5, 3, 4}, 2, 2.0, true);
  }
  auto x_split_t() {
    return param<tensor<T, Mesh, "btm", layout<split<'t', "dp">>>>({5, 6, 4}, 3, 2.0);
  }
  // x's extents, split on t (3 over the ranks: one without rows at 4): a second operand.
  auto x_other() {
    return param<tensor<T, Mesh, "btm", layout<split<'t', "dp">>>>({5, 3, 4}, 29, 2.0);
  }
  auto x_split_m() {
    return param<tensor<T, Mesh, "btm", layout<split<'m', "dp">>>>({3, 6, 5}, 4, 2.0);
  }
  auto x_few_rows() {
    return param<tensor<T, Mesh, "btm", layout<split<'b', "dp">>>>({3, 2, 4}, 5, 2.0);
  }
  auto x_many_rows() {
    return param<tensor<T, Mesh, "btm", layout<split<'b', "dp">>>>({16, 90, 6}, 6, 2.0);
  }
  auto vector_m() { return param<tensor<T, Mesh, "m">>({4}, 7); }
  auto vector_m6() { return param<tensor<T, Mesh, "m">>({6}, 8); }
  auto gamma_split_m() { return param<tensor<T, Mesh, "m", layout<split<'m', "dp">>>>({4}, 9); }
  auto vector_t() { return param<tensor<T, Mesh, "t">>({6}, 10); }
  auto matrix_bt() { return param<tensor<T, Mesh, "bt">>({5, 3}, 11); }
  auto matrix_bm_split_m() {
    return param<tensor<T, Mesh, "bm", layout<split<'m', "dp">>>>({5, 4}, 12);
  }
  auto weight_mh() { return param<tensor<T, Mesh, "mh", layout<split<'h', "dp">>>>({4, 6}, 13); }
  auto scores() {
    return param<tensor<T, Mesh, "bqk", layout<split<'q', "dp">>>>({2, 7, 7}, 14, 2.0);
  }
  auto scores_split_k() {
    return param<tensor<T, Mesh, "bqk", layout<split<'k', "dp">>>>({2, 7, 7}, 15, 2.0);
  }
  auto scores_kq() {
    return param<tensor<T, Mesh, "bkq", layout<split<'q', "dp">>>>({2, 6, 6}, 16, 2.0);
  }
  auto table() { return param<tensor<T, Mesh, "vm">>({7, 4}, 17); }
  auto table_split_m() {
    return param<tensor<T, Mesh, "vm", layout<split<'m', "dp">>>>({7, 4}, 18);
  }
  auto logits() {
    return param<tensor<T, Mesh, "btv", layout<split<'b', "dp">>>>({5, 3, 7}, 19, 3.0);
  }
  auto logits_bvt() {
    return param<tensor<T, Mesh, "bvt", layout<split<'t', "dp">>>>({5, 7, 3}, 20, 3.0);
  }
  // Plain (non-variable) inputs.
  auto ids_bt() const {
    return ids<tensor<std::int32_t, Mesh, "bt", layout<split<'b', "dp">>>>({5, 3}, 7);
  }
  auto ids_bt_split_t() const {
    return ids<tensor<std::int32_t, Mesh, "bt", layout<split<'t', "dp">>>>({5, 3}, 7);
  }
  auto targets() const { return ids<tensor<std::int32_t, Mesh, "bt">>({5, 3}, 7); }
  auto ids_r() const { return ids<tensor<std::int32_t, Mesh, "r">>({5}, 6); }
  // Nonzero picks: 1 where the global pattern is positive, with x()'s dims and layout.
  auto mask_btm() const {
    using m_t = tensor<T, Mesh, "btm", layout<split<'b', "dp">>>;
    const typename m_t::extents_type e{5, 3, 4};
    std::vector<T> v;
    for (double g : global_values(e, 22)) v.push_back(g > 0 ? T(1) : T(0));
    return m_t::from_global(mesh_, e, std::span<const T>(v));
  }

  // sum(v * R), R a fixed replicated tensor of v's dims: a scalar that reads every element.
  template <sharded_tensor V>
  auto mix(const ad::variable<V>& v) {
    using r_t = basic_tensor<T, Mesh, V::dims, replicated_layout(Mesh::axis_count)>;
    return ad::sum(v * tape_.constant(values<r_t>(v.value().extents(), 98)));
  }

  // Records a plain tensor's global values (integers exactly as doubles) in the outcome.
  template <sharded_tensor P>
  void observe(const P& p) {
    const auto g = to_global(p);
    observed_.emplace_back(g.begin(), g.end());
  }
  // The routing statistics, summed over the ranks (each holds its own groups).
  void observe(const moe::routing_stats& s) {
    std::vector<std::int64_t> v(s.tokens_per_expert);
    v.insert(v.end(), s.kept_per_expert.begin(), s.kept_per_expert.end());
    v.push_back(s.tokens);
    v.push_back(s.assignments);
    v.push_back(s.dropped);
    MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT64_T, MPI_SUM,
                  MPI_COMM_WORLD);
    observed_.emplace_back(v.begin(), v.end());
  }

  // What was observed, as the outcome (for ops that run their own backward).
  const outcome& observed() const { return observed_; }

  // The outcome of y: its value, the loss sum(y * r) + sum(0.5 * y) (y itself if it is a
  // scalar), backward, each parameter's gradient, then what was observed.
  template <sharded_tensor Y, sharded_tensor... P>
  outcome finish(const ad::variable<Y>& y, const ad::variable<P>&... params) {
    auto loss = [&] {
      if constexpr (view_of<Y::dims>.empty()) {
        return y;
      } else {
        return mix(y) + ad::sum(ad::scale(y, T(0.5)));
      }
    }();
    ad::backward(loss);
    outcome out{global_of(y.value()), global_of(loss.value())};
    (out.push_back(global_of(params.grad())), ...);
    out.insert(out.end(), observed_.begin(), observed_.end());
    return out;
  }

 private:
  template <sharded_tensor X>
  static std::vector<double> global_of(const X& x) {
    const auto g = to_global(x);
    return std::vector<double>(g.begin(), g.end());
  }

  const Mesh& mesh_;
  ad::tape tape_;
  outcome observed_;
};

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

template <class T>
double epsilon() {
  return static_cast<double>(std::numeric_limits<T>::epsilon());
}

// max|a - b| / max(1, max|b|); infinity when the shapes differ.
inline double relative(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0, scale = 1;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / scale;
}

inline bool report_errors() {
  const char* v = std::getenv("ZEST_CONFORMANCE_REPORT");
  return v != nullptr && std::string_view(v) == "1";
}

inline bool integral(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return x == std::floor(x); });
}

template <class T>
void compare(std::string_view name, const tolerance& tol, const outcome& host,
             const outcome& device) {
  constexpr bool is_float = std::is_same_v<T, float>;
  const double op_k = is_float ? tol.float_k : tol.double_k;
  REQUIRE(device.size() == host.size());
  double worst = 0;
  for (std::size_t i = 0; i < host.size(); ++i) {
    CAPTURE(i);  // 0: the value, 1: the loss, then the gradients, then what was observed
    REQUIRE(device[i].size() == host[i].size());
    double k = op_k;
    if (device_rounds_apart && !integral(host[i]))
      k = std::max(k, is_float ? gpu_rounding.float_k : gpu_rounding.double_k);
    const double e = relative(device[i], host[i]);
    worst = std::max(worst, e);
    if (k == 0) {
      CHECK(device[i] == host[i]);
    } else {
      CHECK(e <= k * epsilon<T>());
    }
  }
  if (report_errors() && world_rank() == 0) {
    const std::string type = std::is_same_v<T, float> ? "float" : "double";
    MESSAGE(std::string(name), " (", type, "): worst error / epsilon = ", worst / epsilon<T>(),
            ", allowed ", op_k,
            device_rounds_apart ? " (a GPU's floor: more for floating arrays)" : "");
  }
}

// ZEST_CONFORMANCE_OP=text runs only the ops whose name contains text.
inline bool selected(std::string_view name) {
  const char* v = std::getenv("ZEST_CONFORMANCE_OP");
  return v == nullptr || name.find(v) != std::string_view::npos;
}

// The meshes every case runs on, made once (a mesh makes a communicator per axis): the host's
// and the device's mesh<"dp"> of every rank, and mesh<"dp", "tp"> in each 2-D shape.
template <template <fixed_string...> class DeviceMesh>
struct mesh_set {
  mesh<"dp"> host{MPI_COMM_WORLD, {world_size()}};
  DeviceMesh<"dp"> device{MPI_COMM_WORLD, {world_size()}};
  std::vector<mesh<"dp", "tp">> host_2d;
  std::vector<DeviceMesh<"dp", "tp">> device_2d;
  mesh_set() {
    for (const auto& shape : mesh_shapes()) {
      host_2d.emplace_back(MPI_COMM_WORLD, shape);
      device_2d.emplace_back(MPI_COMM_WORLD, shape);
    }
  }
};

// One case on the host mesh and the device mesh over all ranks.
template <class T, template <fixed_string...> class DeviceMesh, class Case>
void run_case(const mesh_set<DeviceMesh>& meshes, const Case& c) {
  if (!selected(c.name)) return;
  CAPTURE(c.name);
  const auto start = std::chrono::steady_clock::now();
  const auto run = [&](const auto& m) {
    context<T, std::remove_cvref_t<decltype(m)>> ctx(m);
    return c.run(ctx);
  };
  if constexpr (Case::mesh_rank == 1) {
    compare<T>(c.name, c.tol, run(meshes.host), run(meshes.device));
  } else {
    for (std::size_t i = 0; i < meshes.host_2d.size(); ++i) {
      CAPTURE(meshes.host_2d[i].describe());
      compare<T>(c.name, c.tol, run(meshes.host_2d[i]), run(meshes.device_2d[i]));
    }
  }
  if (report_errors() && world_rank() == 0) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    MESSAGE(std::string(c.name), ": ", took.count() * 1e3, " ms");
  }
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

template <template <fixed_string...> class DeviceMesh, class Case>
void run_error_case(const mesh_set<DeviceMesh>& meshes, const Case& c) {
  CAPTURE(c.name);
  const auto run = [&](const auto& m) {
    context<float, std::remove_cvref_t<decltype(m)>> ctx(m);
    return error_of([&] { c.run(ctx); });
  };
  const std::string want = run(meshes.host);
  CHECK(run(meshes.device) == want);
  // The ranks whose shard holds the fault throw; at least one does.
  int thrown = want.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &thrown, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(thrown >= 1);
  if (!want.empty()) CHECK(want.find(c.what) != std::string::npos);
}

}  // namespace zest::testing::conformance
