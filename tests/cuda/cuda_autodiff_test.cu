// Every op of the vocabulary (autodiff and MoE), forward and backward, on a cuda_mesh against
// the host: the backend-conformance suite (tests/backend/conformance/conformance_test.cpp)
// with the kernels on the GPU.
#include "zest/cuda.hpp"
#define ZEST_TEST_DEVICE_MESH cuda_mesh
#include "backend/conformance/conformance_test.cpp"
