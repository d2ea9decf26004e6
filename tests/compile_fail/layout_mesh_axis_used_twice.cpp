// expect: zest layout: this placement uses a mesh axis that an earlier placement already uses
// The user splits 'b' over "dp" and then also 's' over "dp": one axis cannot split two dims.
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;
using act_t = zest::tensor<float, mesh_t, "bsm",
                           zest::layout<zest::split<'b', "dp">, zest::split<'s', "dp">>>;

int main() {
  mesh_t m;
  act_t x(m, {2, 3, 4});
  return static_cast<int>(x.local_count());
}
