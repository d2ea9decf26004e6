// expect: zest layout_is: the tensor's layout is not the expected one
// expect: actual_layout<
// expect: {"split(b:dp) partial(tp)"}
// expect: expected_layout<
// expect: {"split(b:dp)"}
// The user expects the einsum's result to be split(b:dp), but the contraction over m, which
// is split over tp, leaves a pending sum over tp: the error prints both layouts.
#include <zest/einsum/einsum.hpp>
#include <zest/layout/layout_of.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

#include <utility>

using mesh_t = zest::local_mesh<"dp", "tp">;
using x_t = zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "dp">>>;
using w_t = zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "tp">>>;
using y_t = decltype(zest::einsum<"bsm,mh->bsh">(std::declval<x_t>(), std::declval<w_t>()));

static_assert(zest::layout_is<y_t, zest::layout<zest::split<'b', "dp">>>);

int main() {}
