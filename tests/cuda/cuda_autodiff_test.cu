// Every autodiff operation, forward and backward, on a cuda_mesh against the host: the
// emulated-backend test (tests/autodiff/emulated_ops_test.cpp) with the kernels on the GPU.
#include "zest/cuda.hpp"
#define ZEST_TEST_DEVICE_MESH cuda_mesh
#include "autodiff/emulated_ops_test.cpp"
