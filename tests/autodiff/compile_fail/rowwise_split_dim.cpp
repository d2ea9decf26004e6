// expect: zest autodiff: the operation works along a dim that is split over a mesh axis
// A row op (autodiff::rowwise, here log_softmax) along a dim split over "dp": no rank holds a
// whole row; the fix is to redistribute to a layout that keeps the dim whole.
#include <zest/autodiff/ops.hpp>
#include <zest/mesh/mesh.hpp>

using mesh_t = zest::local_mesh<"dp">;
using x_t = zest::tensor<float, mesh_t, "bv", zest::layout<zest::split<'v', "dp">>>;

int main() {
  mesh_t m;
  zest::autodiff::tape t;
  auto x = t.parameter(x_t(m, {2, 8}));
  auto y = zest::autodiff::log_softmax<'v'>(x);
  (void)y;
}
