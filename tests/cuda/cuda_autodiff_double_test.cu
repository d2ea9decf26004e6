// The backend-conformance suite on a cuda_mesh in double (cuda_autodiff_test.cu says the rest).
#include "zest/cuda.hpp"
#define ZEST_TEST_DEVICE_MESH cuda_mesh
#define ZEST_TEST_DEVICE_ROUNDING 1  // fused multiply-adds, CUDA's libm (conformance.hpp)
#define ZEST_TEST_CONFORMANCE_TYPES double
#define ZEST_TEST_CONFORMANCE_NO_ERRORS 1  // run by cuda_autodiff_test.cu
#include "backend/conformance/conformance_test.cpp"
