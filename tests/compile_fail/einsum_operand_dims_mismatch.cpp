// expect: zest einsum: an operand's dims differ from its term in the spec
// The second operand has dims "jk" but the spec says "kj" (terms name dims in stored order).
#include <zest/einsum/einsum.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "ik"> a(m, {2, 3});
  zest::tensor<float, mesh_t, "jk"> b(m, {4, 3});
  auto c = zest::einsum<"ik,kj->ij">(a, b);
  (void)c;
}
