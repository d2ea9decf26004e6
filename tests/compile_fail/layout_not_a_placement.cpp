// expect: zest layout: layout<...> takes only replicate
// The user puts something that is not a placement (here: int) into layout<...>.
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;
using act_t = zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "dp">, int>>;

int main() {
  mesh_t m;
  act_t x(m, {2, 3, 4});
  return static_cast<int>(x.local_count());
}
