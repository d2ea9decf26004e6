// expect: zest layout: split names a dim the tensor does not have
// The user splits dim 'h' of a tensor whose dims are "bsm".
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;
using act_t = zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'h', "tp">>>;

int main() {
  mesh_t m;
  act_t x(m, {2, 3, 4});
  return static_cast<int>(x.local_count());
}
