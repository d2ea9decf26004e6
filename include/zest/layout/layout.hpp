// zest/layout/layout.hpp — a layout: the placements of a tensor over all mesh axes.
//
// Users write a layout as a list of placements; axes they do not name are replicated:
//
//   layout<split<'b', "dp">, partial<"tp">>      // b cut over dp, a pending sum over tp
//   layout<>                                      // replicated everywhere
//
// Inside zest a layout is normalised, against a mesh's axis names and a tensor's dims, into
// a `layout_value`: one axis_placement per mesh axis, in mesh order. That value is a
// structural type, so it is the template argument of tensors, and two spellings of the
// same layout give the same tensor type. All checks happen here, at compile time; a bad
// layout stops with one static_assert that names the placement at fault and the fix.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/placement.hpp"

namespace zest {

template <class... Placements>
struct layout {};

// The placement of one mesh axis. For a split, `order` is the position of this axis among
// the axes that split `dim` (0 = major).
struct axis_placement {
  placement_kind kind;
  char dim;
  std::uint8_t order;
  constexpr bool operator==(const axis_placement&) const = default;
};

// A layout as a template argument: one integer, so that it has exactly one spelling in every
// compiler's mangled names (docs/design-notes.md, "Template arguments have one spelling").
// Each axis takes 9 bits: 0 replicate, 1 partial, 2 + 6 * letter + order for a split of the
// dim whose letter is `letter` (a-z 0-25, A-Z 26-51) at nesting position `order`; the axis
// count sits above them. A layout_value converts to its key wherever a key is expected.
enum class layout_key : std::uint64_t {};

// The normalised layout: axes[i] is what mesh axis i does to the tensor.
//
// Functions take it by value, never by const reference (19 bytes, trivially copyable). nvcc's
// front end (EDG, in cudafe++ and again in cicc) keeps about 200 MB for good each time a
// template's definition binds a reference parameter of a constexpr function to a
// value-dependent argument: `static constexpr layout_value m = detail::meeting_layout(X::layout,
// Y::layout);` cost 390 MB with two `const layout_value&` parameters and nothing by value. With
// references, a translation unit of zest/cuda.hpp and an empty main took 6.8 GB in cudafe++;
// by value 0.84 GB (bench/README.md, "nvcc's front end").
struct layout_value {
  std::array<axis_placement, max_axes> axes;
  std::uint8_t axis_count;

  constexpr bool operator==(const layout_value&) const = default;
  // The template-argument form of this layout (below).
  constexpr operator layout_key() const;  // NOLINT: implicit by design

  constexpr bool is_replicate(std::size_t a) const {
    return axes[a].kind == placement_kind::replicate;
  }
  constexpr bool is_partial(std::size_t a) const { return axes[a].kind == placement_kind::partial; }
  constexpr bool is_split(std::size_t a) const { return axes[a].kind == placement_kind::split; }
  constexpr bool splits(std::size_t a, char d) const { return is_split(a) && axes[a].dim == d; }

  // Number of axes splitting dim d.
  constexpr std::size_t split_count(char d) const {
    std::size_t n = 0;
    for (std::size_t a = 0; a < axis_count; ++a) n += splits(a, d) ? 1U : 0U;
    return n;
  }
  // The k-th axis (in nesting order) splitting dim d.
  constexpr std::size_t split_axis(char d, std::size_t k) const {
    for (std::size_t a = 0; a < axis_count; ++a) {
      if (splits(a, d) && axes[a].order == k) return a;
    }
    return max_axes;
  }
  constexpr bool any_partial() const {
    for (std::size_t a = 0; a < axis_count; ++a) {
      if (is_partial(a)) return true;
    }
    return false;
  }
  constexpr bool all_replicate() const {
    for (std::size_t a = 0; a < axis_count; ++a) {
      if (!is_replicate(a)) return false;
    }
    return true;
  }
};

namespace detail {
inline constexpr unsigned layout_key_axis_bits = 9;
constexpr unsigned layout_letter_index(char d) {
  if (d >= 'a' && d <= 'z') return static_cast<unsigned>(d - 'a');
  if (d >= 'A' && d <= 'Z') return 26U + static_cast<unsigned>(d - 'A');
  throw "zest layout_key: a split dim is not a letter a-z or A-Z";
}
constexpr char layout_letter(unsigned i) {
  return i < 26 ? static_cast<char>('a' + i) : static_cast<char>('A' + (i - 26));
}
}  // namespace detail

constexpr layout_value::operator layout_key() const {
  static_assert(max_axes * detail::layout_key_axis_bits + 3 <= 64 && 2 + 52 * max_axes < 512);
  std::uint64_t bits = 0;
  for (std::size_t a = axis_count; a-- > 0;) {
    const auto& p = axes[a];
    std::uint64_t state = 0;
    if (p.kind == placement_kind::partial) {
      state = 1;
    } else if (p.kind == placement_kind::split) {
      state = 2 + max_axes * detail::layout_letter_index(p.dim) + p.order;
    }
    bits = (bits << detail::layout_key_axis_bits) | state;
  }
  return static_cast<layout_key>(
      bits | (std::uint64_t{axis_count} << (max_axes * detail::layout_key_axis_bits)));
}

// The layout a key stands for.
constexpr layout_value to_layout(layout_key key) {
  const auto bits = static_cast<std::uint64_t>(key);
  layout_value v{};
  v.axis_count = static_cast<std::uint8_t>(bits >> (max_axes * detail::layout_key_axis_bits));
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    const auto state = static_cast<unsigned>((bits >> (a * detail::layout_key_axis_bits)) & 511U);
    if (state == 1) {
      v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
    } else if (state >= 2) {
      v.axes[a] =
          axis_placement{placement_kind::split, detail::layout_letter((state - 2) / max_axes),
                         static_cast<std::uint8_t>((state - 2) % max_axes)};
    }
  }
  return v;
}

