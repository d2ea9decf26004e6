// expect: zest layout_of_t / layout_text_v / show_layout / layout_is: the argument is not a zest tensor type
// The user asks for the layout of something that is not a tensor type (here its value type).
#include <zest/layout/layout_of.hpp>
#include <zest/mesh/mesh.hpp>
#include <zest/tensor/tensor.hpp>

using mesh_t = zest::local_mesh<"dp">;
using x_t = zest::tensor<float, mesh_t, "bm", zest::layout<zest::split<'b', "dp">>>;
using l_t = zest::layout_of_t<x_t::value_type>;

int main() {}
