// layout_of_t<X> and the compile-time layout text (zest/layout/layout_of.hpp):
//   - for every layout of a "bsm" tensor on 1-, 2- and 3-axis meshes (each axis replicated,
//     partial or splitting one dim, nested splits in every order), tensor<T, Mesh, Dims,
//     layout_of_t<X>> is X again (static_assert) and layout_of_t<X> is the spelling users
//     write (one placement per non-replicated axis, mesh order, a nested split once);
//   - at run time, each type's layout read back equals the value it was made from, and
//     layout_text_v<X> equals layout_string<X>() (the notation of explain, visualize and the
//     run-time errors), parse_layout of it gives the layout back;
//   - layout_of_t and layout_is on einsum results; explain and visualize print the same text.
// The failing side (show_layout, layout_is: the error prints the layout) is in
// tests/compile_fail/layout_*.cpp.
#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/einsum/einsum.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/layout_of.hpp"
#include "zest/layout/layout_string.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/plan/explain.hpp"
#include "zest/plan/visualize.hpp"
#include "zest/tensor/tensor.hpp"

namespace {
using namespace zest;

// ---------------------------------------------------------------------------------------
// Hand-written cases: the spelling layout_of_t gives back.

using mesh3 = local_mesh<"dp", "tp", "ep">;
template <class L>
using t3 = tensor<float, mesh3, "bsm", L>;

static_assert(std::is_same_v<layout_of_t<t3<layout<>>>, layout<>>);
static_assert(std::is_same_v<layout_of_t<t3<layout<replicate<"tp">>>>, layout<>>);
static_assert(std::is_same_v<layout_of_t<t3<layout<split<'b', "dp">>>>, layout<split<'b', "dp">>>);
// Mesh order, whatever order the placements were written in.
static_assert(std::is_same_v<layout_of_t<t3<layout<partial<"tp">, split<'b', "dp">>>>,
                             layout<split<'b', "dp">, partial<"tp">>>);
// A nested split is one placement, its axes major first, at its major axis' place.
static_assert(std::is_same_v<layout_of_t<t3<layout<split<'m', "ep", "dp">, partial<"tp">>>>,
                             layout<partial<"tp">, split<'m', "ep", "dp">>>);
static_assert(std::is_same_v<layout_of_t<t3<layout<split<'m', "dp", "ep">, split<'s', "tp">>>>,
                             layout<split<'m', "dp", "ep">, split<'s', "tp">>>);
// cv-qualified and reference types name the same layout.
static_assert(
    std::is_same_v<layout_of_t<const t3<layout<split<'s', "ep">>>&>, layout<split<'s', "ep">>>);
// The text, at compile time.
static_assert(layout_text_v<t3<layout<>>>.view() == "replicate");
static_assert(layout_text_v<t3<layout<partial<"tp">, split<'b', "dp">>>>.view() ==
              "split(b:dp) partial(tp)");
static_assert(layout_text_v<t3<layout<split<'m', "ep", "dp">>>>.view() == "split(m:ep,dp)");
// layout_is holds for any spelling of the tensor's layout.
static_assert(layout_is<t3<layout<split<'b', "dp">, partial<"tp">>>,
                        layout<partial<"tp">, replicate<"ep">, split<'b', "dp">>>);
static_assert(!has_layout<t3<layout<split<'b', "dp">>>, layout<split<'b', "tp">>>);

// A layout deduced by einsum, reused for another tensor.
using x_t = t3<layout<split<'b', "dp">>>;
using w_t = tensor<float, mesh3, "mh", layout<split<'h', "tp">>>;
using y_t = decltype(einsum<"bsm,mh->bsh">(std::declval<const x_t&>(), std::declval<const w_t&>()));
static_assert(std::is_same_v<layout_of_t<y_t>, layout<split<'b', "dp">, split<'h', "tp">>>);
static_assert(layout_is<y_t, layout<split<'h', "tp">, split<'b', "dp">>>);
using z_t = tensor<double, mesh3, "bh", layout_of_t<y_t>>;
static_assert(z_t::layout.splits(0, 'b') && z_t::layout.splits(1, 'h'));
// A contraction over a split dim: partial on that axis.
using v_t = tensor<float, mesh3, "mh", layout<split<'m', "ep">>>;
using u_t = decltype(einsum<"bsm,mh->bsh">(std::declval<const x_t&>(), std::declval<const v_t&>()));
static_assert(std::is_same_v<layout_of_t<u_t>, layout<split<'b', "dp">, partial<"ep">>>);

// ---------------------------------------------------------------------------------------
// Every layout of a "bsm" tensor on an n-axis mesh.

constexpr std::string_view dims = "bsm";

// Each axis: replicate, partial or a split of one of the dims (5 choices), and for every dim
// split by k axes every nesting order (k! of them).
template <std::size_t Axes>
constexpr std::size_t layout_count_bound() {
  std::size_t n = 1;
  for (std::size_t a = 0; a < Axes; ++a) n *= 5 * (a + 1);
  return n;
}

template <std::size_t Axes>
constexpr auto all_layouts() {
  struct result {
    std::array<layout_value, layout_count_bound<Axes>()> values{};
    std::size_t count = 0;
  } out{};
  std::size_t choices = 1;
  for (std::size_t a = 0; a < Axes; ++a) choices *= 5;
  for (std::size_t c = 0; c < choices; ++c) {
    std::array<std::size_t, Axes> pick{};
    std::size_t rest = c;
    for (std::size_t a = 0; a < Axes; ++a) {
      pick[a] = rest % 5;
      rest /= 5;
    }
    // The axes splitting each dim, in mesh order; then every permutation of their orders.
    std::array<std::array<std::size_t, Axes>, 3> by_dim{};
    std::array<std::size_t, 3> used{};
    for (std::size_t a = 0; a < Axes; ++a) {
      if (pick[a] >= 2) by_dim[pick[a] - 2][used[pick[a] - 2]++] = a;
    }
    std::array<std::array<std::size_t, Axes>, 3> perm = by_dim;
    // Odometer over the permutations of the three groups (lexicographic, starting sorted).
    auto next_perm = [](std::array<std::size_t, Axes>& p, std::size_t n) {
      if (n < 2) return false;
      std::size_t i = n - 1;
      while (i > 0 && p[i - 1] >= p[i]) --i;
      if (i == 0) return false;
      std::size_t j = n - 1;
      while (p[j] <= p[i - 1]) --j;
      std::swap(p[i - 1], p[j]);
      for (std::size_t l = i, r = n - 1; l < r; ++l, --r) std::swap(p[l], p[r]);
      return true;
    };
    while (true) {
      layout_value v{};
      v.axis_count = static_cast<std::uint8_t>(Axes);
      for (std::size_t a = 0; a < Axes; ++a) {
        if (pick[a] == 1) v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
      }
      for (std::size_t d = 0; d < 3; ++d) {
        for (std::size_t k = 0; k < used[d]; ++k)
          v.axes[perm[d][k]] =
              axis_placement{placement_kind::split, dims[d], static_cast<std::uint8_t>(k)};
      }
      out.values[out.count++] = v;
      std::size_t d = 0;
      while (d < 3 && !next_perm(perm[d], used[d])) {
        perm[d] = by_dim[d];
        ++d;
      }
      if (d == 3) break;
    }
  }
  return out;
}

template <std::size_t Axes>
inline constexpr auto layouts_v = all_layouts<Axes>();

template <std::size_t Axes>
struct mesh_of;
template <>
struct mesh_of<1> {
  using type = local_mesh<"dp">;
};
template <>
struct mesh_of<2> {
  using type = local_mesh<"dp", "tp">;
};
template <>
struct mesh_of<3> {
  using type = local_mesh<"dp", "tp", "ep">;
};

// The counts: 1 axis 5; 2 axes 5 * 5 + 3 (both axes split one dim: a second order);
// 3 axes: 125 assignments, 3 * 3 * 4 * 2 with two axes on one dim get a second order
// (choose the dim, the pair, the third axis' other choice of 4), 3 with all three on one
// dim get 5 more orders: 125 + 36 + 15 = 176.
static_assert(layouts_v<1>.count == 5);
static_assert(layouts_v<2>.count == 28);
static_assert(layouts_v<3>.count == 176);

struct read_back {
  layout_value made;           // the value the type was made from
  const layout_value* stored;  // X::layout, read at run time
  std::string text;            // layout_text_v<X>
  std::string printed;         // layout_string<X>()
  layout_value parsed;         // parse_layout(text)
};

template <std::size_t Axes, std::size_t I>
read_back check_one() {
  using mesh_t = typename mesh_of<Axes>::type;
  static constexpr layout_value made = layouts_v<Axes>.values[I];
  using x = basic_tensor<float, mesh_t, "bsm", made>;
  using round_trip = tensor<float, mesh_t, "bsm", layout_of_t<x>>;
  static_assert(std::is_same_v<round_trip, x>, "layout_of_t does not round-trip");
  static_assert(layout_is<x, layout_of_t<x>>);
  return read_back{made, &x::layout, std::string(layout_text_v<x>.view()), layout_string<x>(),
                   parse_layout(layout_text_v<x>.view(), mesh_t::axis_names)};
}

template <std::size_t Axes, std::size_t... I>
std::vector<read_back> check_all(std::index_sequence<I...>) {
  return {check_one<Axes, I>()...};
}

template <std::size_t Axes>
void check_mesh() {
  const auto results = check_all<Axes>(std::make_index_sequence<layouts_v<Axes>.count>{});
  CHECK(results.size() == layouts_v<Axes>.count);
  std::size_t distinct_texts = 0;
  std::vector<std::string> seen;
  for (const auto& r : results) {
    CAPTURE(r.printed);
    CHECK(*r.stored == r.made);
    CHECK(r.text == r.printed);
    CHECK(r.text == to_string(r.made, mesh_of<Axes>::type::axis_names));
    CHECK(r.parsed == r.made);
    bool fresh = true;
    for (const auto& s : seen) fresh = fresh && s != r.text;
    if (fresh) ++distinct_texts;
    seen.push_back(r.text);
  }
  CHECK(distinct_texts == results.size());  // every layout has its own text
}

TEST_CASE("layout_of_t round-trips every layout of a 3-dim tensor on 1, 2 and 3 mesh axes") {
  check_mesh<1>();
  check_mesh<2>();
  check_mesh<3>();
}

TEST_CASE("explain and visualize print the layout in layout_text_v's notation") {
  const mesh3 m;
  const x_t x(m, {2, 3, 4});
  const v_t v(m, {4, 5});
  const std::string plan = explain<"bsm,mh->bsh">(x, v).str();
  CAPTURE(plan);
  CHECK(plan.find(std::string(layout_text_v<u_t>.view())) != std::string::npos);
  CHECK(plan.find("split(b:dp) partial(ep)") != std::string::npos);
  const auto u = einsum<"bsm,mh->bsh">(x, v);
  CHECK(layout_string<decltype(u)>() == layout_text_v<u_t>.view());
  using w2_t = tensor<float, mesh3, "mh", layout<partial<"tp">, split<'m', "ep", "dp">>>;
  const w2_t w2(m, {4, 5});
  const std::string map = visualize(w2);
  CAPTURE(map);
  CHECK(map.find("\"mh\" [4x5] partial(tp) split(m:ep,dp) on") != std::string::npos);
  CHECK(layout_text_v<w2_t>.view() == "partial(tp) split(m:ep,dp)");
}

}  // namespace
