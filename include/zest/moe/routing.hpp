// zest/moe/routing.hpp — what MoE gating takes and returns: its options, the
// expert capacity, the routing (dispatch, combine, indices, weights, losses) and its
// statistics. The routing itself is zest/moe/gating.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/tensor.hpp"
#include "zest/zero/expert_capacity.hpp"

namespace zest::moe {

struct gating_options {
  int top_k = 2;                      // 2: GShard; 1: Switch; any k from 1 to E
  bool dropless = false;              // no capacity: every routed choice is kept (C = S)
  double capacity_factor = 1.25;      // training
  double eval_capacity_factor = 2.0;  // evaluation
  bool training = true;
  bool random_routing = true;  // GShard: route the 2nd expert with probability min(1, 2 * g2)
  double z_loss_weight = 0;    // router z-loss weight (0 = off), applied by the caller
  std::uint64_t seed = 0;      // random routing: u of (seed, global token index)
  // Also build the one-hot "gsec" dispatch and combine tensors (the einsum path). The index
  // path reads only expert_index, slot_index and weight; without them combine and dispatch
  // have capacity extent 0 (they grow as S^2 and are the layer's largest activations).
  bool one_hot = true;
  // Balancing without an auxiliary loss (DeepSeek-V3): a bias per expert added to the
  // probabilities for the choice of experts only, never to the gates. Empty: none; else E
  // values, read during the call (moe_layer keeps them and updates them after each step by
  // bias_update_rate * sign(mean load - load), the load counted over all ranks; 0: no updates).
  std::span<const double> routing_bias{};
  double bias_update_rate = 0;
};

// C = ceil(k * S / E * factor), at least 1 (zest/zero/expert_capacity.hpp).
using zest::expert_capacity;

// Counts over this rank's groups; totals over ranks are sums (the caller's business).
struct routing_stats {
  std::vector<std::int64_t> tokens_per_expert;   // first choices per expert (before capacity)
  std::vector<std::int64_t> routed_per_expert;   // assignments routed (all k), before capacity
  std::vector<std::int64_t> kept_per_expert;     // assignments kept (all k), after capacity
  std::vector<std::int64_t> dropped_per_expert;  // routed, then over capacity
  std::int64_t tokens = 0;                       // local tokens
  std::int64_t assignments = 0;                  // tokens * top_k
  std::int64_t dropped = 0;  // assignments dropped (over capacity, or a later choice not routed)
};

// Dims of the routing tensors: g group, s token, e expert, c slot, k choice.
inline constexpr fixed_string<5> slot_dims{"gsec"};
inline constexpr fixed_string<4> choice_dims{"gsk"};

// The routing of this rank's groups; TokenLayout is the layout of the "gse" logits.
template <class Mesh, layout_key TokenLayout, class T>
struct routing {
  static constexpr layout_value layout = to_layout(TokenLayout);
  static constexpr layout_value scalar_layout = autodiff::detail::scalar_sum_layout(layout);
  using slot_tensor = basic_tensor<T, Mesh, slot_dims, TokenLayout>;                // "gsec"
  using index_tensor = basic_tensor<std::int32_t, Mesh, choice_dims, TokenLayout>;  // "gsk"
  using weight_tensor = basic_tensor<T, Mesh, choice_dims, TokenLayout>;            // "gsk"
  using scalar_tensor = basic_tensor<T, Mesh, autodiff::detail::no_dims, scalar_layout>;

  // Gate weight where token s of group g goes to slot c of expert e, 0 elsewhere.
  autodiff::variable<slot_tensor> combine;
  // 1 where token s of group g goes to slot c of expert e, 0 elsewhere.
  slot_tensor dispatch;
  // The k-th choice of expert, kept or not, and its slot (-1 = dropped).
  index_tensor expert_index;
  index_tensor slot_index;
  // The k-th gate weight (0 = dropped).
  autodiff::variable<weight_tensor> weight;
  autodiff::variable<scalar_tensor> aux_loss;  // 1 at perfect balance
  autodiff::variable<scalar_tensor> z_loss;    // mean of logsumexp(logits)^2
  routing_stats stats;
  std::size_t capacity = 0;
};

// The routing type of logits L (a class, and routing_of<L> the alias for code where L is not
// dependent: see with_layout_for, zest/tensor/tensor.hpp).
template <sharded_tensor L>
struct routing_for {
  using type = routing<typename L::mesh_type, L::layout, typename L::value_type>;
};
template <sharded_tensor L>
using routing_of = typename routing_for<L>::type;

}  // namespace zest::moe
