// expect: zest moe_layer: the number of experts is not divisible by the expert axis size
// 6 experts over an expert axis of 4 ranks: each rank would hold 1.5 experts. With both
// sizes static (template arguments) the layer's type does not compile.
#include <zest/mesh/mesh.hpp>
#include <zest/moe/moe_layer.hpp>

using mesh_t = zest::local_mesh<"dp", "ep">;
using policy = zest::training_policy<mesh_t, zest::zero_stage<3>>;

int main() {
  mesh_t m;
  zest::zero_engine<policy> engine(m);
  zest::moe::moe_layer<policy, "ep", 6, 4> layer(engine, "moe", 8, 16, 6);
  (void)layer;
}
