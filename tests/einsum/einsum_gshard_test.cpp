// einsum property tests, part 3: GShard's MoE einsums.
#include "einsum/einsum_cases.hpp"

using zest::testing::check_spec;

TEST_CASE("gates GSM,ME->GSE") { check_spec<"GSM,ME->GSE">(); }
TEST_CASE("dispatch GSEC,GSM->EGCM") { check_spec<"GSEC,GSM->EGCM">(); }
TEST_CASE("experts EGCM,EMH->EGCH") { check_spec<"EGCM,EMH->EGCH">(); }
TEST_CASE("combine GSEC,EGCM->GSM") { check_spec<"GSEC,EGCM->GSM">(); }
