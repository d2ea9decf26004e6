// tests/einsum/einsum_reduce_test.cpp's specs on a cuda_mesh (cuda_einsum_cases.hpp).
#include "cuda/cuda_einsum_cases.hpp"

using zest::testing::check_gpu_spec;

TEST_CASE("outer product") { check_gpu_spec<"i,j->ij">(); }
TEST_CASE("batched outer product") { check_gpu_spec<"bi,bj->bij">(); }
TEST_CASE("inner product") { check_gpu_spec<"i,i->">(); }
TEST_CASE("elementwise product") { check_gpu_spec<"ij,ij->ij">(); }
TEST_CASE("Frobenius product") { check_gpu_spec<"ij,ij->">(); }
TEST_CASE("transpose") { check_gpu_spec<"ij->ji">(); }
TEST_CASE("sum over trailing dims") { check_gpu_spec<"ijk->i">(); }
TEST_CASE("sum and permute") { check_gpu_spec<"ijk->kj">(); }
TEST_CASE("sum of everything, in double") { check_gpu_spec<"ij->", double>(); }
TEST_CASE("contraction of a 3-D tensor") { check_gpu_spec<"abc,cd->abd">(); }
