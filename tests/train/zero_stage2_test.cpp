// ZeRO stage 2: equivalence with one rank, bytes and memory against the formulas.
inline constexpr int test_stage = 2;
#include "train/zero_stage_checks.hpp"
