// expect: zest redistribute_all/async: give one layout for every tensor, or one per tensor
// Two layouts for three tensors: which tensor takes which is not said.
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/redistribute.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp">;
using w_t = zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "dp">>>;

int main() {
  mesh_t m;
  w_t a(m, {4, 3}), b(m, {4, 3}), c(m, {4, 3});
  auto pending = zest::redistribute_async<zest::layout<>, zest::layout<>>(a, b, c);
  (void)pending;
}
