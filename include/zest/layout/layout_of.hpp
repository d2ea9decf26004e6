// zest/layout/layout_of.hpp — the layout of a tensor type, as a type and as text.
//
//   auto y = zest::einsum<"bsm,mh->bsh">(x, w);        // a layout deduced by the einsum
//   using y_layout = zest::layout_of_t<decltype(y)>;    // zest::layout<split<'b', "dp">, ...>
//   using z_t = zest::tensor<float, mesh_t, "bm", y_layout>;   // another tensor laid out alike
//
//   static_assert(zest::layout_is<decltype(y), zest::layout<zest::split<'b', "dp">>>);
//   static_assert(zest::show_layout<decltype(y)>);      // stops the compile, printing the layout
//
// layout_of_t<X> writes X's layout back in the spelling users write: one placement per mesh
// axis that is not replicated, in mesh order, a split over several axes written once with its
// axes major first. tensor<T, Mesh, Dims, layout_of_t<X>> is X again for X's own T, Mesh
// and Dims. X may be a tensor type or anything with a nested tensor_type naming one (an
// autodiff variable).
//
// The text is layout_string<X>()'s, which explain, visualize and the run-time errors print:
// "replicate", or placements such as "split(b:dp) partial(tp)" and "split(m:dp,tp)".
// layout_text_v<X> holds it at compile time; show_layout and layout_is put it into the name
// of a class template whose instantiation fails, which is the part of an error that every
// compiler prints. g++ 12 and clang 19 both print the text as a string literal:
//
//   g++:   In instantiation of 'struct zest::deduced_layout<zest::layout_text<24>{"split(b:dp)
//          partial(tp)"}>': ... error: static assertion failed: zest show_layout: ...
//   clang: error: static assertion failed due to requirement 'pieces == 0': zest show_layout: ...
//          note: in instantiation of template class 'zest::deduced_layout<layout_text<n + 1>
//          {"split(b:dp) partial(tp)"}>' requested here
//
//   and for layout_is, layout_mismatch<actual_layout<{"split(b:dp) partial(tp)"}>,
//   expected_layout<{"split(b:dp)"}>> (abridged). clang prints a string argument whole only up
//   to 36 characters, so a longer text comes in pieces of at most 32, cut between placements:
//   deduced_layout<{"split(b:tensor)"}, {"split(m:expert,data)"}, {"partial(pipe)"}>.
//
// The text is carried by layout_text (characters as they are), not by fixed_string: a
// fixed_string stores codes that the compilers print as numbers ({{371U, 624U, ...}}, see
// zest/core/fixed_string.hpp). A layout_text is only ever a template argument of a class
// that fails to compile, so no symbol is ever made from it.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/placement.hpp"

