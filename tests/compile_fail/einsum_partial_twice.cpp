// expect: zest einsum: two operands are partial sums over the same mesh axis
// Both operands are pending sums over "tp": the product of sums is not the sum of products.
#include <zest/einsum/einsum.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "ik", zest::layout<zest::partial<"tp">>> a(m, {2, 3});
  zest::tensor<float, mesh_t, "kj", zest::layout<zest::partial<"tp">>> b(m, {3, 4});
  auto c = zest::einsum<"ik,kj->ij">(a, b);
  (void)c;
}
