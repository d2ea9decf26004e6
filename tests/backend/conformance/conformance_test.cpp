// Backend conformance: every op of the vocabulary (autodiff's element-wise, row-wise,
// reductions, broadcasts, lookups, losses, shape ops, einsum; MoE's gating, dispatch and
// combine), forward and backward, on a device backend against the host backend, in float
// and double, at the world's size (conformance_ops.hpp lists them, one line each;
// conformance.hpp says what is compared and within what tolerance). The device backend is
// zest::emulated_mesh (the call operators of the function objects that a GPU runs as
// kernels, run on the host); tests/cuda/cuda_autodiff_test.cu compiles this file with
// ZEST_TEST_DEVICE_MESH = cuda_mesh, the same comparisons with the kernels on a GPU.
#include <doctest/doctest.h>

#include <tuple>

#include "backend/conformance/conformance_ops.hpp"
#if !defined(ZEST_TEST_DEVICE_MESH)
#include "zest/mesh/emulated_mesh.hpp"
#define ZEST_TEST_DEVICE_MESH emulated_mesh
#endif

namespace {
using namespace zest;
namespace conformance = zest::testing::conformance;

static_assert(!detail::runs_host_loops<backend_of<ZEST_TEST_DEVICE_MESH<"dp">>>(),
              "the device backend runs the call operators, not the host members");
static_assert(detail::runs_host_loops<backend_of<mesh<"dp">>>());

// A device's translation units may each take some of the types (the GPU's, compiled by nvcc,
// one type each: tests/cuda/cuda_autodiff_*test.cu), and one of them the error cases.
#if !defined(ZEST_TEST_CONFORMANCE_TYPES)
#define ZEST_TEST_CONFORMANCE_TYPES float, double
#endif
TEST_CASE_TEMPLATE("every op, forward and backward, on the device backend equals the host's", T,
                   ZEST_TEST_CONFORMANCE_TYPES) {
  const conformance::mesh_set<ZEST_TEST_DEVICE_MESH> meshes;
  std::apply([&](const auto&... c) { (conformance::run_case<T>(meshes, c), ...); },
             conformance::all_ops());
}

#if !defined(ZEST_TEST_CONFORMANCE_NO_ERRORS)
TEST_CASE("a bad id, target or route throws the host's shape_error on the device backend") {
  const conformance::mesh_set<ZEST_TEST_DEVICE_MESH> meshes;
  std::apply([&](const auto&... c) { (conformance::run_error_case(meshes, c), ...); },
             conformance::all_errors());
}
#endif

}  // namespace