namespace zest {

// ---------------------------------------------------------------------------------------
// A layout value written back as a layout type, for APIs that take one (einsum's forced
// output layout): layout_type_of<Mesh, v> is zest::layout<placements...>, one placement per
// non-replicated axis, a split over several axes written once with its axes major first.
namespace detail {

template <class Mesh, std::size_t Axis>
constexpr auto axis_name() {
  constexpr std::string_view name = Mesh::axis_names[Axis];
  fixed_string<name.size() + 1> out;
  for (std::size_t i = 0; i < name.size(); ++i) out.set(i, name[i]);
  return out;
}

// split<Dim, names...> of the Count axes that split Dim in L, major first. Written out for
// each count rather than deduced from an index sequence: nvcc's front end does not deduce
// split<Dim, axis_name<...>()...> (docs/design-notes.md, "Compiler notes").
template <class Mesh, layout_key L, char Dim, std::size_t K>
inline constexpr auto split_axis_name_v = axis_name<Mesh, to_layout(L).split_axis(Dim, K)>();
template <class Mesh, layout_key L, char Dim, std::size_t Count>
struct split_of;
template <class Mesh, layout_key L, char Dim>
struct split_of<Mesh, L, Dim, 1> {
  using type = split<Dim, split_axis_name_v<Mesh, L, Dim, 0>>;
};
template <class Mesh, layout_key L, char Dim>
struct split_of<Mesh, L, Dim, 2> {
  using type = split<Dim, split_axis_name_v<Mesh, L, Dim, 0>, split_axis_name_v<Mesh, L, Dim, 1>>;
};
template <class Mesh, layout_key L, char Dim>
struct split_of<Mesh, L, Dim, 3> {
  using type = split<Dim, split_axis_name_v<Mesh, L, Dim, 0>, split_axis_name_v<Mesh, L, Dim, 1>,
                     split_axis_name_v<Mesh, L, Dim, 2>>;
};
template <class Mesh, layout_key L, char Dim>
struct split_of<Mesh, L, Dim, 4> {
  using type = split<Dim, split_axis_name_v<Mesh, L, Dim, 0>, split_axis_name_v<Mesh, L, Dim, 1>,
                     split_axis_name_v<Mesh, L, Dim, 2>, split_axis_name_v<Mesh, L, Dim, 3>>;
};
template <class Mesh, layout_key L, char Dim>
struct split_of<Mesh, L, Dim, 5> {
  using type = split<Dim, split_axis_name_v<Mesh, L, Dim, 0>, split_axis_name_v<Mesh, L, Dim, 1>,
                     split_axis_name_v<Mesh, L, Dim, 2>, split_axis_name_v<Mesh, L, Dim, 3>,
                     split_axis_name_v<Mesh, L, Dim, 4>>;
};
template <class Mesh, layout_key L, char Dim>
struct split_of<Mesh, L, Dim, 6> {
  using type = split<Dim, split_axis_name_v<Mesh, L, Dim, 0>, split_axis_name_v<Mesh, L, Dim, 1>,
                     split_axis_name_v<Mesh, L, Dim, 2>, split_axis_name_v<Mesh, L, Dim, 3>,
                     split_axis_name_v<Mesh, L, Dim, 4>, split_axis_name_v<Mesh, L, Dim, 5>>;
};
static_assert(max_axes == 6, "zest layout_type_for: split_of is written out for max_axes axes");

// The placements that mesh axis A contributes: none for replicate and for the inner axes
// of a nested split (they are written with the split's first axis).
template <class Mesh, layout_key L, std::size_t A>
constexpr auto placements_of_axis() {
  constexpr layout_value v = to_layout(L);
  constexpr axis_placement p = v.axes[A];
  if constexpr (p.kind == placement_kind::partial) {
    return std::tuple<partial<axis_name<Mesh, A>()>>{};
  } else if constexpr (p.kind == placement_kind::split && p.order == 0) {
    return std::tuple<typename split_of<Mesh, L, p.dim, v.split_count(p.dim)>::type>{};
  } else {
    return std::tuple<>{};
  }
}

template <class Tuple>
struct layout_from_tuple;
template <class... P>
struct layout_from_tuple<std::tuple<P...>> {
  using type = layout<P...>;
};

template <class Mesh, layout_key L, std::size_t... A>
auto layout_type_of(std::index_sequence<A...>) ->
    typename layout_from_tuple<decltype(std::tuple_cat(placements_of_axis<Mesh, L, A>()...))>::type;

}  // namespace detail

// layout_type_for<Mesh, L>::type, or the alias layout_type_of<Mesh, L> where L is not
// dependent (g++ 12 and dependent class-type arguments: see with_layout_for,
// zest/tensor/tensor.hpp).
template <class Mesh, layout_key L>
struct layout_type_for {
  using type =
      decltype(detail::layout_type_of<Mesh, L>(std::make_index_sequence<Mesh::axis_count>{}));
};
template <class Mesh, layout_key L>
using layout_type_of = typename layout_type_for<Mesh, L>::type;

namespace detail {

// The tensor type behind X: X itself, or X::tensor_type (an autodiff variable).
template <class X, class = void>
struct tensor_behind {
  using type = std::remove_cvref_t<X>;
};
template <class X>
struct tensor_behind<X, std::void_t<typename std::remove_cvref_t<X>::tensor_type>> {
  using type = typename std::remove_cvref_t<X>::tensor_type;
};

template <class X>
concept layout_carrier = requires {
  typename X::zest_tensor_tag;
  typename X::mesh_type;
  { X::layout } -> std::convertible_to<layout_value>;
};

template <class X>
struct not_a_tensor_type {
  static_assert(layout_carrier<X>,
                "zest layout_of_t / layout_text_v / show_layout / layout_is: the argument is "
                "not a zest tensor type (nor an autodiff variable). Fix: pass the tensor's "
                "type, e.g. layout_of_t<decltype(y)> (the argument is shown above).");
  using type = void;
};

template <class X, bool = layout_carrier<X>>
struct layout_of_impl : not_a_tensor_type<X> {};
template <class X>
struct layout_of_impl<X, true> {
  using type = typename layout_type_for<typename X::mesh_type, layout_key(X::layout)>::type;
};

template <class Names>
constexpr std::size_t layout_text_length(layout_value v, const Names& names) {
  std::size_t n = 0;
  write_layout_text(v, names, [&](std::string_view s) { n += s.size(); });
  return n;
}

}  // namespace detail

// A layout's text at compile time. N counts a terminating zero. Used as a template argument
// only by the failing diagnostics below (see the top of this file).
template <std::size_t N>
struct layout_text {
  char value[N];
  static constexpr std::size_t size() { return N - 1; }
  constexpr std::string_view view() const { return {value, N - 1}; }
};

namespace detail {
template <class Mesh, layout_key L>
constexpr auto make_layout_text() {
  constexpr layout_value v = to_layout(L);
  constexpr std::size_t n = layout_text_length(v, Mesh::axis_names);
  layout_text<n + 1> t{};
  std::size_t at = 0;
  write_layout_text(v, Mesh::axis_names, [&](std::string_view s) {
    for (char c : s) t.value[at++] = c;
  });
  t.value[n] = '\0';
  return t;
}

template <class X>
constexpr auto layout_text_of() {
  using t = typename tensor_behind<X>::type;
  if constexpr (layout_carrier<t>) {
    return make_layout_text<typename t::mesh_type, layout_key(t::layout)>();
  } else {
    (void)not_a_tensor_type<t>{};
    return layout_text<1>{};
  }
}

// clang 19 prints a string template argument whole up to 36 characters and cuts longer ones
// ("split(b:dp) partial(tp) split(b:dp[...]"); g++ prints any length. So a longer text is
// shown as several arguments of at most 32 characters, cut at the blanks between placements
// (a single placement longer than that is cut inside).
inline constexpr std::size_t layout_text_piece = 32;
struct text_pieces {
  std::size_t count;
  std::array<std::size_t, 4 * max_axes + 1> begin, size;
};
constexpr text_pieces cut_text(std::string_view s) {
  text_pieces out{};
  std::size_t at = 0;
  while (at < s.size()) {
    std::size_t end = at;
    for (std::size_t i = at; i <= s.size() && i - at <= layout_text_piece; ++i) {
      if (i == s.size() || s[i] == ' ') end = i;
    }
    if (end == at) end = at + layout_text_piece;  // a placement longer than a piece
    out.begin[out.count] = at;
    out.size[out.count] = end - at;
    ++out.count;
    at = end < s.size() && s[end] == ' ' ? end + 1 : end;
  }
  return out;
}
template <auto Text, std::size_t Begin, std::size_t Size>
constexpr layout_text<Size + 1> text_piece() {
  layout_text<Size + 1> t{};
  for (std::size_t i = 0; i < Size; ++i) t.value[i] = Text.value[Begin + i];
  t.value[Size] = '\0';
  return t;
}
// Holder<piece 0, piece 1, ...> for the text of layout L on Mesh.
template <template <layout_text...> class Holder, class Mesh, layout_key L>
struct pieces_of {
  static constexpr auto text = make_layout_text<Mesh, L>();
  static constexpr text_pieces cut = cut_text(text.view());
  template <std::size_t... K>
  static auto make(std::index_sequence<K...>)
      -> Holder<text_piece<text, cut.begin[K], cut.size[K]>()...>;
  using type = decltype(make(std::make_index_sequence<cut.count>{}));
};
}  // namespace detail

// The layout of tensor type X as a zest::layout<placements...> type (see the top of this file).
template <class X>
struct layout_of {
  using type = typename detail::layout_of_impl<typename detail::tensor_behind<X>::type>::type;
};
template <class X>
using layout_of_t = typename layout_of<X>::type;

// X's layout as text, at compile time: layout_text_v<X>.view() == layout_string<X>().
template <class X>
inline constexpr auto layout_text_v = detail::layout_text_of<X>();

// The display. Instantiating deduced_layout stops the compile; the layout is its template
// argument (in pieces when it is long, see detail::cut_text).
template <layout_text... Layout>
struct deduced_layout {
  static constexpr std::size_t pieces = sizeof...(Layout);
  static_assert(pieces == 0 && pieces != 0,
                "zest show_layout: the tensor type's layout is the text in deduced_layout<...> "
                "(shown with this error). show_layout stops the compile on purpose: remove it "
                "once you have read the layout.");
  static constexpr bool value = false;
};

// The two sides of a mismatch, as layout_is prints them.
template <layout_text... Layout>
struct actual_layout {
  static constexpr std::size_t pieces = sizeof...(Layout);
};
template <layout_text... Layout>
struct expected_layout {
  static constexpr std::size_t pieces = sizeof...(Layout);
};
template <class Tensor, class Expected>
struct layout_mismatch {
  static_assert(Tensor::pieces == 0 && Tensor::pieces != 0,
                "zest layout_is: the tensor's layout is not the expected one. Both are shown "
                "with this error: layout_mismatch<actual_layout<...>, expected_layout<...>>.");
  static constexpr bool value = false;
};

namespace detail {
template <class X>
constexpr bool show_layout_of() {
  using t = typename tensor_behind<X>::type;
  if constexpr (layout_carrier<t>) {
    return pieces_of<deduced_layout, typename t::mesh_type, layout_key(t::layout)>::type::value;
  } else {
    (void)not_a_tensor_type<t>{};
    return false;
  }
}

template <class X, class L>
constexpr bool layout_is_of() {
  using t = typename tensor_behind<X>::type;
  if constexpr (!layout_carrier<t>) {
    (void)not_a_tensor_type<t>{};
    return false;
  } else {
    using mesh_t = typename t::mesh_type;
    constexpr layout_value want = layout_value_of<mesh_t, t::dims, L>;
    if constexpr (t::layout == want) {
      return true;
    } else {
      return layout_mismatch<
          typename pieces_of<actual_layout, mesh_t, layout_key(t::layout)>::type,
          typename pieces_of<expected_layout, mesh_t, layout_key(want)>::type>::value;
    }
  }
}
}  // namespace detail

// static_assert(zest::show_layout<decltype(y)>): never holds; the error prints y's layout.
template <class X>
inline constexpr bool show_layout = detail::show_layout_of<X>();

// static_assert(zest::layout_is<decltype(y), zest::layout<zest::split<'b', "dp">>>): holds
// when y's layout is the one given (any spelling of it); otherwise the error prints both.
template <class X, class L>
inline constexpr bool layout_is = detail::layout_is_of<X, L>();

}  // namespace zest
