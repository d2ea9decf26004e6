// zest/core/fixed_string.hpp — string literals usable as template arguments.
//
//   template <zest::fixed_string S> struct named {};
//   named<"dp"> n;   // S.size() == 2, zest::view_of<S> == "dp", S[1] == 'p'
//
// A template argument must have exactly one spelling in every compiler's mangled names
// (docs/design-notes.md, "Template arguments have one spelling"). g++ 12 mangles and emits a
// class-type template argument from the constant evaluator's internal form of its value,
// which can drop or merge array elements that are zero or equal to their neighbour. So the
// value stored here has no such element: position i holds the code (i + 1) * 256 + c, every
// code is non-zero and no two are equal, and every element is written by the constructor.
// The characters themselves live outside the value, in `view_of<S>`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "zest/config.hpp"

namespace zest {

// N counts the terminating zero, as the literal's array type does: "dp" is fixed_string<3>.
template <std::size_t N>
struct fixed_string {
  static_assert(N >= 1 && N < (std::size_t{1} << 23), "zest fixed_string: bad length");
  std::uint32_t code[N];  // code[i] = (i + 1) * 256 + char; code[N - 1] ends the string

  // All zeros (size() characters '\0'): for strings that a constexpr function then fills.
  constexpr fixed_string() : fixed_string(std::make_index_sequence<N>{}) {}
  constexpr fixed_string(const char (&s)[N])  // NOLINT: implicit by design
      : fixed_string(s, std::make_index_sequence<N>{}) {}

  // The value from its codes: nvcc's host-code generator writes a template argument back in
  // this form (fixed_string<3>{{372, 624, 768}}). Codes that no string has are refused.
  constexpr fixed_string(const std::uint32_t (&codes)[N])  // NOLINT: implicit by design
      : fixed_string(codes, std::make_index_sequence<N>{}) {
    for (std::size_t i = 0; i < N; ++i) {
      if ((code[i] >> 8U) != i + 1 || (i + 1 == N && (code[i] & 0xFFU) != 0)) {
        throw "zest fixed_string: not the codes of a string";
      }
    }
  }

  static constexpr std::size_t size() { return N - 1; }
  constexpr char operator[](std::size_t i) const {
    return static_cast<char>(static_cast<unsigned char>(code[i] & 0xFFU));
  }
  constexpr void set(std::size_t i, char c) { code[i] = encode(i, i + 1 < N ? c : '\0'); }
  // Index of c, or npos.
  constexpr std::size_t find(char c) const {
    for (std::size_t i = 0; i + 1 < N; ++i) {
      if ((*this)[i] == c) return i;
    }
    return std::string_view::npos;
  }
  constexpr bool contains(char c) const { return find(c) != std::string_view::npos; }
  // The characters and a terminating zero, for code that wants a char array.
  constexpr std::array<char, N> chars() const {
    std::array<char, N> out{};
    for (std::size_t i = 0; i + 1 < N; ++i) out[i] = (*this)[i];
    return out;
  }
  constexpr bool equals(std::string_view s) const {
    if (s.size() != N - 1) return false;
    for (std::size_t i = 0; i + 1 < N; ++i) {
      if ((*this)[i] != s[i]) return false;
    }
    return true;
  }

  template <std::size_t M>
  constexpr bool operator==(const fixed_string<M>& other) const {
    if constexpr (M != N) {
      return false;
    } else {
      for (std::size_t i = 0; i < N; ++i) {
        if (code[i] != other.code[i]) return false;
      }
      return true;
    }
  }

 private:
  static constexpr std::uint32_t encode(std::size_t i, char c) {
    return static_cast<std::uint32_t>((i + 1) << 8U) |
           static_cast<std::uint32_t>(static_cast<unsigned char>(c));
  }
  template <std::size_t... I>
  constexpr explicit fixed_string(std::index_sequence<I...>) : code{encode(I, '\0')...} {}
  template <std::size_t... I>
  constexpr fixed_string(const std::uint32_t (&c)[N], std::index_sequence<I...>) : code{c[I]...} {}
  template <std::size_t... I>
  constexpr fixed_string(const char (&s)[N], std::index_sequence<I...>)
      : code{encode(I, I + 1 < N ? s[I] : '\0')...} {}
};

template <std::size_t N>
fixed_string(const char (&)[N]) -> fixed_string<N>;

namespace detail {
template <fixed_string S>
struct spelling {
  static constexpr std::array<char, S.size() + 1> chars = S.chars();
};
}  // namespace detail

// The characters of S, with static storage: view_of<"dp"> == "dp".
template <fixed_string S>
inline constexpr std::string_view view_of{detail::spelling<S>::chars.data(), S.size()};

}  // namespace zest
