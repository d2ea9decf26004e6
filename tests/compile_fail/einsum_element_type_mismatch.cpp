// expect: zest einsum: operands have different element types
// A float activation times a double weight: zest does not convert implicitly.
#include <zest/einsum/einsum.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "ik"> a(m, {2, 3});
  zest::tensor<double, mesh_t, "kj"> b(m, {3, 4});
  auto c = zest::einsum<"ik,kj->ij">(a, b);
  (void)c;
}
