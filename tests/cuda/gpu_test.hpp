// tests/cuda/gpu_test.hpp — what the GPU test main (gpu_main.cpp) offers the GPU tests.
//
//   const auto& m = zest::testing::shared_gpu_mesh<zest::cuda_mesh<"dp", "tp">>({2, 1});
//
// NCCL's communicator setup is the slow part of a GPU test, so meshes are made once per shape
// and kept; gpu_main destroys them (and anything else registered) before MPI_Finalize, on
// every rank in the same order, as NCCL and MPI require.
#pragma once

#include <mpi.h>

#include <array>
#include <functional>
#include <map>
#include <memory>

namespace zest::testing {

// Runs f after the tests, before MPI_Finalize (last registered, first run).
void before_finalize(std::function<void()> f);

template <class Mesh>
const Mesh& shared_gpu_mesh(const std::array<int, Mesh::axis_count>& shape) {
  static std::map<std::array<int, Mesh::axis_count>, std::unique_ptr<Mesh>>* meshes = [] {
    auto* m = new std::map<std::array<int, Mesh::axis_count>, std::unique_ptr<Mesh>>;  // NOLINT
    before_finalize([m] { m->clear(); });
    return m;
  }();
  auto& slot = (*meshes)[shape];
  if (!slot) slot = std::make_unique<Mesh>(MPI_COMM_WORLD, shape);
  return *slot;
}

}  // namespace zest::testing
