// train_gpt — zest's main job: a GPT trained on the text every Debian system ships, with a
// ZeRO stage chosen on the command line, on any number of MPI ranks.
//
//   mpiexec -n 2 build/default/examples/train_gpt                   # ZeRO-3, the default run
//   mpiexec -n 4 build/default/examples/train_gpt --zero 1 --steps 50 --log run.json
//   build/default/examples/train_gpt --help
//
// Rank 0 prints a progress line per step (loss, tokens/s, model-state and peak memory per
// rank, bytes communicated), then a sample of generated text; --log writes the run as JSON,
// --plot the loss curve as SVG, --save/--load a sharded checkpoint (loadable on another
// number of ranks or another stage). The numbers do not depend on the number of ranks:
// batches, initialisation and dropout are functions of the seed and the global indices.
#include <mpi.h>

#include <array>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>

#include "train_gpt.hpp"

#if !defined(ZEST_TRAIN_GPT_CUDA)
// This build has no CUDA (ZEST_CUDA=OFF, or no nvcc/NCCL found): --device cuda says so.
int train_gpt_example::train_on_cuda(const flags&, const zest::text_dataset&, std::array<int, 2>) {
  throw std::invalid_argument(
      "train_gpt: --device cuda: this build has no CUDA backend; configure with "
      "-DZEST_CUDA=ON on a machine with the CUDA toolkit and NCCL (scripts/gpu-check does)");
}
#endif

int main(int argc, char** argv) {
  using namespace train_gpt_example;
  zest::mpi_environment mpi(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    const auto f = parse(argc, argv);
    if (!f) {
      if (rank == 0) std::cout << usage;
      return 0;
    }
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int ep = f->ep;
    if (ep == 0) {
      ep = 1;
      if (f->moe) {
        for (int d = 1; d <= world; ++d) {
          if (world % d == 0 && f->experts % static_cast<std::size_t>(d) == 0) ep = d;
        }
      }
    }
    if (world % ep != 0) {
      throw std::invalid_argument("train_gpt: --ep " + std::to_string(ep) +
                                  " does not divide the " + std::to_string(world) + " ranks");
    }
    const std::array<int, 2> sizes{world / ep, ep};
    const auto data = f->corpus.empty() ? zest::text_dataset::from_path()
                                        : zest::text_dataset::from_path(f->corpus);
    if (f->device == "cuda") return train_on_cuda(*f, data, sizes);
    return train_on<zest::mesh<"dp", "ep">, zest::float16>(*f, data, sizes);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << rank << "] " << e.what() << '\n';
    // An error that only this rank saw (a bad token id in its shard, a full disk) would
    // leave the others waiting in a collective: take the whole job down.
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
