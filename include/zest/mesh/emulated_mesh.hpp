// zest/mesh/emulated_mesh.hpp — a mesh whose tensors take the GPU's code paths on the host.
//
//   zest::emulated_mesh<"dp", "ep"> m(MPI_COMM_WORLD, {2, 2});
//
// zest::mesh with MPI collectives on host memory, but its communicator names the emulated
// backend (zest/backend/emulated/emulated_backend.hpp): every operation runs the generic
// function objects that the CUDA backend runs as kernels. For tests of that code on
// machines without a GPU, and for reading it in a debugger.
#pragma once

#include "zest/config.hpp"

#if ZEST_HAS_MPI

#include "zest/backend/emulated/emulated_backend.hpp"
#include "zest/comm/mpi_communicator.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/mesh/mesh.hpp"

namespace zest {

// The MPI communicator, naming the emulated backend.
class emulated_communicator : public mpi_communicator {
 public:
  using backend_type = emulated_backend;
  using mpi_communicator::mpi_communicator;
};

// A class rather than an alias template, like zest::mesh (docs/design-notes.md).
template <fixed_string... Axes>
class emulated_mesh : public basic_mesh<emulated_communicator, Axes...> {
 public:
  using basic_mesh<emulated_communicator, Axes...>::basic_mesh;
};

}  // namespace zest

#endif  // ZEST_HAS_MPI
