// expect: zest autodiff rope<Pos, Dim>: Pos (the position dim) and Dim (the rotated head dim)
// rope with the same dim for positions and pairs.
#include <zest/autodiff/rope.hpp>
#include <zest/mesh/mesh.hpp>

using mesh_t = zest::local_mesh<"dp">;
using x_t = zest::tensor<float, mesh_t, "btd">;

int main() {
  mesh_t m;
  zest::autodiff::tape t;
  auto x = t.parameter(x_t(m, {1, 3, 4}));
  auto y = zest::autodiff::rope<'d', 'd'>(x);
  (void)y;
}
