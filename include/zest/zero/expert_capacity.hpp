// zest/zero/expert_capacity.hpp — the slots each expert has for a group of tokens (GShard's
// capacity): what the MoE layers' gating (zest/moe/gating.hpp) drops beyond, and what the
// planner counts the experts' all-to-alls and activations with (zest/zero/step_inventory.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "zest/core/error.hpp"

namespace zest {

// C = ceil(k * S / E * factor), at least 1. Rounding noise in the product (20 * 1.1 =
// 22.000000000000004) does not add a slot.
inline std::size_t expert_capacity(std::size_t tokens_per_group, std::size_t experts, int top_k,
                                   double factor) {
  if (experts == 0 || top_k < 1 || !(factor > 0) || !std::isfinite(factor)) {
    throw shape_error(detail::message(
        "zest: expert_capacity: needs experts >= 1, top_k >= 1 and a finite factor > 0; got E = ",
        experts, ", k = ", top_k, ", factor = ", factor));
  }
  const double exact = static_cast<double>(top_k) * static_cast<double>(tokens_per_group) /
                       static_cast<double>(experts) * factor;
  const double c = std::ceil(exact * (1 - 1e-12));
  return std::max<std::size_t>(1, static_cast<std::size_t>(c));
}

}  // namespace zest
