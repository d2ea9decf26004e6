// zest/cuda.hpp — the opt-in umbrella for GPU users: zest.hpp plus the CUDA backend, the
// NCCL communicator and cuda_mesh.
//
//   #include <zest/cuda.hpp>                      // in a .cu file (the kernels need nvcc)
//   zest::cuda_mesh<"dp", "tp"> m(MPI_COMM_WORLD, {2, 2});
//   auto y = zest::einsum<"bsm,mh->bsh">(x, w);   // x, w on m: cuBLAS on each rank's shard
//
// zest.hpp itself never includes CUDA headers, so host-only programs build without the
// CUDA toolkit. Link CUDA::cudart, CUDA::cublas and NCCL (CMake: zest::cuda).
#pragma once

#include "zest/zest.hpp"

#include "zest/backend/cuda/cuda_backend.hpp"
#include "zest/backend/cuda/device_memory.hpp"
#include "zest/comm/nccl_communicator.hpp"
#include "zest/mesh/cuda_mesh.hpp"
