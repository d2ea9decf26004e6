// tests/einsum/einsum_gshard_test.cpp's specs on a cuda_mesh (cuda_einsum_cases.hpp).
#include "cuda/cuda_einsum_cases.hpp"

using zest::testing::check_gpu_spec;

TEST_CASE("gates GSM,ME->GSE") { check_gpu_spec<"GSM,ME->GSE">(); }
TEST_CASE("dispatch GSEC,GSM->EGCM") { check_gpu_spec<"GSEC,GSM->EGCM">(); }
TEST_CASE("experts EGCM,EMH->EGCH") { check_gpu_spec<"EGCM,EMH->EGCH">(); }
TEST_CASE("combine GSEC,EGCM->GSM") { check_gpu_spec<"GSEC,EGCM->GSM">(); }
