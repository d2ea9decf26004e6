// expect: zest scaled_dot_product_attention<Spec>: the output must be q's letters with the last
// An attention spec whose output keeps q's head dim d instead of v's value dim e: the spec is
// checked before any einsum runs, with one message that names the problem.
#include <zest/autodiff/attention.hpp>
#include <zest/mesh/mesh.hpp>

using mesh_t = zest::local_mesh<"dp">;
using q_t = zest::tensor<float, mesh_t, "bhtd">;
using k_t = zest::tensor<float, mesh_t, "bhsd">;
using v_t = zest::tensor<float, mesh_t, "bhse">;

int main() {
  mesh_t m;
  zest::autodiff::tape t;
  auto q = t.parameter(q_t(m, {1, 2, 3, 4}));
  auto k = t.parameter(k_t(m, {1, 2, 3, 4}));
  auto v = t.parameter(v_t(m, {1, 2, 3, 5}));
  auto y = zest::autodiff::scaled_dot_product_attention<"bhtd,bhsd,bhse->bhtd">(q, k, v);
  (void)y;
}
