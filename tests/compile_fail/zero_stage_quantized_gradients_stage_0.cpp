// expect: zest zero_stage: ZeRO++'s qgZ quantizes the gradients' reduce-scatter, which stages 1-3 run
// qgZ asked of stage 0, which all-reduces its gradients (an exact sum): the stage says so
// when a parameter's layouts are formed.
#include <zest/mesh/mesh.hpp>
#include <zest/zero/stage.hpp>

using stage = zest::zero_stage<0, "dp">::with_quantized_gradients<256>;

int main() {
  constexpr auto l = stage::layouts<zest::local_mesh<"dp">, "mh">;
  (void)l;
}
