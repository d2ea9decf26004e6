// train_gpt_cuda.cu — train_gpt's --device cuda: the run of train_gpt.hpp on a
// zest::cuda_mesh (one GPU per rank, NCCL on every axis, tensors in device memory). Compiled
// by nvcc into train_gpt when the build has CUDA (examples/CMakeLists.txt).
#include "train_gpt.hpp"
#include "zest/cuda.hpp"

#include <cstdio>

int train_gpt_example::train_on_cuda(const flags& f, const zest::text_dataset& data,
                                     mesh_sizes_t sizes) {
  // No driver or no device: the "no usable GPU" code (77) on every rank, with CUDA's reason;
  // any other failure of CUDA's start throws and takes the job down as an error.
  if (const auto seen = zest::cuda::visible_devices(); seen.count == 0) {
    std::fprintf(stderr, "train_gpt: --device cuda: no usable GPU: %s\n", seen.why_none.c_str());
    return 77;
  }
  return train_on<zest::cuda_mesh<"node", "dp", "ep">, gpt_arch>(f, data, sizes);
}
