// zest/einsum/spec.hpp — parsing an einsum spec such as "bsm,mh->bsh".
//
// The parser is constexpr: einsum<"..."> runs it at compile time, tools and tests may run
// it at run time. A spec is operands separated by ',' then "->" then the output; each
// letter (a-z, A-Z) names a dim; spaces are ignored. The output is explicit: every letter
// of the output comes from some operand, and no letter repeats within one term.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zest/config.hpp"

namespace zest {

enum class spec_problem : std::uint8_t {
  none,
  missing_arrow,
  bad_character,
  empty_operand_list,
  too_many_operands,
  too_many_dims,
  repeated_in_term,
  output_letter_not_in_operands,
};

constexpr std::string_view describe(spec_problem p) {
  switch (p) {
    case spec_problem::none: return "ok";
    case spec_problem::missing_arrow:
      return "the spec has no \"->\"; write the output explicitly, e.g. \"ik,kj->ij\"";
    case spec_problem::bad_character:
      return "dims are letters a-z, A-Z; terms are separated by ','";
    case spec_problem::empty_operand_list: return "the spec names no operand";
    case spec_problem::too_many_operands: return "more operands than zest::max_operands";
    case spec_problem::too_many_dims: return "a term has more dims than zest::max_dims";
    case spec_problem::repeated_in_term: return "a letter repeats within one term";
    case spec_problem::output_letter_not_in_operands:
      return "an output letter appears in no operand";
  }
  return "?";
}

struct einsum_term {
  std::array<char, max_dims> letters;
  std::uint8_t size;

  constexpr bool operator==(const einsum_term&) const = default;
  constexpr std::string_view view() const { return {letters.data(), size}; }
  constexpr std::size_t index(char c) const {
    for (std::size_t i = 0; i < size; ++i) {
      if (letters[i] == c) return i;
    }
    return std::string_view::npos;
  }
  constexpr bool has(char c) const { return index(c) != std::string_view::npos; }
};

struct einsum_spec {
  std::array<einsum_term, max_operands> inputs{};
  std::uint8_t operand_count = 0;
  einsum_term output{};
  spec_problem problem = spec_problem::none;
  std::uint8_t problem_position = 0;  // character index in the spec

  constexpr bool operator==(const einsum_spec&) const = default;
  constexpr bool ok() const { return problem == spec_problem::none; }

  // In how many operands letter c appears.
  constexpr std::size_t operands_with(char c) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < operand_count; ++i) n += inputs[i].has(c) ? 1U : 0U;
    return n;
  }
  // A letter that some operand has but the output lacks is summed over.
  constexpr bool is_contracted(char c) const { return operands_with(c) > 0 && !output.has(c); }
};

constexpr einsum_spec parse_einsum(std::string_view text) {
  einsum_spec s;
  auto fail = [&](spec_problem p, std::size_t at) {
    s.problem = p;
    s.problem_position = static_cast<std::uint8_t>(at < 255 ? at : 255);
    return s;
  };
  const std::size_t arrow = text.find("->");
  if (arrow == std::string_view::npos) return fail(spec_problem::missing_arrow, text.size());

  auto add_letter = [&](einsum_term& t, char c, std::size_t at) -> spec_problem {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return spec_problem::bad_character;
    if (t.has(c)) return spec_problem::repeated_in_term;
    if (t.size == max_dims) return spec_problem::too_many_dims;
    t.letters[t.size++] = c;
    (void)at;
    return spec_problem::none;
  };

  einsum_term current{};
  bool any = false;
  for (std::size_t i = 0; i < arrow; ++i) {
    const char c = text[i];
    if (c == ' ') continue;
    if (c == ',') {
      if (s.operand_count == max_operands) return fail(spec_problem::too_many_operands, i);
      s.inputs[s.operand_count++] = current;
      current = einsum_term{};
      continue;
    }
    any = true;
    if (auto p = add_letter(current, c, i); p != spec_problem::none) return fail(p, i);
  }
  if (!any && s.operand_count == 0) return fail(spec_problem::empty_operand_list, 0);
  if (s.operand_count == max_operands) return fail(spec_problem::too_many_operands, arrow);
  s.inputs[s.operand_count++] = current;

  for (std::size_t i = arrow + 2; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ') continue;
    if (auto p = add_letter(s.output, c, i); p != spec_problem::none) return fail(p, i);
    if (s.operands_with(c) == 0) return fail(spec_problem::output_letter_not_in_operands, i);
  }
  return s;
}

}  // namespace zest
