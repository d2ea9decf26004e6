// tests/einsum/einsum_matmul_test.cpp's specs on a cuda_mesh (cuda_einsum_cases.hpp), first part.
#include "cuda/cuda_einsum_cases.hpp"

using zest::testing::check_gpu_spec;

TEST_CASE("matmul") { check_gpu_spec<"ik,kj->ij">(); }
TEST_CASE("matmul, transposed first operand") { check_gpu_spec<"ki,kj->ij">(); }
TEST_CASE("matmul, transposed second operand") { check_gpu_spec<"ik,jk->ij">(); }
TEST_CASE("matmul, both transposed, transposed output") { check_gpu_spec<"ki,jk->ji">(); }
TEST_CASE("batched matmul") { check_gpu_spec<"bik,bkj->bij">(); }
TEST_CASE("permuted projection") { check_gpu_spec<"bsm,hm->bhs">(); }
TEST_CASE("dense layer") { check_gpu_spec<"bsm,mh->bsh">(); }
