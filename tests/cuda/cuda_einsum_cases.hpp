// The einsum property tests of tests/einsum/einsum_cases.hpp on a cuda_mesh: the same specs,
// layout combinations (combo_layout), policies and forced layouts, random extents, and the
// same checks — values against the naive reference, counters against explain — plus the
// same einsum on the host backend, which the device result must match.
#pragma once

#include <doctest/doctest.h>

#include <array>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "cuda/gpu_test.hpp"
#include "einsum/einsum_cases.hpp"
#include "zest/backend/cuda/cuda_backend.hpp"
#include "zest/mesh/cuda_mesh.hpp"

namespace zest::testing {

using gpu_einsum_mesh = cuda_mesh<"dp", "tp">;

inline const gpu_einsum_mesh& shared_gpu_einsum_mesh(const std::array<int, 2>& shape) {
  return shared_gpu_mesh<gpu_einsum_mesh>(shape);
}

template <class T, fixed_string Spec, std::size_t I, int Combo>
using gpu_operand_t =
    basic_tensor<T, gpu_einsum_mesh, term_dims<Spec, I>(), combo_layout<Spec, I, Combo>()>;

// make_tensor (fixtures.hpp) for a device tensor: the same shard, staged through the host.
template <class X>
X make_device_tensor(const typename X::mesh_type& mesh, const typename X::extents_type& extents,
                     std::uint32_t salt) {
  using T = typename X::value_type;
  const auto data = make_shard<T, X::dims>(X::layout, extents, mesh, salt);
  return X(mesh, extents, cuda_backend::from_host<T>(std::span<const T>(data)));
}

template <class A, class B>
double relative_difference(const std::vector<A>& got, const std::vector<B>& want) {
  std::vector<double> w(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) w[i] = static_cast<double>(want[i]);
  return relative_error(got, w);
}

// check_einsum (einsum_cases.hpp) on the device mesh, and against the host backend.
template <class T, fixed_string Spec, int Combo, class O1 = void, class O2 = void>
void check_gpu_einsum(const gpu_einsum_mesh& gm, const einsum_mesh& hm, std::mt19937& rng,
                      double tolerance) {
  constexpr einsum_spec s = spec_of<Spec>;
  std::array<std::size_t, 128> extent{};
  for (std::size_t i = 0; i < s.operand_count; ++i)
    for (std::size_t k = 0; k < s.inputs[i].size; ++k)
      extent[static_cast<unsigned char>(s.inputs[i].letters[k])] = 1 + rng() % 6;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto extents_of = [&](auto index) {
      constexpr std::size_t i = decltype(index)::value;
      typename gpu_operand_t<T, Spec, i, Combo>::extents_type e{};
      for (std::size_t k = 0; k < s.inputs[i].size; ++k)
        e[k] = extent[static_cast<unsigned char>(s.inputs[i].letters[k])];
      return e;
    };
    auto ops = std::make_tuple(make_device_tensor<gpu_operand_t<T, Spec, I, Combo>>(
        gm, extents_of(std::integral_constant<std::size_t, I>{}),
        static_cast<std::uint32_t>(11 + I))...);
    auto host_ops = std::make_tuple(make_tensor<operand_t<T, Spec, I, Combo>>(
        hm, extents_of(std::integral_constant<std::size_t, I>{}),
        static_cast<std::uint32_t>(11 + I))...);
    std::vector<dense> in;
    (in.push_back(
         dense{s.inputs[I].view(),
               std::vector<std::size_t>(std::get<I>(ops).extents().begin(),
                                        std::get<I>(ops).extents().end()),
               global_values(std::get<I>(ops).extents(), static_cast<std::uint32_t>(11 + I))}),
     ...);
    std::vector<std::size_t> out_extents;
    const auto want = reference_einsum(s, in, out_extents);
    const plan_report report = explain<Spec, O1, O2>(std::get<I>(ops)...);
    gm.reset_stats();
    auto y = einsum<Spec, O1, O2>(std::get<I>(ops)...);
    const comm_stats stats = gm.stats();
    auto y_host = einsum<Spec, O1, O2>(std::get<I>(host_ops)...);
    static_assert(std::is_same_v<typename decltype(y)::backend_type, cuda_backend>);
    static_assert(decltype(y)::layout == decltype(y_host)::layout,
                  "both backends plan the same layouts");
    CAPTURE(report.str());
    CHECK(stats.bytes_sent() == report.bytes());
    CHECK(stats.calls() == report.collectives());
    CHECK(std::vector<std::size_t>(y.extents().begin(), y.extents().end()) == out_extents);
    const auto got = to_global(y);
    CHECK(relative_error(got, want) < tolerance);
    CHECK(relative_difference(got, to_global(y_host)) < tolerance);
  }
  (std::make_index_sequence<s.operand_count>{});
}

// check_spec (einsum_cases.hpp) on the device: all combos, both policies, forced layouts.
template <fixed_string Spec, class T = float>
void check_gpu_spec() {
  cuda::settings().allow_tf32 = false;
  std::mt19937 rng(99);
  const double tol = std::is_same_v<T, double> ? 1e-12 : std::is_same_v<T, bfloat16> ? 3e-2 : 1e-5;
  for (const auto& shape : mesh_shapes()) {
    const gpu_einsum_mesh& gm = shared_gpu_einsum_mesh(shape);
    einsum_mesh hm(MPI_COMM_WORLD, shape);
    CAPTURE(gm.describe());
    CAPTURE(view_of<Spec>);
    for (int trial = 0; trial < 2; ++trial) {
      check_gpu_einsum<T, Spec, 0>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 1>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 2>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 3>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 4>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 5>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 6>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 6, keep_weights>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 3, keep_weights>(gm, hm, rng, tol);
      check_gpu_einsum<T, Spec, 2, layout<>>(gm, hm, rng, tol);
      if constexpr (spec_of<Spec>.output.size > 0) {
        constexpr char first = spec_of<Spec>.output.letters[0];
        check_gpu_einsum<T, Spec, 1, layout<split<first, "tp">>>(gm, hm, rng, tol);
      }
    }
  }
}

}  // namespace zest::testing
