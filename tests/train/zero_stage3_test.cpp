// ZeRO stage 3: equivalence with one rank, bytes and memory against the formulas.
inline constexpr int test_stage = 3;
#include "train/zero_stage_checks.hpp"
