// zest/backend/emulated/emulated_backend.hpp — the GPU's code paths, run on the host.
//
//   zest::emulated_mesh<"dp"> m(MPI_COMM_WORLD, {-1});   // MPI collectives, host memory
//   using x_t = zest::tensor<float, decltype(m), "bm", zest::layout<zest::split<'b', "dp">>>;
//
// Loops are function objects handed to Backend::for_each; the host backend calls their
// host-vectorised members (Eigen array expressions) where they have one, the CUDA backend
// launches them as kernels. This backend is the host backend under another name that does
// not run the host members: its for_each is a plain loop over host memory, so a program on
// an emulated mesh runs exactly the per-element code that a cuda_mesh runs, and the
// conformance suite (tests/backend/conformance/) compares it with the host paths on machines
// without a GPU. Host code stages its shards through host copies (host_staging), as it
// does a GPU's. What it cannot show is what only a GPU does: kernel launches, device
// memory, NCCL.
#pragma once

#include <string_view>

#include "zest/backend/backend.hpp"
#include "zest/backend/host/host_backend.hpp"

namespace zest {

struct emulated_backend : host_backend {
  static constexpr std::string_view name = "emulated";
  static constexpr bool runs_host_loops = false;  // the device's code path, f(i) by f(i)
  // Host code sees its buffers through host copies, as on a GPU (host_staging copies and
  // writes back), although they are host memory.
  static constexpr bool host_addressable = false;
};

static_assert(backend<emulated_backend>);

}  // namespace zest
