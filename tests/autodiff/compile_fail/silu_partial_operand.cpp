// expect: zest autodiff: a nonlinear operation got a partial operand
// An element-wise op (autodiff::unary, here silu) on a pending sum: silu(a0 + a1) is not
// silu(a0) + silu(a1); the fix is to reduce first.
#include <zest/autodiff/ops.hpp>
#include <zest/mesh/mesh.hpp>

using mesh_t = zest::local_mesh<"dp">;
using p_t = zest::tensor<float, mesh_t, "ij", zest::layout<zest::partial<"dp">>>;

int main() {
  mesh_t m;
  zest::autodiff::tape t;
  auto a = t.parameter(p_t(m, {2, 2}));
  auto y = zest::autodiff::silu(a);
  (void)y;
}
