// expect: zest global_norm: a gradient with a partial layout holds summands
// The gradient is still partial over dp (backward's output before its reduction): its
// shards are summands, so their squares would not add up to the norm. Reduce it first.
#include <zest/zest.hpp>

int main() {
  using mesh_t = zest::local_mesh<"dp">;
  const mesh_t mesh;
  const zest::tensor<float, mesh_t, "mh", zest::layout<zest::partial<"dp">>> grad(mesh, {4, 3});
  return static_cast<int>(zest::global_norm(mesh, grad));
}
