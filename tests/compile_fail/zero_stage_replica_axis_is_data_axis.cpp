// expect: zest zero_stage: the data axes are one or more mesh axis names separated by commas, each once
// An axis cannot both partition the states (the stage's data axis) and hold their replicas
// (replicated_over): the stage says so once, when a parameter's layouts are formed.
#include <zest/mesh/mesh.hpp>
#include <zest/zero/stage.hpp>

using stage = zest::zero_stage<3, "dp">::replicated_over<"dp">;

int main() {
  constexpr auto l = stage::layouts<zest::local_mesh<"dp">, "mh">;
  (void)l;
}
