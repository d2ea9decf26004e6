// expect: zest show_layout: the tensor type's layout is the text in deduced_layout
// expect: {"split(b:dp) partial(tp)"}
// The user wants to see the layout an einsum deduced: show_layout stops the compile and the
// error prints it, in the notation of layout_string, explain and the run-time errors.
#include <zest/einsum/einsum.hpp>
#include <zest/layout/layout_of.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

#include <utility>

using mesh_t = zest::local_mesh<"dp", "tp">;
using x_t = zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "dp">>>;
using w_t = zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "tp">>>;
using y_t = decltype(zest::einsum<"bsm,mh->bsh">(std::declval<x_t>(), std::declval<w_t>()));

static_assert(zest::show_layout<y_t>);

int main() {}
