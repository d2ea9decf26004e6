// expect: compile this translation unit with nvcc
// A TU that g++ compiles may drive redistribute, einsum and the collectives on device
// tensors when the program links zest::cuda_kernels (ZEST_CUDA_PREBUILT_KERNELS), not the
// autodiff ops' loops: those kernels exist only where nvcc compiles their launch, and the
// error says so at the top, not at link time.
#include <zest/autodiff/ops.hpp>
#include <zest/mesh/cuda_mesh.hpp>

int main() {
  using mesh_t = zest::cuda_mesh<"dp">;
  using x_t = zest::tensor<float, mesh_t, "bm">;
  const mesh_t m;
  zest::autodiff::tape t;
  auto x = t.parameter(x_t(m, {2, 3}));
  auto y = zest::autodiff::exp(x);
  (void)y;
}
