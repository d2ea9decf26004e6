// expect: zest check_gradients: the loss function must return a scalar variable
// The user's loss function returns the op's output tensor instead of a scalar built from it.
#include <zest/autodiff/tape.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/testing/check_gradients.hpp>

using mesh_t = zest::local_mesh<"dp">;
using x_t = zest::tensor<double, mesh_t, "bm", zest::layout<zest::split<'b', "dp">>>;

int main() {
  mesh_t m;
  const x_t x(m, {2, 3});
  const auto r = zest::testing::check_gradients([](const auto& v) { return v * v; }, x);
  return r.ok() ? 0 : 1;
}
