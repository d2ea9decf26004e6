// expect: zest check_gradients: inputs must hold double (or float) elements
// The user checks an op on bfloat16 tensors, whose 8-bit mantissa cannot resolve a central
// difference; the check belongs on double tensors.
#include <zest/autodiff/tape.hpp>
#include <zest/core/bfloat16.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/testing/check_gradients.hpp>

using mesh_t = zest::local_mesh<"dp">;
using x_t = zest::tensor<zest::bfloat16, mesh_t, "bm">;

int main() {
  mesh_t m;
  const x_t x(m, {2, 3});
  const auto r =
      zest::testing::check_gradients([](const auto& v) { return zest::autodiff::sum(v); }, x);
  return r.ok() ? 0 : 1;
}