// The fully replicated layout over n axes.
constexpr layout_value replicated_layout(std::size_t n) {
  layout_value v{};
  v.axis_count = static_cast<std::uint8_t>(n);
  return v;
}

namespace detail {
// The layout's text, "split(b:dp) partial(tp)" ("replicate" when nothing is placed), written
// through `out(std::string_view)`: the one writer, at run time (to_string) and at compile time
// (layout_text_v, zest/layout/layout_of.hpp).
template <class Names, class Out>
constexpr void write_layout_text(layout_value v, const Names& names, Out&& out) {
  bool any = false;
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    const axis_placement& p = v.axes[a];
    if (p.kind == placement_kind::replicate) continue;
    if (p.kind == placement_kind::split && p.order != 0) continue;
    if (any) out(std::string_view(" "));
    any = true;
    if (p.kind == placement_kind::partial) {
      out(std::string_view("partial("));
      out(std::string_view(names[a]));
      out(std::string_view(")"));
      continue;
    }
    const char dim[2] = {p.dim, '\0'};
    out(std::string_view("split("));
    out(std::string_view(dim, 1));
    out(std::string_view(":"));
    for (std::size_t k = 0; k < v.split_count(p.dim); ++k) {
      if (k) out(std::string_view(","));
      out(std::string_view(names[v.split_axis(p.dim, k)]));
    }
    out(std::string_view(")"));
  }
  if (!any) out(std::string_view("replicate"));
}
}  // namespace detail

// "split(b:dp) partial(tp)" — human-readable, for plans and error messages.
template <class AxisNames>
std::string to_string(layout_value v, const AxisNames& names) {
  std::string out;
  detail::write_layout_text(v, names, [&](std::string_view s) { out += s; });
  return out;
}

// ---------------------------------------------------------------------------------------
// Normalisation and its diagnostics.

// Why a layout is rejected. The diagnostics below turn each into one static_assert.
enum class layout_problem : std::uint8_t {
  none,
  not_a_layout,
  not_a_placement,
  unknown_axis,
  axis_used_twice,
  unknown_dim,
  dim_split_twice,
  split_without_axis,
};

namespace layout_error {
using detail::always_false;

// Each template is instantiated with the offending placement and the mesh, so the compiler's
// "In instantiation of" line right above the message shows both.
template <class Placement, class Mesh>
struct unknown_mesh_axis {
  static_assert(always_false<Placement>,
                "zest layout: a placement names a mesh axis that the mesh does not have. Fix: "
                "use one of the mesh's axis names (placement and mesh are shown above).");
};
template <class Placement, class Mesh>
struct mesh_axis_used_twice {
  static_assert(always_false<Placement>,
                "zest layout: this placement uses a mesh axis that an earlier placement already "
                "uses; an axis splits one dim or holds one partial sum. Fix: drop one of them, "
                "or split one dim over several axes: split<'d', \"a\", \"b\">.");
};
template <class Placement, fixed_string Dims>
struct unknown_tensor_dim {
  static_assert(always_false<Placement>,
                "zest layout: split names a dim the tensor does not have. Fix: split one of the "
                "tensor's dim letters (placement and dims are shown above).");
};
template <class Placement, fixed_string Dims>
struct dim_split_twice {
  static_assert(always_false<Placement>,
                "zest layout: this dim is already split by an earlier placement. Fix: split it "
                "once over several axes, major first: split<'d', \"a\", \"b\">.");
};
template <class Placement>
struct split_without_axis {
  static_assert(always_false<Placement>,
                "zest layout: split<'d'> names no mesh axis. Fix: split<'d', \"axis\">.");
};
template <class Placement>
struct not_a_placement {
  static_assert(always_false<Placement>,
                "zest layout: layout<...> takes only replicate<\"axis\">, split<'d', \"axis\"...> "
                "and partial<\"axis\"> (the offending argument is shown above).");
};
template <class Layout>
struct not_a_layout {
  static_assert(always_false<Layout>,
                "zest layout: expected zest::layout<placements...> (the argument is shown above).");
};
}  // namespace layout_error

