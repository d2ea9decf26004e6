// expect: zest zero_stage: ZeRO++'s qwZ quantizes the all-gathers of a stage-3 parameter's weights
// qwZ asked of stage 2, whose weights are replicated between uses (nothing to gather): the
// stage says so when a parameter's layouts are formed.
#include <zest/mesh/mesh.hpp>
#include <zest/zero/stage.hpp>

using stage = zest::zero_stage<2, "dp">::with_quantized_weights<256>;

int main() {
  constexpr auto l = stage::layouts<zest::local_mesh<"dp">, "mh">;
  (void)l;
}
