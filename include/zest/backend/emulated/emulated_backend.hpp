// zest/backend/emulated/emulated_backend.hpp — the GPU's code paths, run on the host.
//
//   zest::emulated_mesh<"dp"> m(MPI_COMM_WORLD, {-1});   // MPI collectives, host memory
//   using x_t = zest::tensor<float, decltype(m), "bm", zest::layout<zest::split<'b', "dp">>>;
//
// A backend is "host" or not; code with a vectorised host loop (Eigen array expressions,
// BLAS) takes it on the host backend and runs its generic form, a function object handed to
// Backend::for_each, on every other backend. The CUDA backend launches those function
// objects as kernels. This backend is the host backend under another name: its for_each is
// a plain loop over host memory, so a program on an emulated mesh runs exactly the generic
// code that a cuda_mesh runs, and its tests (tests/*/emulated_*) compare it with the host
// paths on machines without a GPU. What it cannot show is what only a GPU does: kernel
// launches, device memory, NCCL.
#pragma once

#include <string_view>

#include "zest/backend/backend.hpp"
#include "zest/backend/host/host_backend.hpp"

namespace zest {

struct emulated_backend : host_backend {
  static constexpr std::string_view name = "emulated";
};

static_assert(backend<emulated_backend>);

}  // namespace zest
