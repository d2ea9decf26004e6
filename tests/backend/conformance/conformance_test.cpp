// Backend conformance: every op of the vocabulary (autodiff's element-wise, row-wise,
// reductions, broadcasts, lookups, losses, shape ops, einsum; MoE's gating, dispatch and
// combine), forward and backward, on a device backend against the host backend, in float
// and double, at the world's size (conformance_ops.hpp lists them, one line each;
// conformance.hpp says what is compared and within what tolerance). The device backend is
// zest::emulated_mesh (the call operators of the function objects that a GPU runs as
// kernels, run on the host); tests/cuda/cuda_autodiff_test.cu compiles this file with
// ZEST_TEST_DEVICE_MESH = cuda_mesh, the same comparisons with the kernels on a GPU.
#include <doctest/doctest.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

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

// A device's translation units may each take some of the types and a part of the ops, and
// one of them the error cases (the GPU's, compiled by nvcc: tests/cuda/CMakeLists.txt makes
// one TU per type and part, so that no nvcc process holds every op's instantiations at once).
// Part k of n runs the ops whose place in all_ops() is k modulo n; the parts' names differ,
// so doctest keeps each one.
#if !defined(ZEST_TEST_CONFORMANCE_TYPES)
#define ZEST_TEST_CONFORMANCE_TYPES float, double
#endif
#define ZEST_TEST_TEXT(x) #x
#define ZEST_TEST_PART_NAME(k, n) " (ops " ZEST_TEST_TEXT(k) " mod " ZEST_TEST_TEXT(n) ")"
#if !defined(ZEST_TEST_CONFORMANCE_PARTS)
#define ZEST_TEST_CONFORMANCE_PARTS 1
#define ZEST_TEST_CONFORMANCE_PART 0
#define ZEST_TEST_CONFORMANCE_NAME ""
#else
#define ZEST_TEST_CONFORMANCE_NAME \
  ZEST_TEST_PART_NAME(ZEST_TEST_CONFORMANCE_PART, ZEST_TEST_CONFORMANCE_PARTS)
#endif
constexpr std::size_t parts = ZEST_TEST_CONFORMANCE_PARTS, part = ZEST_TEST_CONFORMANCE_PART;
static_assert(part < parts, "ZEST_TEST_CONFORMANCE_PART counts from 0 to PARTS - 1");

template <class T, class Cases, std::size_t... I>
void run_part(const conformance::mesh_set<ZEST_TEST_DEVICE_MESH>& meshes, const Cases& cases,
              std::index_sequence<I...>) {
  const auto one = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
    if constexpr (K % parts == part) conformance::run_case<T>(meshes, std::get<K>(cases));
  };
  (one(std::integral_constant<std::size_t, I>{}), ...);
}

TEST_CASE_TEMPLATE(
    "every op, forward and backward, on the device backend equals the "
    "host's" ZEST_TEST_CONFORMANCE_NAME,
    T, ZEST_TEST_CONFORMANCE_TYPES) {
  const conformance::mesh_set<ZEST_TEST_DEVICE_MESH> meshes;
  const auto cases = conformance::all_ops();
  run_part<T>(meshes, cases, std::make_index_sequence<std::tuple_size_v<decltype(cases)>>{});
}

#if !defined(ZEST_TEST_CONFORMANCE_NO_ERRORS)
TEST_CASE("a bad id, target or route throws the host's shape_error on the device backend") {
  const conformance::mesh_set<ZEST_TEST_DEVICE_MESH> meshes;
  std::apply([&](const auto&... c) { (conformance::run_error_case(meshes, c), ...); },
             conformance::all_errors());
}
#endif

}  // namespace
