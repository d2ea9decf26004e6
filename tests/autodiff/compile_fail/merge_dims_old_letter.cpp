// expect: zest merge_dims<NewDims>: NewDims must be the tensor's dims with two adjacent dims written as one new letter
// "bs" for "bts" reuses an old letter: (b t) -> b or (t s) -> s; refused, not one reading picked.
#include <zest/autodiff/shape_ops.hpp>
#include <zest/mesh/mesh.hpp>

using mesh_t = zest::local_mesh<"dp">;
using x_t = zest::tensor<double, mesh_t, "bts">;

int main() {
  mesh_t m;
  x_t x(m, {2, 3, 5});
  auto y = zest::merge_dims<"bs">(x);
  (void)y;
}
