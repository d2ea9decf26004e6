// Every op of the vocabulary (autodiff and MoE), forward and backward, on a cuda_mesh against
// the host: the backend-conformance suite (tests/backend/conformance/conformance_test.cpp)
// with the kernels on the GPU. tests/cuda/CMakeLists.txt compiles this file once per element
// type and part of the ops (ZEST_TEST_CONFORMANCE_TYPES, _PARTS, _PART; the error cases in
// one of them), into one program.
#include "zest/cuda.hpp"
#define ZEST_TEST_DEVICE_MESH cuda_mesh
#define ZEST_TEST_DEVICE_ROUNDING 1  // fused multiply-adds, CUDA's libm (conformance.hpp)
#include "backend/conformance/conformance_test.cpp"
