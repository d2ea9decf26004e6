// Layout normalisation, shard arithmetic and transition plans: mostly compile-time checks.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <iterator>
#include <set>
#include <type_traits>
#include <vector>

#include "zest/einsum/spec.hpp"
#include "zest/layout/fixed_order_plan.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/step.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/tensor/tensor.hpp"

namespace {
using namespace zest;
using mesh_t = local_mesh<"dp", "tp">;

template <class L>
constexpr layout_value lv = layout_value_of<mesh_t, "bsm", L>;

// Spelling does not matter: the normalised values are equal.
static_assert(lv<layout<>> == lv<layout<replicate<"dp">, replicate<"tp">>>);
static_assert(lv<layout<split<'b', "dp">, partial<"tp">>> ==
              lv<layout<partial<"tp">, split<'b', "dp">>>);
static_assert(lv<layout<split<'b', "dp">>> != lv<layout<split<'s', "dp">>>);

// Nesting order is part of the layout.
static_assert(lv<layout<split<'m', "dp", "tp">>>.split_axis('m', 0) == 0);
static_assert(lv<layout<split<'m', "tp", "dp">>>.split_axis('m', 0) == 1);
static_assert(lv<layout<split<'m', "dp", "tp">>> != lv<layout<split<'m', "tp", "dp">>>);
static_assert(lv<layout<split<'m', "dp", "tp">>>.split_count('m') == 2);
static_assert(lv<layout<partial<"dp">>>.any_partial() &&
              !lv<layout<partial<"dp">>>.all_replicate());

// Balanced blocks: the first extent % parts blocks are one larger.
static_assert(balanced_block(50257, 4, 0) == block_range{0, 12565});
static_assert(balanced_block(50257, 4, 1) == block_range{12565, 12564});
static_assert(balanced_block(50257, 4, 3) == block_range{37693, 12564});
static_assert(balanced_block(3, 4, 3) == block_range{3, 0});

// Nested splits: m = 10 over dp = 2 then tp = 2.
constexpr std::array<int, 2> sizes{2, 2};
static_assert(dim_range(lv<layout<split<'m', "dp", "tp">>>, 'm', 10, sizes,
                        std::array<int, 2>{1, 0}) == block_range{5, 3});
static_assert(dim_range(lv<layout<split<'m', "dp", "tp">>>, 'm', 10, sizes,
                        std::array<int, 2>{1, 1}) == block_range{8, 2});
static_assert(dim_range(lv<layout<split<'m', "tp", "dp">>>, 'm', 10, sizes,
                        std::array<int, 2>{1, 0}) == block_range{3, 2});

// Each per-axis transition of the table in docs/design-notes.md ("Transitions: what each one
// sends").
constexpr transition_plan plan(layout_value a, layout_value b) { return fixed_order_plan(a, b); }
constexpr auto R = lv<layout<>>;
constexpr auto Sb = lv<layout<split<'b', "dp">>>;
constexpr auto Ss = lv<layout<split<'s', "dp">>>;
constexpr auto P = lv<layout<partial<"dp">>>;

static_assert(plan(Sb, R).size() == 1 &&
              plan(Sb, R)[0] == transition_step{step_kind::all_gather, 0, 'b', 0});
static_assert(plan(P, R).size() == 1 && plan(P, R)[0].kind == step_kind::all_reduce);
static_assert(plan(P, Sb).size() == 1 &&
              plan(P, Sb)[0] == transition_step{step_kind::reduce_scatter, 0, 'b', 0});
static_assert(plan(Sb, Ss).size() == 1 &&
              plan(Sb, Ss)[0] == transition_step{step_kind::all_to_all, 0, 'b', 's'});
static_assert(plan(R, Sb).size() == 1 && plan(R, Sb)[0].kind == step_kind::slice &&
              plan(R, Sb).collectives() == 0);
static_assert(plan(R, P).size() == 1 && plan(R, P)[0].kind == step_kind::zero_partial &&
              plan(R, P).collectives() == 0);
static_assert(plan(Sb, Sb).size() == 0);

// Multi-axis: gather the inner axis first, then the outer.
constexpr auto Sm2 = lv<layout<split<'m', "dp", "tp">>>;
static_assert(plan(Sm2, R).size() == 2 && plan(Sm2, R)[0].axis == 1 && plan(Sm2, R)[1].axis == 0);
// Dropping only the inner axis leaves a valid split over the outer one.
static_assert(plan(Sm2, lv<layout<split<'m', "dp">>>).size() == 1);
// Swapping the nesting order needs both axes gathered, then re-sliced major first.
static_assert(plan(Sm2, lv<layout<split<'m', "tp", "dp">>>).count_of(step_kind::all_gather) == 2);
static_assert(plan(Sm2, lv<layout<split<'m', "tp", "dp">>>).count_of(step_kind::slice) == 2);
// Two independent axes: all-to-all on one, nothing on the other.
static_assert(plan(lv<layout<split<'b', "dp">, split<'m', "tp">>>,
                   lv<layout<split<'s', "dp">, split<'m', "tp">>>)
                  .size() == 1);
// A partial that lands on a nested split: reduce-scatter only when it nests.
static_assert(plan(lv<layout<split<'m', "dp">, partial<"tp">>>, Sm2).size() == 1 &&
              plan(lv<layout<split<'m', "dp">, partial<"tp">>>, Sm2)[0].kind ==
                  step_kind::reduce_scatter);
static_assert(
    plan(lv<layout<partial<"dp">, split<'m', "tp">>>, Sm2).count_of(step_kind::all_reduce) == 1);

TEST_CASE("layout strings name every placement") {
  CHECK(to_string(lv<layout<>>, mesh_t::axis_names) == "replicate");
  CHECK(to_string(lv<layout<split<'b', "dp">, partial<"tp">>>, mesh_t::axis_names) ==
        "split(b:dp) partial(tp)");
  CHECK(to_string(lv<layout<split<'m', "tp", "dp">>>, mesh_t::axis_names) == "split(m:tp,dp)");
}

TEST_CASE("balanced blocks cover the extent exactly") {
  for (std::size_t extent : {0UL, 1UL, 5UL, 7UL, 50257UL}) {
    for (std::size_t parts = 1; parts <= 6; ++parts) {
      std::size_t next = 0;
      for (std::size_t i = 0; i < parts; ++i) {
        const auto b = balanced_block(extent, parts, i);
        CHECK(b.offset == next);
        CHECK(b.size + 1 >= extent / parts + (extent % parts != 0 ? 1 : 0));
        next += b.size;
      }
      CHECK(next == extent);
    }
  }
}
}  // namespace

