// expect: zest einsum: a letter repeats within one term of the spec
// The user writes a trace-like term "ii": a tensor has each dim once.
#include <zest/einsum/einsum.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "ij"> a(m, {3, 3});
  auto c = zest::einsum<"ii->i">(a);
  (void)c;
}
