// Training on a cuda_mesh equals training on the host: the small GPT of tests/train (and its
// mixture-of-experts form) for 10 steps under ZeRO-1 and ZeRO-3, on one GPU per rank with
// NCCL, against the same program on zest::mesh. fp32 losses within 1e-4 relative and
// parameters within 1e-4, bf16 within the rounding of its storage; model-state bytes in
// device memory equal the host's in host memory (the same formula, the other counters).
// Also the norm, the inf check, a record's staging and the recomputation's determinism check
// on the device (train/backend_paths.hpp).
//
// tests/cuda/CMakeLists.txt compiles this file twice into one program: ZEST_TEST_TRAINING_PART
// 0 (the dense GPT, the backend's paths) and 1 (the MoE GPT on a 2-D mesh), so that neither
// nvcc process holds every model's instantiations (cicc: 2.3 GB for any one dense case, 2.9
// GB for the MoE case alone, 3.7 GB for the MoE case with two dense ones).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/gpu_test.hpp"
#include "train/backend_paths.hpp"
#include "train/training_fixture.hpp"
#include "zest/cuda.hpp"

namespace {
using namespace zest;
using namespace zest::testing;

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct run_result {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  std::int64_t state_bytes = 0;
};

// `steps` steps of the GPT `options` under policy P on `mesh`, tokens split as TokenLayout.
template <class P, class TokenLayout>
run_result train_on(const typename P::mesh_type& mesh, const gpt_options& options,
                    std::int64_t steps) {
  auto& memory = backend_of<typename P::mesh_type>::counters();
  run_result r;
  zero_engine<P> engine(mesh, {.seed = 5});
  const std::int64_t before = memory.live.load();
  gpt<P> model(engine, options);
  r.state_bytes = memory.live.load() - before;
  r.losses = train_steps<TokenLayout>(engine, model, 0, steps);
  r.params = parameter_values(engine);
  return r;
}

void compare(const run_result& gpu, const run_result& host, double loss_tolerance,
             double param_tolerance) {
  REQUIRE(gpu.losses.size() == host.losses.size());
  for (std::size_t k = 0; k < host.losses.size(); ++k) {
    INFO("step " << k << ": gpu " << gpu.losses[k] << ", host " << host.losses[k]);
    CHECK(std::isfinite(gpu.losses[k]));
    CHECK(std::abs(gpu.losses[k] - host.losses[k]) <= loss_tolerance * std::abs(host.losses[k]));
  }
  CHECK(host.losses.back() < host.losses.front());  // the runs train
  check_same_parameters(gpu.params, host.params, param_tolerance);
  CHECK(gpu.state_bytes == host.state_bytes);
}

using dp_layout = layout<split<'b', "dp">>;
// Spelt as basic_tensor<T, Mesh, dims, layout constant>, as in cuda_redistribute_test.cu:
// nvcc's host-code generator loses the string literals of zest::tensor (an alias template)
// once the type is an explicit template argument.
inline constexpr fixed_string<3> bm_dims = "bm";
inline constexpr layout_value gpu_bm_split =
    layout_value_of<cuda_mesh<"dp">, bm_dims, layout<split<'b', "dp">>>;
inline constexpr layout_value host_bm_split =
    layout_value_of<mesh<"dp">, bm_dims, layout<split<'b', "dp">>>;
using gpu_grad = basic_tensor<float, cuda_mesh<"dp">, bm_dims, gpu_bm_split>;
using host_grad = basic_tensor<float, mesh<"dp">, bm_dims, host_bm_split>;

template <class Stage, class Param>
void dense_case(double loss_tolerance, double param_tolerance) {
  const int n = world_size();
  const auto& gpu_mesh = shared_gpu_mesh<cuda_mesh<"dp">>({n});
  const mesh<"dp"> host_mesh(MPI_COMM_WORLD, {n});
  const auto gpu = train_on<training_policy<cuda_mesh<"dp">, Stage, Param>, dp_layout>(
      gpu_mesh, small_gpt(), 10);
  const auto host =
      train_on<training_policy<mesh<"dp">, Stage, Param>, dp_layout>(host_mesh, small_gpt(), 10);
  compare(gpu, host, loss_tolerance, param_tolerance);
}

#if !defined(ZEST_TEST_TRAINING_PART)
#error "tests/cuda/CMakeLists.txt defines ZEST_TEST_TRAINING_PART (0 or 1)"
#elif ZEST_TEST_TRAINING_PART == 0
TEST_CASE("GPT on cuda_mesh: ZeRO-1, fp32, equals the host") {
  dense_case<zero_stage<1>, float>(1e-4, 1e-4);
}
TEST_CASE("GPT on cuda_mesh: ZeRO-3, fp32, equals the host") {
  dense_case<zero_stage<3>, float>(1e-4, 1e-4);
}
TEST_CASE("on cuda_mesh: the norm, the inf check, records and recomputation's check") {
  check_backend_paths<gpu_grad, host_grad>(shared_gpu_mesh<cuda_mesh<"dp">>({world_size()}));
}
// bf16 parameters and gradients round differently where the two backends sum in another
// order; the fp32 masters keep the runs within a few bf16 ulps of each other.
TEST_CASE("GPT on cuda_mesh: ZeRO-3, bf16, follows the host") {
  dense_case<zero_stage<3>, bfloat16>(2e-2, 5e-2);
}
// ZeRO++'s qwZ and qgZ: the int8 wire's encode and decode kernels on the device (spelt out:
// nvcc's host-code generator loses the data axis' literal through the alias members). A
// value on a rounding tie may land one quantum apart where the device fuses a multiply-add.
TEST_CASE("GPT on cuda_mesh: ZeRO-3 with qwZ and qgZ, fp32, follows the host") {
  dense_case<zero_stage<3, "dp", split_first_dim, "", "", 256, 256>, float>(2e-2, 5e-2);
}

#else
TEST_CASE("MoE GPT on cuda_mesh<dp, ep>: ZeRO-1 equals the host") {
  const int n = world_size();
  const int ep = n % 2 == 0 ? 2 : 1;
  gpt_options o = small_gpt();
  o.moe = true;
  o.experts = 4;
  using tokens = layout<split<'b', "dp", "ep">>;
  const auto& gpu_mesh = shared_gpu_mesh<cuda_mesh<"dp", "ep">>({n / ep, ep});
  const mesh<"dp", "ep"> host_mesh(MPI_COMM_WORLD, {n / ep, ep});
  const auto gpu = train_on<training_policy<cuda_mesh<"dp", "ep">, zero_stage<1>, float>, tokens>(
      gpu_mesh, o, 10);
  const auto host =
      train_on<training_policy<mesh<"dp", "ep">, zero_stage<1>, float>, tokens>(host_mesh, o, 10);
  compare(gpu, host, 1e-4, 1e-4);
}
#endif

}  // namespace
