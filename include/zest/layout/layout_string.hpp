// zest/layout/layout_string.hpp — a layout string back to its layout value.
//
//   using mesh_t = zest::mesh<"dp", "tp">;
//   zest::layout_value v = zest::parse_layout("split(b:dp) partial(tp)", mesh_t::axis_names);
//   v == X::layout;                       // for X = tensor<..., layout<split<'b',"dp">, partial<"tp">>>
//   zest::parse_layout(zest::layout_string<X>(), mesh_t::axis_names) == X::layout   // always
//
// The text is what to_string(layout_value, names) and layout_string<X>() print (checkpoints
// record it too): "replicate", or placements separated by blanks, each one of
//   split(d:a)          dim d cut over mesh axis a
//   split(d:a,b,...)    dim d cut over a, each block again over b, ... (nesting order, major first)
//   partial(a)          a pending sum over axis a
// Axes not named are replicated. Placements may come in any order; blanks around the
// placements are ignored, none are allowed inside one. Anything else (an unknown axis, an
// axis used twice, a dim split twice, a dim that is not a letter, "replicate" next to
// other placements) throws zest::shape_error naming the text, the position and the problem.
//
// parse_layout is constexpr: with a valid literal it can be checked at compile time,
//   static_assert(zest::parse_layout("split(b:dp)", mesh_t::axis_names) == X::layout);
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/placement.hpp"

namespace zest {

namespace detail {

// The error path, kept out of constant evaluation (a throw there is a compile error anyway).
[[noreturn]] inline void layout_parse_failure(std::string_view text, std::size_t pos,
                                              std::string_view problem) {
  throw shape_error(
      message("zest: parse_layout: \"", text, "\": at position ", pos, ": ", problem));
}

constexpr bool layout_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
constexpr bool layout_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace detail

// The layout value that `text` describes over a mesh with the given axis names (in mesh
// order: Mesh::axis_names, or any array of string_views). See the top of this file.
template <class AxisNames>
constexpr layout_value parse_layout(std::string_view text, const AxisNames& names) {
  const std::size_t n = names.size();
  if (n > max_axes) detail::layout_parse_failure(text, 0, "more mesh axes than zest::max_axes");
  // Every entry written one by one rather than taken from replicated_layout(n): g++ 12 was
  // seen to give trailing entries of a layout_value made by default initialisation a kind of
  // 0 at run time in files that hold many tensor types (issue 10, tests/layout_stress/).
  layout_value v;
  for (std::size_t a = 0; a < max_axes; ++a)
    v.axes[a] = axis_placement{placement_kind::replicate, 0, 0};
  v.axis_count = static_cast<std::uint8_t>(n);
  std::array<bool, max_axes> used{};
  std::size_t pos = 0;
  std::size_t placements = 0;
  bool said_replicate = false;

  auto fail = [&](std::string_view problem) { detail::layout_parse_failure(text, pos, problem); };
  auto skip_blanks = [&] {
    while (pos < text.size() && detail::layout_blank(text[pos])) ++pos;
  };
  auto take = [&](std::string_view word) {
    if (text.substr(pos, word.size()) != word) return false;
    pos += word.size();
    return true;
  };
  auto expect = [&](char c, std::string_view problem) {
    if (pos >= text.size() || text[pos] != c) fail(problem);
    ++pos;
  };
  // An axis name runs up to the next ',' or ')'; it must be one of `names`, not used yet.
  auto axis = [&]() -> std::size_t {
    const std::size_t start = pos;
    while (pos < text.size() && text[pos] != ',' && text[pos] != ')' &&
           !detail::layout_blank(text[pos]))
      ++pos;
    const std::string_view name = text.substr(start, pos - start);
    if (name.empty()) {
      pos = start;
      fail("expected a mesh axis name");
    }
    std::size_t a = 0;
    while (a < n && names[a] != name) ++a;
    if (a == n) {
      pos = start;
      fail("not an axis of the mesh");
    }
    if (used[a]) {
      pos = start;
      fail("this mesh axis is already used by an earlier placement");
    }
    used[a] = true;
    return a;
  };

  skip_blanks();
  if (pos == text.size()) fail("empty text; a layout is \"replicate\" or placements");
  while (pos < text.size()) {
    if (said_replicate) fail("\"replicate\" stands alone");
    const std::size_t start = pos;
    if (take("split(")) {
      const char d = pos < text.size() ? text[pos] : '\0';
      if (!detail::layout_letter(d)) fail("expected a dim letter (a-z, A-Z) after \"split(\"");
      if (v.split_count(d) != 0) fail("this dim is already split by an earlier placement");
      ++pos;
      expect(':', "expected ':' after the dim letter, e.g. split(b:dp)");
      std::uint8_t order = 0;
      while (true) {
        const std::size_t a = axis();
        v.axes[a] = axis_placement{placement_kind::split, d, order++};
        if (pos < text.size() && text[pos] == ',') {
          ++pos;
          continue;
        }
        expect(')', "expected ',' or ')' after an axis name");
        break;
      }
    } else if (take("partial(")) {
      const std::size_t a = axis();
      v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
      expect(')', "expected ')' after the axis name, e.g. partial(tp)");
    } else if (take("replicate")) {
      if (placements != 0) {
        pos = start;
        fail("\"replicate\" stands alone");
      }
      said_replicate = true;
    } else {
      fail("expected \"split(\", \"partial(\" or \"replicate\"");
    }
    ++placements;
    if (pos < text.size() && !detail::layout_blank(text[pos]))
      fail("expected a blank between placements");
    skip_blanks();
  }
  return v;
}

}  // namespace zest
