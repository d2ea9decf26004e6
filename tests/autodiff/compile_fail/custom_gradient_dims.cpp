// expect: zest autodiff custom: the backward returned a gradient
// A general op (autodiff::custom) whose backward returns a gradient with other dims than its
// input's.
#include <zest/autodiff/ops.hpp>
#include <zest/mesh/mesh.hpp>

using mesh_t = zest::local_mesh<"dp">;
using x_t = zest::tensor<float, mesh_t, "bv">;
using wrong_t = zest::tensor<float, mesh_t, "vb">;

int main() {
  mesh_t m;
  zest::autodiff::tape t;
  auto x = t.parameter(x_t(m, {2, 3}));
  auto y = zest::autodiff::custom<"wrong">(
      x_t(m, {2, 3}),
      [&](const auto&, const auto&, const auto&) {
        return wrong_t(m, {3, 2});
      },
      x);
  zest::autodiff::backward(zest::autodiff::sum(y));
}
