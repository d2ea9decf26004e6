// zest/autodiff/relabel.hpp — zest::relabel (zest/tensor/relabel.hpp) on a tape's variables.
//
//   auto k = autodiff::relabel<"bnsd">(k_proj(x));   // "bntd" -> "bnsd", nothing copied
//
// The value is relabelled as a tensor is; the gradient is relabelled back to the input's
// dims, so it reaches the input in the dual of the input's layout with nothing moved.
#pragma once

#include <utility>

#include "zest/autodiff/tape.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/tensor/relabel.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

template <fixed_string NewDims, sharded_tensor X>
auto relabel(const variable<X>& x) {
  auto out = detail::make_result(x.owner(), zest::relabel<NewDims>(x.value()), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node()] {
      if (on->grad) xn->accumulate(zest::relabel<X::dims>(std::move(*on->grad)));
    });
  }
  return out;
}

}  // namespace zest::autodiff
