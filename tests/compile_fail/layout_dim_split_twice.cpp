// expect: zest layout: this dim is already split by an earlier placement
// The user splits 'm' over "dp" and, in a second placement, over "tp"; a dim split over
// several axes is written once: split<'m', "dp", "tp">.
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;
using w_t =
    zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "dp">, zest::split<'m', "tp">>>;

int main() {
  mesh_t m;
  w_t w(m, {4, 4});
  return static_cast<int>(w.local_count());
}
