// zest/tensor/relabel.hpp — the same tensor under other dim letters, for free.
//
//   auto k2 = zest::relabel<"bsnd">(k);   // k: "btnd"; the time dim is now called 's'
//
// Letters name dims positionally: the i-th letter of the new dims names the i-th dim. The
// storage moves (or is copied from an lvalue) unchanged, and the layout follows the dims:
// a split of 't' becomes a split of 's'. Einsum specs name operand dims in stored order,
// so attention's scores "btnd,bsnd->bnts" need the keys relabelled first. The same on a
// tape's variables is autodiff::relabel (zest/autodiff/relabel.hpp).
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

namespace detail {
template <fixed_string From, fixed_string To>
constexpr layout_value relabel_layout(layout_value v) {
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (v.is_split(a)) v.axes[a].dim = To[From.find(v.axes[a].dim)];
  }
  return v;
}
template <class X, fixed_string NewDims>
struct relabelled {
  static constexpr layout_value layout = relabel_layout<X::dims, NewDims>(X::layout);
  using type = basic_tensor<typename X::value_type, typename X::mesh_type, NewDims, layout>;
};
}  // namespace detail

template <fixed_string NewDims, sharded_tensor X>
auto relabel(X&& x) {
  using x_t = std::remove_cvref_t<X>;
  static_assert(NewDims.size() == x_t::rank,
                "zest relabel: the new dims must name every dim of the tensor, one letter each. "
                "Fix: give as many letters as the tensor has dims.");
  using y_t = typename detail::relabelled<x_t, NewDims>::type;
  if constexpr (!std::is_lvalue_reference_v<X> && !std::is_const_v<std::remove_reference_t<X>>) {
    return y_t(x.mesh(), x.extents(), std::move(x.storage()));
  } else {
    return y_t(x.mesh(), x.extents(), typename y_t::storage_type(x.storage()));
  }
}

}  // namespace zest
