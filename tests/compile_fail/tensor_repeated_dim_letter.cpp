// expect: zest tensor: a dim letter appears twice
// The user names two dims of one tensor 'm' ("mm" for a square matrix).
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;
using square_t = zest::tensor<float, mesh_t, "mm">;

int main() {
  mesh_t m;
  square_t s(m, {4, 4});
  return static_cast<int>(s.local_count());
}
