// einsum property tests, part 2: outer products, elementwise products, transposes, reductions.
#include "einsum/einsum_cases.hpp"

using zest::testing::check_spec;

TEST_CASE("outer product") { check_spec<"i,j->ij">(); }
TEST_CASE("batched outer product") { check_spec<"bi,bj->bij">(); }
TEST_CASE("inner product") { check_spec<"i,i->">(); }
TEST_CASE("elementwise product") { check_spec<"ij,ij->ij">(); }
TEST_CASE("Frobenius product") { check_spec<"ij,ij->">(); }
TEST_CASE("transpose") { check_spec<"ij->ji">(); }
TEST_CASE("sum over trailing dims") { check_spec<"ijk->i">(); }
TEST_CASE("sum and permute") { check_spec<"ijk->kj">(); }
TEST_CASE("sum of everything, in double") { check_spec<"ij->", double>(); }
TEST_CASE("contraction of a 3-D tensor") { check_spec<"abc,cd->abd">(); }
