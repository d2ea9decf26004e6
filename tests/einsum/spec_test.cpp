// The einsum spec parser, at compile time and at run time.
#include <doctest/doctest.h>

#include <string>

#include "zest/einsum/spec.hpp"

namespace {
using namespace zest;

constexpr einsum_spec mm = parse_einsum("ik,kj->ij");
static_assert(mm.ok() && mm.operand_count == 2);
static_assert(mm.inputs[0].view() == "ik" && mm.inputs[1].view() == "kj" &&
              mm.output.view() == "ij");
static_assert(mm.is_contracted('k') && !mm.is_contracted('i'));
static_assert(parse_einsum("GSEC,GSM->EGCM").ok());
static_assert(parse_einsum(" bsm , mh -> bsh ").output.view() == "bsh");
static_assert(parse_einsum("ij->").ok() && parse_einsum("ij->").output.size == 0);
static_assert(parse_einsum("i,j->ij").operands_with('i') == 1);
static_assert(parse_einsum("ik,kj").problem == spec_problem::missing_arrow);
static_assert(parse_einsum("i1,kj->ij").problem == spec_problem::bad_character);
static_assert(parse_einsum("iik->k").problem == spec_problem::repeated_in_term);
static_assert(parse_einsum("ik->ii").problem == spec_problem::repeated_in_term);
static_assert(parse_einsum("ik->iz").problem == spec_problem::output_letter_not_in_operands);
static_assert(parse_einsum("a,b,c,d,e->a").problem == spec_problem::too_many_operands);
static_assert(parse_einsum("abcdefghijklm->a").problem == spec_problem::too_many_dims);

TEST_CASE("the parser runs at run time too and reports where it stopped") {
  const std::string text = "ab,bc->aq";
  const einsum_spec s = parse_einsum(text);
  CHECK(s.problem == spec_problem::output_letter_not_in_operands);
  CHECK(s.problem_position == 8);
  CHECK(describe(s.problem).find("output letter") != std::string_view::npos);
  CHECK(parse_einsum("bik,bkj->bij").inputs[1].view() == "bkj");
}
}  // namespace
