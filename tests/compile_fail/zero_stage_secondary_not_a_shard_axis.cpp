// expect: zest zero_stage: hpZ's secondary copy (with_secondary_over) is split over some of a stage-3 parameter's shard axes
// hpZ's secondary copy over an axis the stage does not partition over (here the replica
// axis of hybrid sharding): the stage says so when a parameter's layouts are formed.
#include <zest/mesh/mesh.hpp>
#include <zest/zero/stage.hpp>

using stage = zest::zero_stage<3, "dp">::replicated_over<"dp_rep">::with_secondary_over<"dp_rep">;

int main() {
  constexpr auto l = stage::layouts<zest::local_mesh<"dp_rep", "dp">, "mh">;
  (void)l;
}
