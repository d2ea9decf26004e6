// zest/mesh/cuda_mesh.hpp — a mesh of GPUs: NCCL on every axis, shards in device memory.
//
//   zest::mpi_environment mpi(&argc, &argv);
//   zest::cuda_mesh<"dp", "tp"> m(MPI_COMM_WORLD, {2, 2});   // 4 ranks, one GPU each
//   using w_t = zest::tensor<zest::bfloat16, decltype(m), "mh", zest::layout<zest::split<'m', "dp">>>;
//
// The same grid as zest::mesh (zest/mesh/mesh.hpp); only the communicator differs, and
// through it the backend (nccl_communicator::backend_type = cuda_backend). So a typed
// program moves to GPUs by changing its mesh type. Creating it is collective over the
// parent communicator: every axis (and the world) gets its own NCCL communicator.
// cuda_mesh<"dp"> m; (no arguments) is a one-GPU mesh that needs no MPI.
#pragma once

#include "zest/backend/cuda/cuda_backend.hpp"
#include "zest/comm/nccl_communicator.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/mesh/mesh.hpp"

namespace zest {

// A class rather than an alias template: nvcc's host-code generator loses string-literal
// template arguments that pass through an alias template (docs/design-notes.md).
template <fixed_string... Axes>
class cuda_mesh : public basic_mesh<nccl_communicator, Axes...> {
 public:
  using basic_mesh<nccl_communicator, Axes...>::basic_mesh;
};

}  // namespace zest