namespace detail {

struct layout_check {
  layout_problem problem = layout_problem::none;
  std::size_t index = 0;  // which placement
  layout_value value{};
};

template <std::size_t N, class Names>
constexpr std::size_t find_axis(const Names& names, std::string_view axis) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == axis) return i;
  }
  return N;
}
// The index of the mesh axis named `axis`, Mesh::axis_count if none: the one lookup by name
// (mesh::axis_index<"dp">() is the typed form that refuses a missing axis).
template <class Mesh>
constexpr std::size_t axis_index_of(std::string_view axis) {
  return find_axis<Mesh::axis_count>(Mesh::axis_names, axis);
}

// Adds one placement to a layout under construction; returns false with the problem set.
template <class Mesh, fixed_string Dims, class P>
constexpr bool add_placement(layout_check& c, std::array<bool, max_axes>& used) {
  constexpr auto names = Mesh::axis_names;
  constexpr std::size_t n = names.size();
  auto claim = [&](std::string_view axis) -> std::size_t {
    const std::size_t a = find_axis<n>(names, axis);
    if (a == n) {
      c.problem = layout_problem::unknown_axis;
      return n;
    }
    if (used[a]) {
      c.problem = layout_problem::axis_used_twice;
      return n;
    }
    used[a] = true;
    return a;
  };
  if constexpr (!placement<P>) {
    c.problem = layout_problem::not_a_placement;
    return false;
  } else if constexpr (P::kind == placement_kind::split) {
    if constexpr (P::axes.size() == 0) {
      c.problem = layout_problem::split_without_axis;
      return false;
    } else {
      if (Dims.find(P::dim) == std::string_view::npos) {
        c.problem = layout_problem::unknown_dim;
        return false;
      }
      if (c.value.split_count(P::dim) != 0) {
        c.problem = layout_problem::dim_split_twice;
        return false;
      }
      std::uint8_t order = 0;
      for (auto axis : P::axes) {
        const std::size_t a = claim(axis);
        if (a == n) return false;
        c.value.axes[a] = axis_placement{placement_kind::split, P::dim, order++};
      }
      return true;
    }
  } else {
    const std::size_t a = claim(P::axes[0]);
    if (a == n) return false;
    c.value.axes[a] = axis_placement{P::kind, 0, 0};
    return true;
  }
}

template <class Mesh, fixed_string Dims, class... P>
constexpr layout_check check_layout() {
  layout_check c;
  c.value.axis_count = static_cast<std::uint8_t>(Mesh::axis_names.size());
  [[maybe_unused]] std::array<bool, max_axes> used{};
  [[maybe_unused]] std::size_t i = 0;
  // Stops at the first problem: one error at a time is what a user can act on.
  (void)((add_placement<Mesh, Dims, P>(c, used) ? (++i, true) : (c.index = i, false)) && ...);
  return c;
}

// The placements of a layout type. Specialised on the layout alone (not together with the
// mesh and dims) because nvcc's front end does not match partial specialisations whose
// other parameters are class-type template arguments.
template <class L>
struct layout_parts {
  static constexpr bool is_layout = false;
  using list = std::tuple<void>;
};
template <class... P>
struct layout_parts<layout<P...>> {
  static constexpr bool is_layout = true;
  using list = std::tuple<P..., void>;
  template <class Mesh, fixed_string Dims>
  static constexpr layout_check check() {
    return check_layout<Mesh, Dims, P...>();
  }
};

template <class Mesh, fixed_string Dims, class L>
constexpr layout_check check_layout_type() {
  using parts = layout_parts<L>;
  if constexpr (parts::is_layout) {
    return parts::template check<Mesh, Dims>();
  } else {
    layout_check c;
    c.problem = layout_problem::not_a_layout;
    return c;
  }
}

// The normalised layout; on a problem, instantiates the one diagnostic that explains it.
template <class Mesh, fixed_string Dims, class L>
constexpr layout_value normalise_layout() {
  constexpr layout_check check = check_layout_type<Mesh, Dims, L>();
  using culprit = std::tuple_element_t<check.index, typename layout_parts<L>::list>;
  using enum layout_problem;
  if constexpr (check.problem == not_a_layout) {
    (void)layout_error::not_a_layout<L>{};
  } else if constexpr (check.problem == unknown_axis) {
    (void)layout_error::unknown_mesh_axis<culprit, Mesh>{};
  } else if constexpr (check.problem == axis_used_twice) {
    (void)layout_error::mesh_axis_used_twice<culprit, Mesh>{};
  } else if constexpr (check.problem == unknown_dim) {
    (void)layout_error::unknown_tensor_dim<culprit, Dims>{};
  } else if constexpr (check.problem == dim_split_twice) {
    (void)layout_error::dim_split_twice<culprit, Dims>{};
  } else if constexpr (check.problem == split_without_axis) {
    (void)layout_error::split_without_axis<culprit>{};
  } else if constexpr (check.problem == not_a_placement) {
    (void)layout_error::not_a_placement<culprit>{};
  }
  return check.value;
}

}  // namespace detail

// The normalised value of layout L, a layout<...>, for a tensor with dims Dims on mesh type
// Mesh (checked, with one diagnostic per problem). A layout known as a value is made a type
// by layout_type_for (zest/layout/layout_of.hpp).
template <class Mesh, fixed_string Dims, class L>
inline constexpr layout_value layout_value_of = detail::normalise_layout<Mesh, Dims, L>();

}  // namespace zest
