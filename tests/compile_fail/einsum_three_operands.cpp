// expect: zest einsum: an einsum takes one or two operands
// A three-operand product: written as a chain of two-operand einsums instead.
#include <zest/einsum/einsum.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "ij"> a(m, {2, 3});
  zest::tensor<float, mesh_t, "jk"> b(m, {3, 4});
  zest::tensor<float, mesh_t, "kl"> c(m, {4, 5});
  auto d = zest::einsum<"ij,jk,kl->il">(a, b, c);
  (void)d;
}