// ---------------------------------------------------------------------------------------
// Template arguments have one spelling (docs/design-notes.md).
namespace {
// Descriptor element types stay trivial: g++ 12 corrupts value-initialised arrays of
// classes with default member initializers in constant evaluation.
static_assert(std::is_trivially_default_constructible_v<axis_placement> &&
              std::is_trivially_default_constructible_v<layout_value> &&
              std::is_trivially_default_constructible_v<transition_step> &&
              std::is_trivially_default_constructible_v<transition_plan> &&
              std::is_trivially_default_constructible_v<einsum_term>);
static_assert(axis_placement{}.kind == placement_kind::replicate);

// Every layout of up to 6 axes over dims "aZ": its key gives it back, and distinct layouts
// have distinct keys. Enumerated at run time, compared with the constexpr functions.
void each_layout(std::size_t axes, const std::function<void(layout_value)>& f) {
  const axis_placement options[] = {{placement_kind::replicate, 0, 0},
                                    {placement_kind::partial, 0, 0},
                                    {placement_kind::split, 'a', 0},
                                    {placement_kind::split, 'Z', 0}};
  std::vector<std::size_t> pick(axes, 0);
  for (;;) {
    layout_value v{};
    v.axis_count = static_cast<std::uint8_t>(axes);
    for (std::size_t a = 0; a < axes; ++a) {
      v.axes[a] = options[pick[a]];
      if (v.axes[a].kind == placement_kind::split) {
        std::uint8_t order = 0;
        for (std::size_t b = 0; b < a; ++b) order += v.splits(b, v.axes[a].dim) ? 1 : 0;
        v.axes[a].order = order;
      }
    }
    f(v);
    std::size_t a = 0;
    while (a < axes && ++pick[a] == std::size(options)) pick[a++] = 0;
    if (a == axes) return;
  }
}

}  // namespace

TEST_CASE("a layout's key gives it back, and distinct layouts have distinct keys") {
  for (std::size_t axes = 1; axes <= max_axes; ++axes) {
    std::set<std::uint64_t> keys;
    std::size_t count = 0;
    each_layout(axes, [&](layout_value v) {
      const layout_key k = v;
      CHECK(to_layout(k) == v);
      keys.insert(static_cast<std::uint64_t>(k));
      ++count;
    });
    CHECK(keys.size() == count);
  }
}

TEST_CASE("a fixed_string's codes are non-zero and distinct, and give its characters back") {
  constexpr fixed_string s = "ppqq";
  static_assert(s.size() == 4 && s[0] == 'p' && s[3] == 'q' && view_of<s> == "ppqq");
  static_assert(fixed_string("ab") != fixed_string("ba") &&
                fixed_string("ab") == fixed_string("ab"));
  std::set<std::uint32_t> codes(std::begin(s.code), std::end(s.code));
  CHECK(codes.size() == 5);
  CHECK(codes.count(0) == 0);
  // The form nvcc's host-code generator writes back.
  constexpr std::uint32_t raw[3] = {(1U << 8) | 'd', (2U << 8) | 'p', 3U << 8};
  static_assert(fixed_string<3>(raw) == fixed_string("dp"));
}

TEST_CASE("X::layout read at run time equals the compile-time value") {
  using m3 = local_mesh<"x", "y", "z">;
  using a_t = basic_tensor<float, m3, "Jg",
                           layout_value_of<m3, "Jg", layout<split<'g', "x">, split<'J', "z">>>>;
  using v_t = basic_tensor<float, m3, "v", replicated_layout(3)>;
  // Through a volatile copy, so the compiler reads the emitted constants.
  const auto read = [](layout_value v) {
    volatile std::uint8_t bytes[sizeof(layout_value)];
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    for (std::size_t i = 0; i < sizeof(layout_value); ++i) bytes[i] = p[i];
    layout_value out{};
    auto* q = reinterpret_cast<std::uint8_t*>(&out);
    for (std::size_t i = 0; i < sizeof(layout_value); ++i) q[i] = bytes[i];
    return out;
  };
  CHECK(read(v_t::layout) == replicated_layout(3));
  CHECK(read(a_t::layout).splits(0, 'g'));
  CHECK(read(a_t::layout).splits(2, 'J'));
  CHECK(layout_string<v_t>() == "replicate");
  CHECK(layout_string<a_t>() == "split(g:x) split(J:z)");
}
