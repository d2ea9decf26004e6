// expect: zest redistribute_all/async: the tensors of a group share one element type
// A float weight and a bfloat16 weight in one group: one collective carries one element type.
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/redistribute.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "dp">>> a(m, {4, 3});
  zest::tensor<zest::bfloat16, mesh_t, "h", zest::layout<zest::split<'h', "dp">>> b(m, {3});
  auto [x, y] = zest::redistribute_all<zest::layout<>>(a, b);
  (void)x;
  (void)y;
}
