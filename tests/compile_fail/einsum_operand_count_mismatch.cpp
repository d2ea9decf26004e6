// expect: zest einsum: the spec names a different number of operands than were passed
// The spec has two operands, the user passes three tensors.
#include <zest/einsum/einsum.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "ik"> a(m, {2, 3});
  zest::tensor<float, mesh_t, "kj"> b(m, {3, 4});
  auto c = zest::einsum<"ik,kj->ij">(a, b, b);
  (void)c;
}
