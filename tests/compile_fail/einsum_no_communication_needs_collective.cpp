// expect: zest einsum: this einsum needs a collective before its contraction, but the policy
// x is split on b over dp, the weight on m over dp: the weight must be all-gathered,
// which no_communication<> forbids.
#include <zest/einsum/einsum.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "dp">>> x(m, {2, 3, 4});
  zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "dp">>> w(m, {4, 5});
  auto y = zest::einsum<"bsm,mh->bsh", zest::no_communication<>>(x, w);
  (void)y;
}
