// redistribute on a cuda_mesh: every pair of the 28 layouts of a 3-D tensor on a 2-D mesh
// (tests/tensor/redistribute_test.cpp's sweep), uneven extents, run on device shards with
// NCCL and compared with the same transition on the host backend, value for value; the NCCL
// communicators' byte counters against the plan. Then the typed API (tensor, redistribute,
// to_global) on both backends, in float and bfloat16.
#include <doctest/doctest.h>

#include <array>
#include <random>
#include <span>
#include <vector>

#include "cuda/gpu_test.hpp"
#include "support/fixtures.hpp"
#include "zest/backend/cuda/cuda_backend.hpp"
#include "zest/mesh/cuda_mesh.hpp"
#include "zest/plan/explain.hpp"
#include "zest/tensor/redistribute.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using host_mesh = mesh<"dp", "tp">;
using gpu_mesh = cuda_mesh<"dp", "tp">;

const gpu_mesh& shared_gpu_mesh(const std::array<int, 2>& shape) {
  return zest::testing::shared_gpu_mesh<gpu_mesh>(shape);
}

template <class Mesh>
std::uint64_t planned_bytes(const transition_plan& plan, layout_value v,
                            const std::array<std::size_t, 3>& g, const Mesh& m, std::size_t elem) {
  std::uint64_t b = 0;
  for (const auto& s : plan) {
    if (is_collective(s.kind)) b += detail::step_bytes<"abc">(s, v, g, m, elem);
    v = detail::after_step(v, s);
  }
  return b;
}

template <class T>
std::vector<T> to_host(const device_buffer<T>& b) {
  std::vector<T> out(b.size());
  cuda_backend::to_host<T>(b.span(), out.data());
  return out;
}

TEST_CASE("every layout pair: device shards equal host shards, counters equal the plan") {
  const auto layouts = layouts_on_two_axes("abc");
  REQUIRE(layouts.size() == 28);
  std::mt19937 rng(1234);
  for (const auto& shape : mesh_shapes()) {
    const gpu_mesh& gm = shared_gpu_mesh(shape);
    host_mesh hm(MPI_COMM_WORLD, shape);
    for (int trial = 0; trial < 2; ++trial) {
      const std::array<std::size_t, 3> g{rng() % 7, 1 + rng() % 9, 1 + rng() % 6};
      for (const auto& from : layouts) {
        for (const auto& to : layouts) {
          CAPTURE(to_string(from, host_mesh::axis_names));
          CAPTURE(to_string(to, host_mesh::axis_names));
          CAPTURE(gm.describe());
          CAPTURE(g);
          std::array<std::size_t, 3> local{};
          const auto data = make_shard<double, "abc">(from, g, hm, 7, &local);
          const transition_plan plan = fixed_order_plan(from, to);
          const auto host_moved = detail::run_transition<"abc">(
              plan, from, local, host_vector<double>(data.begin(), data.end()), g, hm);
          gm.reset_stats();
          auto device_moved = detail::run_transition<"abc">(
              plan, from, local, cuda_backend::from_host<double>(std::span<const double>(data)), g,
              gm);
          const comm_stats stats = gm.stats();
          CHECK(stats.calls() == plan.collectives());
          CHECK(stats.bytes_sent() == planned_bytes(plan, from, g, gm, sizeof(double)));
          const auto got = to_host(device_moved);
          REQUIRE(got.size() == host_moved.size());
          for (std::size_t i = 0; i < got.size(); ++i)
            CHECK(got[i] == doctest::Approx(host_moved[i]));
        }
      }
    }
  }
}

// Tensor types are spelled as basic_tensor<T, Mesh, dims, layout constant>: nvcc's host-code
// generator loses string literals that reach a type through an alias template (zest::tensor
// is one, and so is any alias taking layout<split<'a', "dp">>) once that type is an explicit
// template argument, as make_device<X> needs.
inline constexpr fixed_string<4> abc = "abc";
inline constexpr fixed_string<3> ab = "ab";
inline constexpr fixed_string<2> v_dim = "v";
inline constexpr layout_value abc_split_a_dp =
    layout_value_of<gpu_mesh, abc, layout<split<'a', "dp">>>;
