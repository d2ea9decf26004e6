// expect: zest visualize: draws 2-D tensors
// The user asks for the block map of a 3-D tensor; visualize draws matrices only.
#include <zest/mesh/mesh.hpp>
#include <zest/plan/visualize.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;

int main() {
  mesh_t m;
  zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "dp">>> x(m, {2, 3, 4});
  return static_cast<int>(zest::visualize(x).size());
}
