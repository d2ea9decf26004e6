// einsum property tests, part 1: matrix products in every orientation, batched and permuted.
#include "einsum/einsum_cases.hpp"

using zest::testing::check_spec;

TEST_CASE("matmul") { check_spec<"ik,kj->ij">(); }
TEST_CASE("matmul, transposed first operand") { check_spec<"ki,kj->ij">(); }
TEST_CASE("matmul, transposed second operand") { check_spec<"ik,jk->ij">(); }
TEST_CASE("matmul, both transposed, transposed output") { check_spec<"ki,jk->ji">(); }
TEST_CASE("batched matmul") { check_spec<"bik,bkj->bij">(); }
TEST_CASE("permuted projection") { check_spec<"bsm,hm->bhs">(); }
TEST_CASE("dense layer") { check_spec<"bsm,mh->bsh">(); }
TEST_CASE("dense layer back projection, in double") { check_spec<"bsh,hm->bsm", double>(); }
TEST_CASE("attention scores") { check_spec<"bhqd,bhkd->bhqk">(); }
TEST_CASE("attention values") { check_spec<"bhqk,bhkd->bhqd">(); }
