// ZeRO stages 0 to 3: equivalence with one rank, bytes and memory against the formulas
// (train/zero_stage_checks.hpp). One translation unit for the four stages (and, by the
// unity build of tests/train/CMakeLists.txt, for mixed precision and checkpoints): they
// share the model, the autodiff and the communication code that a TU otherwise compiles
// anew (bench/README.md). Each stage's cases form the doctest suite train_zero<K>, which
// CTest runs as the tests train_zero<K>_np<N>.
#include <doctest/doctest.h>

#include "train/zero_stage_checks.hpp"

namespace {
using zest::testing::zero_stage_checks;

#define ZEST_ZERO_STAGE_CASES(K)                                                          \
  TEST_CASE("ZeRO stage " #K ": N ranks train like one rank" *                            \
            doctest::test_suite("train_zero" #K)) {                                       \
    zero_stage_checks<K>::trains_like_one_rank();                                         \
  }                                                                                       \
  TEST_CASE("ZeRO stage " #K ": bytes communicated per step equal the formula" *          \
            doctest::test_suite("train_zero" #K)) {                                       \
    zero_stage_checks<K>::bytes_equal_formula();                                          \
  }                                                                                       \
  TEST_CASE("ZeRO stage " #K ": model-state bytes per rank equal the formula" *           \
            doctest::test_suite("train_zero" #K)) {                                       \
    zero_stage_checks<K>::states_equal_formula();                                         \
  }                                                                                       \
  TEST_CASE("ZeRO stage " #K ": buckets and prefetch change the calls, not the numbers" * \
            doctest::test_suite("train_zero" #K)) {                                       \
    zero_stage_checks<K>::buckets_change_calls_not_numbers();                             \
  }

ZEST_ZERO_STAGE_CASES(0)
ZEST_ZERO_STAGE_CASES(1)
ZEST_ZERO_STAGE_CASES(2)
ZEST_ZERO_STAGE_CASES(3)

#undef ZEST_ZERO_STAGE_CASES
}  // namespace
