// Every op of the vocabulary (autodiff and MoE), forward and backward, on a cuda_mesh against
// the host: the backend-conformance suite (tests/backend/conformance/conformance_test.cpp)
// with the kernels on the GPU. This TU: float and the error cases; double is
// cuda_autodiff_double_test.cu's (one program, two TUs that nvcc compiles in parallel).
#include "zest/cuda.hpp"
#define ZEST_TEST_DEVICE_MESH cuda_mesh
#define ZEST_TEST_DEVICE_ROUNDING 1  // fused multiply-adds, CUDA's libm (conformance.hpp)
#define ZEST_TEST_CONFORMANCE_TYPES float
#include "backend/conformance/conformance_test.cpp"
