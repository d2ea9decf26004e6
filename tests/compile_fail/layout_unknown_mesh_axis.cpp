// expect: zest layout: a placement names a mesh axis that the mesh does not have
// The user splits dim 'b' over "pp", but the mesh's axes are "dp" and "tp".
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;
using act_t = zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "pp">>>;

int main() {
  mesh_t m;
  act_t x(m, {2, 3, 4});
  return static_cast<int>(x.local_count());
}
