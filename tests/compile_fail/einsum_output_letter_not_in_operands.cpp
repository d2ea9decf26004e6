// expect: zest einsum: an output letter appears in no operand
// The output names dim z, which no operand has.
#include <zest/einsum/einsum.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "ik"> a(m, {2, 3});
  zest::tensor<float, mesh_t, "kj"> b(m, {3, 4});
  auto c = zest::einsum<"ik,kj->iz">(a, b);
  (void)c;
}
