// tests/layout_stress/bug_repro.cpp — issue 10's reproducer of the g++ 12 layout miscompile.
//
// Built twice, with and without -DWITH_FIRST, and run at 4 ranks. With g++ 12 and the
// layout_value template arguments, the build with the einsum first printed "split( 4": the
// replicated tensor v's layout, read at run time, had an axis of kind 0. Both builds must
// print "replicate 2" (v's layout string, and the norm of its four ones counted once) and
// exit 0; otherwise they print what they got and exit 1.
#include <cmath>
#include <cstdio>
#include <string>

#include "zest/zest.hpp"

using M = zest::mesh<"x", "y", "z">;

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  M m(MPI_COMM_WORLD, {1, 1, -1});
#ifdef WITH_FIRST
  {
    using a_t =
        zest::tensor<float, M, "Jg", zest::layout<zest::split<'g', "x">, zest::split<'J', "z">>>;
    a_t a(m, {4, 8});
    auto y = zest::einsum<"Jg->g", zest::layout<zest::partial<"x">>>(a);
    (void)y;
  }
#endif
  using v_t = zest::tensor<float, M, "v", zest::layout<>>;
  v_t v(m, {4});
  for (auto& e : v.local()) e = 1.0F;
  const std::string layout = zest::layout_string<v_t>();
  const double norm = zest::global_norm(m, v);
  std::printf("%s %g\n", layout.c_str(), norm);  // "replicate 2"
  if (layout != "replicate" || std::abs(norm - 2.0) > 1e-12) {
    std::printf("bug_repro: FAIL: expected \"replicate 2\"\n");
    return 1;
  }
  return 0;
}
