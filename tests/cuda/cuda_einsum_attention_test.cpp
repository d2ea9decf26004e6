// tests/einsum/einsum_matmul_test.cpp's specs on a cuda_mesh (cuda_einsum_cases.hpp), second
// part: attention and double; and two specs in bfloat16, which the host tests do not run.
#include "cuda/cuda_einsum_cases.hpp"

using zest::testing::check_gpu_spec;

TEST_CASE("dense layer back projection, in double") { check_gpu_spec<"bsh,hm->bsm", double>(); }
TEST_CASE("attention scores") { check_gpu_spec<"bhqd,bhkd->bhqk">(); }
TEST_CASE("attention values") { check_gpu_spec<"bhqk,bhkd->bhqd">(); }
TEST_CASE("matmul, in bfloat16") { check_gpu_spec<"ik,kj->ij", zest::bfloat16>(); }
TEST_CASE("attention scores, in bfloat16") { check_gpu_spec<"bhqd,bhkd->bhqk", zest::bfloat16>(); }
