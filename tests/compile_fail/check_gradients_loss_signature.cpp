// expect: zest check_gradients: the loss function must be callable as
// The user passes two tensors but the loss function takes one variable: it must take one
// variable per input, in order (after the tape, if it wants one).
#include <zest/autodiff/tape.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/testing/check_gradients.hpp>

using mesh_t = zest::local_mesh<"dp">;
using x_t = zest::tensor<double, mesh_t, "bm">;

int main() {
  mesh_t m;
  const x_t x(m, {2, 3}), y(m, {2, 3});
  const auto r = zest::testing::check_gradients(
      [](const zest::autodiff::variable<x_t>& v) { return zest::autodiff::sum(v); }, x, y);
  return r.ok() ? 0 : 1;
}
