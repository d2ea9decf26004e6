// Gradient layouts and gradient einsum specs, checked at compile time.
#include <doctest/doctest.h>

#include <string_view>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/einsum_grad.hpp"
#include "zest/mesh/mesh.hpp"

namespace {
using namespace zest;
using autodiff::dual;
using mesh_t = local_mesh<"dp", "tp">;
template <fixed_string Dims, class L>
constexpr layout_value lv = layout_value_of<mesh_t, Dims, L>;

// dual: replicate <-> partial, split <-> split, per axis; an involution.
static_assert(dual(lv<"mh", layout<>>) == lv<"mh", layout<partial<"dp">, partial<"tp">>>);
static_assert(dual(lv<"mh", layout<partial<"tp">>>) == lv<"mh", layout<partial<"dp">>>);
static_assert(dual(lv<"mh", layout<split<'m', "dp">>>) ==
              lv<"mh", layout<split<'m', "dp">, partial<"tp">>>);
static_assert(dual(lv<"mh", layout<split<'m', "dp", "tp">>>) ==
              lv<"mh", layout<split<'m', "dp", "tp">>>);
static_assert(dual(lv<"bsh", layout<split<'b', "dp">, partial<"tp">>>) ==
              lv<"bsh", layout<split<'b', "dp">>>);
static_assert(dual(dual(lv<"bsh", layout<split<'h', "tp">>>)) ==
              lv<"bsh", layout<split<'h', "tp">>>);

// The dual tensor type.
using w_zero = tensor<double, mesh_t, "mh", layout<split<'m', "dp">>>;
static_assert(
    std::is_same_v<autodiff::dual_tensor<w_zero>,
                   tensor<double, mesh_t, "mh", layout<split<'m', "dp">, partial<"tp">>>>);

// A layout value written back as a layout type round-trips.
template <fixed_string Dims, class L>
constexpr bool round_trips =
    layout_value_of<mesh_t, Dims, typename layout_type_for<mesh_t, lv<Dims, L>>::type> ==
    lv<Dims, L>;
static_assert(round_trips<"mh", layout<>>);
static_assert(round_trips<"mh", layout<partial<"tp">, split<'m', "dp">>>);
static_assert(round_trips<"mh", layout<split<'h', "tp", "dp">>>);
static_assert(round_trips<"bsh", layout<split<'b', "tp">, partial<"dp">>>);
static_assert(std::is_same_v<layout_type_of<mesh_t, lv<"mh", layout<split<'m', "dp">>>>,
                             layout<split<'m', "dp">>>);

// Gradient einsum specs.
template <fixed_string Spec, std::size_t I>
constexpr std::string_view grad_spec = view_of<autodiff::einsum_gradient<Spec, I>::spec>;
template <fixed_string Spec, std::size_t I>
constexpr std::string_view broadcast_spec =
    view_of<autodiff::einsum_gradient<Spec, I>::broadcast_spec>;
static_assert(grad_spec<"bsm,mh->bsh", 0> == "bsh,mh->bsm");
static_assert(grad_spec<"bsm,mh->bsh", 1> == "bsm,bsh->mh");
static_assert(grad_spec<"ki,kj->ij", 0> == "ij,kj->ki");  // a transposed operand
static_assert(grad_spec<"i,j->ij", 1> == "i,ij->j");      // outer product
static_assert(grad_spec<"bsm->msb", 0> == "msb->bsm");
static_assert(grad_spec<"GSEC,GSM->EGCM", 0> == "EGCM,GSM->GSEC");
static_assert(grad_spec<"GSEC,EGCM->GSM", 1> == "GSEC,GSM->EGCM");
static_assert(!autodiff::einsum_gradient<"bsm,mh->bsh", 1>::broadcasts);
// Dims summed out of one operand alone come back by a broadcast with ones.
static_assert(grad_spec<"bsm->sm", 0> == "sm->sm");
static_assert(broadcast_spec<"bsm->sm", 0> == "sm,b->bsm");
static_assert(view_of<autodiff::einsum_gradient<"bsm->sm", 0>::ones_dims> == "b");
static_assert(grad_spec<"ij,jk->k", 0> == "k,jk->j");
static_assert(broadcast_spec<"ij,jk->k", 0> == "j,i->ij");
static_assert(autodiff::einsum_gradient<"ij->", 0>::reduced_dims.size() == 0);

// ZeRO-3: the weight gradient's einsum, forced to the dual of the stored layout, is one
// reduce-scatter after a local contraction.
using x_dp = tensor<double, mesh_t, "bsm", layout<split<'b', "dp">>>;
using dy_dp = autodiff::dual_tensor<tensor<double, mesh_t, "bsh", layout<split<'b', "dp">>>>;
constexpr einsum_plan dw =
    einsum_plan_of<autodiff::einsum_gradient<"bsm,mh->bsh", 1>::spec,
                   autodiff::backward_policy<gather_weights>,
                   layout_type_of<mesh_t, dual(w_zero::layout)>, x_dp, dy_dp>;
static_assert(dw.input_collectives() == 0);
static_assert(dw.output_steps.collectives() == 1 &&
              dw.output_steps[0].kind == step_kind::reduce_scatter);
static_assert(dw.result == dual(w_zero::layout));

TEST_CASE("gradient specs at run time") {
  const einsum_spec s = parse_einsum("bsm,mh->bsh");
  CHECK(autodiff::gradient_spec_text(s, 0).view() == "bsh,mh->bsm");
  CHECK(autodiff::gradient_spec_text(s, 1).view() == "bsm,bsh->mh");
}
}  // namespace