inline constexpr layout_value abc_partial_dp =
    layout_value_of<gpu_mesh, abc, layout<partial<"dp">>>;
inline constexpr layout_value ab_split_a_dp_partial_tp =
    layout_value_of<gpu_mesh, ab, layout<split<'a', "dp">, partial<"tp">>>;
inline constexpr layout_value v_split_dp_tp =
    layout_value_of<gpu_mesh, v_dim, layout<split<'v', "dp", "tp">>>;

// make_tensor (fixtures.hpp) for device tensors: the same shard, staged through the host.
// (A function template, not a generic lambda: nvcc's host-code generator mangles the latter.)
template <class X>
X make_device(const gpu_mesh& m, const typename X::extents_type& g, std::uint32_t salt) {
  using T = typename X::value_type;
  const auto data = make_shard<T, X::dims>(X::layout, g, m, salt);
  return X(m, g, cuda_backend::from_host<T>(std::span<const T>(data)));
}

TEST_CASE("typed redistribute on the device: the transition table's steps, float and bfloat16") {
  for (const auto& shape : mesh_shapes()) {
    const gpu_mesh& m = shared_gpu_mesh(shape);
    const std::size_t n = static_cast<std::size_t>(shape[0]);
    using x_a = basic_tensor<float, gpu_mesh, abc, abc_split_a_dp>;
    using x_p = basic_tensor<float, gpu_mesh, abc, abc_partial_dp>;
    const std::array<std::size_t, 3> g{8, 12, 5};
    const std::uint64_t S = 8 * 12 * 5 * sizeof(float);
    const auto xa = make_device<x_a>(m, g, 1);
    const auto xp = make_device<x_p>(m, g, 2);
    auto bytes = [&](auto&& run) {
      m.reset_stats();
      run();
      return m.stats().bytes_sent();
    };
    CHECK(bytes([&] { (void)redistribute<layout<>>(xa); }) == (n - 1) * S / n);
    CHECK(bytes([&] { (void)redistribute<layout<>>(xp); }) == 2 * (n - 1) * S / n);
    CHECK(bytes([&] { (void)redistribute<layout<split<'b', "dp">>>(xp); }) == (n - 1) * S / n);
    CHECK(bytes([&] { (void)redistribute<layout<split<'b', "dp">>>(xa); }) == (n - 1) * S / n / n);
    CHECK(relative_error(to_global(redistribute<layout<split<'b', "dp">>>(xa)),
                         global_values(g, 1)) < 1e-6);
    CHECK(relative_error(to_global(redistribute<layout<split<'c', "dp">>>(xp)),
                         global_values(g, 2)) < 1e-6);

    using y_t = basic_tensor<bfloat16, gpu_mesh, ab, ab_split_a_dp_partial_tp>;
    const std::array<std::size_t, 2> gy{6, 5};
    const auto y = make_device<y_t>(m, gy, 9);
    CHECK(relative_error(to_global(redistribute<layout<split<'b', "tp">>>(y)),
                         global_values(gy, 9)) < 2e-2);

    // generate and from_global stage through the host, like any backend.
    using z_t = basic_tensor<float, gpu_mesh, v_dim, v_split_dp_tp>;
    const auto z = z_t::generate(m, {50257}, [](const auto& i) { return float(i[0] % 97); });
    const auto full = to_global(z);
    CHECK(full.size() == 50257);
    CHECK(full[50256] == float(50256 % 97));
  }
}

TEST_CASE("device memory accounting sees tensor storage come and go") {
  const gpu_mesh& m = shared_gpu_mesh(mesh_shapes().front());
  const auto before = memory::device::live_bytes();
  {
    using x_t = basic_tensor<float, gpu_mesh, ab, replicated_layout(2)>;
    const x_t x(m, {100, 10});
    CHECK(memory::device::live_bytes() == before + 4000);
  }
  CHECK(memory::device::live_bytes() == before);
}

}  // namespace
