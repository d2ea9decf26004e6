// expect-compiles
// nvcc smoke test: the umbrella header, with Eigen and MPI, in a CUDA translation unit.
// Host code instantiates a few things; the kernel only sees plain data, as device code
// should: the DSL, layouts and concepts stay in host-only code and kernels get plain
// descriptors (docs/design-notes.md, "GPU: one loop body, three ways to run it").
#include <mpi.h>
#include <Eigen/Core>

#include <zest/zest.hpp>

namespace {

template <zest::fixed_string Name>
struct named {
  static constexpr std::string_view name = zest::view_of<Name>;
};

__global__ void scale(float* data, int count, float factor) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < count) data[i] *= factor;
}

}  // namespace

static_assert(named<"dp">::name == "dp");
static_assert(zest::dtype_of<zest::bfloat16>() == zest::dtype::bf16);
static_assert(ZEST_CUDA_COMPILER == 1);

int host_side() {
  const zest::bfloat16 half(0.5F);
  Eigen::Matrix2f m = Eigen::Matrix2f::Identity() * static_cast<float>(half);
  int initialized = 0;
  MPI_Initialized(&initialized);
  scale<<<1, 32>>>(nullptr, 0, m(0, 0));
  return initialized + static_cast<int>(zest::name_of(zest::dtype_of<float>()).size());
}
