// expect: zest autodiff: a nonlinear operation got a partial operand
// The user multiplies two pending sums over the same axis elementwise: (a0 + a1) * (b0 + b1)
// is not a0 * b0 + a1 * b1, so one must be reduced first.
#include <zest/autodiff/tape.hpp>
#include <zest/mesh/mesh.hpp>

using mesh_t = zest::local_mesh<"dp">;
using p_t = zest::tensor<float, mesh_t, "ij", zest::layout<zest::partial<"dp">>>;

int main() {
  mesh_t m;
  zest::autodiff::tape t;
  auto a = t.parameter(p_t(m, {2, 2}));
  auto b = t.parameter(p_t(m, {2, 2}));
  auto c = a * b;
  (void)c;
}
