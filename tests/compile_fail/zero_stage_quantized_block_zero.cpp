// expect: zest zero_stage: an int8 wire's block holds at least one element
// with_quantized_weights<0>: a block of no elements (the stage says so where it is named).
#include <zest/mesh/mesh.hpp>
#include <zest/zero/stage.hpp>

using stage = zest::zero_stage<3, "dp">::with_quantized_weights<0>;

int main() {
  constexpr auto l = stage::layouts<zest::local_mesh<"dp">, "mh">;
  (void)l;
}
