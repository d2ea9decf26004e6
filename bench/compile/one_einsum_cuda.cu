// one_einsum_cuda — bench/compile/one_einsum.cpp on a cuda_mesh: zest/cuda.hpp (all of zest
// and the CUDA backend), one einsum with its kernels. Not run by anything; bench/run compiles
// it alone where nvcc is found, to measure what zest costs nvcc (METRIC
// compile_cpu_s_one_einsum_cuda, compile_peak_mib_one_einsum_cuda: the largest of nvcc's
// processes, which is cudafe++'s or cicc's front end, both EDG).
#include <mpi.h>

#include <cstdio>

#include "zest/cuda.hpp"

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  using mesh_t = zest::cuda_mesh<"dp">;
  using x_t = zest::tensor<float, mesh_t, "bm", zest::layout<zest::split<'b', "dp">>>;
  using w_t = zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "dp">>>;
  const mesh_t mesh(MPI_COMM_WORLD, {-1});
  const auto x = x_t::generate(mesh, {8, 16}, [](auto i) { return float(i[0] + i[1]); });
  const auto w = w_t::generate(mesh, {16, 4}, [](auto i) { return float(i[0]) - float(i[1]); });
  const auto y = zest::einsum<"bm,mh->bh">(x, w);
  const auto host = zest::to_global(y);
  std::printf("rank %d: %zu elements, first %g\n", mesh.rank(), host.size(),
              host.empty() ? 0.0 : double(host[0]));
  return 0;
}
