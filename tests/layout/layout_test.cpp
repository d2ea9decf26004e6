// Layout normalisation, shard arithmetic and transition plans: mostly compile-time checks.
#include <doctest/doctest.h>

#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/transition.hpp"
#include "zest/mesh/mesh.hpp"

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

// Each per-axis transition of DESIGN.md's table.
constexpr transition_plan plan(layout_value a, layout_value b) { return plan_transition(a, b); }
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
