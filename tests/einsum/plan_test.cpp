// The output layouts and collectives that einsum derives, checked at compile time.
#include <doctest/doctest.h>

#include "zest/einsum/einsum.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/plan/explain.hpp"

namespace {
using namespace zest;
using mesh_t = local_mesh<"dp", "tp">;
template <fixed_string Dims, class L = layout<>>
using t = tensor<float, mesh_t, Dims, L>;

template <fixed_string Spec, class A, class B, class O1 = void, class O2 = void>
constexpr einsum_plan plan2 = einsum_plan_of<Spec, O1, O2, A, B>;
template <fixed_string Dims, class L>
constexpr layout_value lv = layout_value_of<mesh_t, Dims, L>;

// Rule 1: a kept dim split alike stays split, no communication (data parallel).
using x_dp = t<"bsm", layout<split<'b', "dp">>>;
using w_rep = t<"mh">;
static_assert(plan2<"bsm,mh->bsh", x_dp, w_rep>.collectives() == 0);
static_assert(plan2<"bsm,mh->bsh", x_dp, w_rep>.result == lv<"bsh", layout<split<'b', "dp">>>);

// Rule 2: a contracted dim split alike gives a partial output (row parallel).
using x_h = t<"bsh", layout<split<'h', "tp">>>;
using w_h = t<"hm", layout<split<'h', "tp">>>;
static_assert(plan2<"bsh,hm->bsm", x_h, w_h>.collectives() == 0);
static_assert(plan2<"bsh,hm->bsm", x_h, w_h>.result == lv<"bsm", layout<partial<"tp">>>);

// Rule 3: split in one operand only, the other replicated: slice it locally (column parallel).
using w_col = t<"mh", layout<split<'h', "tp">>>;
static_assert(plan2<"bsm,mh->bsh", t<"bsm">, w_col>.collectives() == 0);
static_assert(plan2<"bsm,mh->bsh", t<"bsm">, w_col>.result == lv<"bsh", layout<split<'h', "tp">>>);
static_assert(plan2<"bsh,hm->bsm", t<"bsh">, w_h>.operand_steps[0].count_of(step_kind::slice) == 1);
static_assert(plan2<"bsh,hm->bsm", t<"bsh">, w_h>.result == lv<"bsm", layout<partial<"tp">>>);

// Rule 4: one partial operand stays linear; the result is partial.
using x_p = t<"bsm", layout<partial<"tp">>>;
static_assert(plan2<"bsm,mh->bsh", x_p, w_rep>.result == lv<"bsh", layout<partial<"tp">>>);
// ... and an operand split on that axis is gathered, since partial x split is not a product of sums.
static_assert(plan2<"bsm,mh->bsh", x_p, w_col>.operand_steps[1].count_of(step_kind::all_gather) ==
              1);

// Rule 5, ZeRO-3: the weight stored split over dp is gathered on use (gather_weights).
using w_zero = t<"mh", layout<split<'m', "dp">>>;
constexpr auto zero3 = plan2<"bsm,mh->bsh", x_dp, w_zero>;
static_assert(zero3.operand_steps[0].size() == 0);
static_assert(zero3.operand_steps[1].size() == 1 &&
              zero3.operand_steps[1][0].kind == step_kind::all_gather);
static_assert(zero3.result == lv<"bsh", layout<split<'b', "dp">>>);
// The same conflict under keep_weights: the activation moves (all-to-all b -> m), output partial.
constexpr auto megatron = plan2<"bsm,mh->bsh", x_dp, w_zero, keep_weights>;
static_assert(megatron.operand_steps[1].size() == 0);
static_assert(megatron.operand_steps[0].size() == 1 &&
              megatron.operand_steps[0][0].kind == step_kind::all_to_all);
static_assert(megatron.result == lv<"bsh", layout<partial<"dp">>>);

// ZeRO-3 backward: the weight gradient "bsm,bsh->mh" comes out partial over dp, and forcing
// the stored layout turns that into a reduce-scatter.
using dy = t<"bsh", layout<split<'b', "dp">>>;
static_assert(plan2<"bsm,bsh->mh", x_dp, dy>.result == lv<"mh", layout<partial<"dp">>>);
constexpr auto grad = plan2<"bsm,bsh->mh", x_dp, dy, layout<split<'m', "dp">>>;
static_assert(grad.output_steps.size() == 1 &&
              grad.output_steps[0].kind == step_kind::reduce_scatter);
static_assert(grad.result == lv<"mh", layout<split<'m', "dp">>>);

// GShard: dispatch keeps the group split; the all-to-all comes from resharding G -> E.
using mask = t<"GSEC", layout<split<'G', "dp">>>;
using tokens = t<"GSM", layout<split<'G', "dp">>>;
static_assert(plan2<"GSEC,GSM->EGCM", mask, tokens>.result == lv<"EGCM", layout<split<'G', "dp">>>);
static_assert(redistribute_plan<t<"EGCM", layout<split<'G', "dp">>>, layout<split<'E', "dp">>>[0]
                  .kind == step_kind::all_to_all);

// Options may come in either order.
static_assert(plan2<"bsm,bsh->mh", x_dp, dy, keep_weights, layout<split<'m', "dp">>>.result ==
              plan2<"bsm,bsh->mh", x_dp, dy, layout<split<'m', "dp">>, keep_weights>.result);
// no_communication accepts a plan without collectives.
static_assert(plan2<"bsm,mh->bsh", x_dp, w_rep, no_communication<>>.collectives() == 0);

// One-operand einsums: transpose keeps splits, a sum over a split dim becomes partial.
static_assert(einsum_plan_of<"bsm->msb", void, void, x_dp>.result ==
              lv<"msb", layout<split<'b', "dp">>>);
static_assert(einsum_plan_of<"bsm->sm", void, void, x_dp>.result ==
              lv<"sm", layout<partial<"dp">>>);

TEST_CASE("explain prints each collective with its axis") {
  mesh_t m;
  auto x = x_dp(m, {4, 3, 8});
  auto w = w_zero(m, {8, 6});
  const plan_report r = explain<"bsm,mh->bsh">(x, w);
  CHECK(r.collectives() == 1);
  CHECK(r.str().find("all_gather over dp (dim m)") != std::string::npos);
  CHECK(r.str().find("result \"bsh\" split(b:dp)") != std::string::npos);
  CHECK(r.bytes() == 0);  // one rank: nothing leaves it
  const plan_report g = explain<layout<split<'s', "dp">>>(x);
  CHECK(g.str().find("all_to_all over dp (dim b -> s)") != std::string::npos);
}
}  // namespace
