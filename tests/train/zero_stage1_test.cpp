// ZeRO stage 1: equivalence with one rank, bytes and memory against the formulas.
inline constexpr int test_stage = 1;
#include "train/zero_stage_checks.hpp"
