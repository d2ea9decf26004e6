// tests/layout_stress/replicated_layout_repro.cpp — a second, smaller face of issue 10's g++ 12
// miscompile, found by the layout stress test: once a tensor type with a layout such as
// split(m:tp,dp) partial(pp) is in the file, zest::replicated_layout(3) computed at run
// time came out as kinds {1, 1, 0, 0, 0, 0} instead of six replicates (1): the third mesh
// axis had no valid placement. Prints the kinds and exits 1 when any is not replicate.
#include <cstdio>

#include "zest/zest.hpp"

using mesh_t = zest::mesh<"dp", "tp", "pp">;
using x_t = zest::tensor<float, mesh_t, "bsm",
                         zest::layout<zest::partial<"pp">, zest::split<'m', "tp", "dp">>>;

int main(int argc, char** /*argv*/) {
  // The layout of x_t, used at run time, so that its template argument is emitted.
  std::printf("x_t: %s\n", zest::layout_string<x_t>().c_str());
  // argc + 2 == 3 without arguments: a run-time value the compiler cannot fold.
  const zest::layout_value v = zest::replicated_layout(static_cast<std::size_t>(argc + 2));
  bool ok = v.axis_count == 3;
  std::printf("replicated_layout(%d): kinds", argc + 2);
  for (const auto& p : v.axes) {
    std::printf(" %d", static_cast<int>(p.kind));
    ok = ok && p.kind == zest::placement_kind::replicate && p.dim == 0 && p.order == 0;
  }
  std::printf(": %s\n", ok ? "PASS" : "FAIL (expected every kind 1, replicate)");
  return ok ? 0 : 1;
}
