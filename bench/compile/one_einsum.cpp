// one_einsum — the smallest zest program: one mesh, two tensors, one einsum, a print.
// Not run by anything; bench/run compiles it alone to measure what zest costs the compiler
// (METRIC compile_cpu_s_one_einsum, compile_peak_mib_one_einsum).
#include <mpi.h>

#include <cstdio>

#include "zest/zest.hpp"

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  using mesh_t = zest::mesh<"dp">;
  using x_t = zest::tensor<float, mesh_t, "bm", zest::layout<zest::split<'b', "dp">>>;
  using w_t = zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "dp">>>;
  const mesh_t mesh(MPI_COMM_WORLD, {-1});
  const auto x = x_t::generate(mesh, {8, 16}, [](auto i) { return float(i[0] + i[1]); });
  const auto w = w_t::generate(mesh, {16, 4}, [](auto i) { return float(i[0]) - float(i[1]); });
  const auto y = zest::einsum<"bm,mh->bh">(x, w);
  const auto local = y.local();
  std::printf("rank %d: %zu local elements, first %g\n", mesh.rank(), local.size(),
              local.empty() ? 0.0 : double(local[0]));
  return 0;
}
