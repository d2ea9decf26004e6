// zest/core/fixed_string.hpp — string literals usable as template arguments.
//
//   template <zest::fixed_string S> struct named {};
//   named<"dp"> n;   // S.size() == 2, S.view() == "dp"
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "zest/config.hpp"

namespace zest {

template <std::size_t N>
struct fixed_string {
  char data[N] = {};  // includes the terminating zero

  constexpr fixed_string() = default;
  constexpr fixed_string(const char (&s)[N]) {
    std::copy_n(s, N, data);
  }  // NOLINT: implicit by design

  static constexpr std::size_t size() { return N - 1; }
  constexpr std::string_view view() const { return {data, N - 1}; }
  constexpr char operator[](std::size_t i) const { return data[i]; }
  // Index of c, or npos. A plain loop: string_view::find on a template parameter object is
  // not a constant expression for g++ 12 under -fsanitize=undefined.
  constexpr std::size_t find(char c) const {
    for (std::size_t i = 0; i + 1 < N; ++i) {
      if (data[i] == c) return i;
    }
    return std::string_view::npos;
  }
  constexpr bool contains(char c) const { return find(c) != std::string_view::npos; }

  template <std::size_t M>
  constexpr bool operator==(const fixed_string<M>& other) const {
    return view() == other.view();
  }
};

template <std::size_t N>
fixed_string(const char (&)[N]) -> fixed_string<N>;

}  // namespace zest
