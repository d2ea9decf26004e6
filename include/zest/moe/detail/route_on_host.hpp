// zest/moe/detail/route_on_host.hpp — the host backend's routing: loops over host memory
// (zest/moe/gating.hpp describes the routing).
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
#include "zest/core/error.hpp"
#include "zest/layout/layout.hpp"
#include "zest/moe/detail/routing_rules.hpp"
#include "zest/moe/routing.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::moe {

namespace detail {

// What the backward step needs of the forward, per local token (n = local groups * S).
template <class T>
struct routing_tape {
  std::size_t groups = 0, local_groups = 0, tokens = 0, experts = 0, capacity = 0;
  std::size_t k = 0;
  std::vector<T> probs;                    // [n][E]
  std::vector<T> lse;                      // [n]
  std::vector<std::int32_t> expert;        // [n][k]
  std::vector<std::int32_t> slot;          // [n][k], -1 = dropped
  std::vector<std::int64_t> first_counts;  // [local_groups][E]
};

// The gates of token t (renormalised for k = 2), kept or not.
template <class T>
std::array<T, 2> gates_of(const routing_tape<T>& r, std::size_t t) {
  const T* p = r.probs.data() + t * r.experts;
  const T p1 = p[r.expert[t * r.k]];
  if (r.k == 1) return {p1, T(0)};
  const T p2 = p[r.expert[t * r.k + 1]];
  return {p1 / (p1 + p2), p2 / (p1 + p2)};
}

// The host backend's routing: loops over host memory.
template <int K, sharded_tensor L>
auto route_on_host(const autodiff::variable<L>& logits, const gating_options& o, std::size_t C,
                   bool random) {
  using T = typename L::value_type;
  using mesh_t = typename L::mesh_type;
  using result_t = routing<mesh_t, L::layout, T>;
  using slot_t = typename result_t::slot_tensor;
  using index_t = typename result_t::index_tensor;
  using weight_t = typename result_t::weight_tensor;
  using scalar_t = typename result_t::scalar_tensor;
  const L& lv = logits.value();
  const std::size_t G = lv.extent('g'), S = lv.extent('s'), E = lv.extent('e');
  const routing_draw draw(o.seed);

  auto tape = std::make_shared<routing_tape<T>>();
  routing_tape<T>& r = *tape;
  r.groups = G;
  r.local_groups = lv.local_extents()[0];
  r.tokens = S;
  r.experts = E;
  r.capacity = C;
  r.k = K;
  const std::size_t n = r.local_groups * S;
  const std::size_t first_group = lv.local_offsets()[0];
  r.probs.resize(n * E);
  r.lse.resize(n);
  r.expert.assign(n * K, -1);
  r.slot.assign(n * K, -1);
  r.first_counts.assign(r.local_groups * E, 0);

  routing_stats stats;
  stats.tokens_per_expert.assign(E, 0);
  stats.kept_per_expert.assign(E, 0);
  stats.tokens = static_cast<std::int64_t>(n);
  stats.assignments = static_cast<std::int64_t>(n) * K;

  const T* px = lv.local().data();
  std::vector<std::int64_t> second_counts(E);
  for (std::size_t g = 0; g < r.local_groups; ++g) {
    std::int64_t* first = r.first_counts.data() + g * E;
    // First choices: slots in token order.
    for (std::size_t s = 0; s < S; ++s) {
      const std::size_t t = g * S + s;
      T* p = r.probs.data() + t * E;
      r.lse[t] = softmax_row(px + t * E, p, E);
      const std::size_t e1 = argmax_except(p, px + t * E, E, E);
      r.expert[t * K] = static_cast<std::int32_t>(e1);
      r.slot[t * K] = static_cast<std::int32_t>(first[e1]++);
      if constexpr (K == 2)
        r.expert[t * K + 1] = static_cast<std::int32_t>(argmax_except(p, px + t * E, E, e1));
    }
    // Second choices: the random decision first, then slots after all first choices.
    if constexpr (K == 2) {
      std::fill(second_counts.begin(), second_counts.end(), 0);
      for (std::size_t s = 0; s < S; ++s) {
        const std::size_t t = g * S + s;
        const auto e2 = static_cast<std::size_t>(r.expert[t * K + 1]);
        const bool routed = routes_second(static_cast<double>(gates_of(r, t)[1]), random,
                                          draw((first_group + g) * S + s));
        if (routed) r.slot[t * K + 1] = static_cast<std::int32_t>(first[e2] + second_counts[e2]++);
      }
    }
    for (std::size_t e = 0; e < E; ++e) stats.tokens_per_expert[e] += first[e];
  }
  for (std::size_t a = 0; a < n * K; ++a) {
    if (r.slot[a] >= static_cast<std::int64_t>(C)) r.slot[a] = -1;
    if (r.slot[a] >= 0) ++stats.kept_per_expert[static_cast<std::size_t>(r.expert[a])];
  }
  std::int64_t kept = 0;
  for (auto v : stats.kept_per_expert) kept += v;
  stats.dropped = stats.assignments - kept;

  // The routing tensors.
  const mesh_t& mesh = lv.mesh();
  const std::size_t C_dense = o.one_hot ? C : 0;
  slot_t combine(mesh, {G, S, E, C_dense});
  slot_t dispatch(mesh, {G, S, E, C_dense});
  index_t expert_index(mesh, {G, S, static_cast<std::size_t>(K)}, index_t::uninitialized);
  index_t slot_index(mesh, {G, S, static_cast<std::size_t>(K)}, index_t::uninitialized);
  weight_t weight(mesh, {G, S, static_cast<std::size_t>(K)});
  {
    T* pc = combine.local().data();
    T* pd = dispatch.local().data();
    T* pw = weight.local().data();
    std::copy(r.expert.begin(), r.expert.end(), expert_index.local().begin());
    std::copy(r.slot.begin(), r.slot.end(), slot_index.local().begin());
    for (std::size_t t = 0; t < n; ++t) {
      const std::array<T, 2> gate = gates_of(r, t);
      for (std::size_t j = 0; j < static_cast<std::size_t>(K); ++j) {
        const std::int32_t c = r.slot[t * K + j];
        if (c < 0) continue;
        const std::size_t at = (t * E + static_cast<std::size_t>(r.expert[t * K + j])) * C +
                               static_cast<std::size_t>(c);
        if (C_dense != 0) {
          pc[at] = gate[j];
          pd[at] = T(1);
        }
        pw[t * K + j] = gate[j];
      }
    }
  }

  // The losses: this rank's share of the means over all groups and tokens.
  double aux = 0, z = 0;
  for (std::size_t g = 0; g < r.local_groups; ++g) {
    for (std::size_t e = 0; e < E; ++e) {
      double mean_gate = 0;
      for (std::size_t s = 0; s < S; ++s)
        mean_gate += static_cast<double>(r.probs[(g * S + s) * E + e]);
      aux += static_cast<double>(r.first_counts[g * E + e]) * mean_gate;
    }
  }
  aux *= static_cast<double>(E) /
         (static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(G));
  for (std::size_t t = 0; t < n; ++t)
    z += static_cast<double>(r.lse[t]) * static_cast<double>(r.lse[t]);
  z /= static_cast<double>(G) * static_cast<double>(S);
  scalar_t aux_loss(mesh, {});
  scalar_t z_loss(mesh, {});
  aux_loss.local()[0] = static_cast<T>(aux);
  z_loss.local()[0] = static_cast<T>(z);

  autodiff::tape& owner = logits.owner();
  const bool grads = logits.requires_grad();
  auto combine_v = autodiff::detail::make_result(owner, std::move(combine), grads);
  auto weight_v = autodiff::detail::make_result(owner, std::move(weight), grads);
  auto aux_v = autodiff::detail::make_result(owner, std::move(aux_loss), grads);
  auto z_v = autodiff::detail::make_result(owner, std::move(z_loss), grads);
  if (grads) {
    // One step for all four outputs: they are made here, so every later use of them has run
    // (backward goes in reverse) when this step reads their gradients.
    owner.record([ln = logits.node(), cn = combine_v.node(), wn = weight_v.node(),
                  an = aux_v.node(), zn = z_v.node(), tape] {
      if (!cn->grad && !wn->grad && !an->grad && !zn->grad) return;
      const routing_tape<T>& r = *tape;
      const std::size_t E = r.experts, C = r.capacity, S = r.tokens;
      const std::size_t k = r.k;
      const double G = static_cast<double>(r.groups);
      const T* dcombine = cn->grad && cn->grad->local_count() != 0
                              ? std::as_const(*cn->grad).local().data()
                              : nullptr;
      const T* dweight = wn->grad ? std::as_const(*wn->grad).local().data() : nullptr;
      // d aux / d p[g][s][e] = daux * E * c_ge / (S^2 G);  d z / d x = dz * 2 lse p / (G S).
      const double daux = an->grad ? static_cast<double>(std::as_const(*an->grad).local()[0]) *
                                         static_cast<double>(E) /
                                         (static_cast<double>(S) * static_cast<double>(S) * G)
                                   : 0.0;
      const T dz = zn->grad
                       ? static_cast<T>(static_cast<double>(std::as_const(*zn->grad).local()[0]) *
                                        2.0 / (G * static_cast<double>(S)))
                       : T(0);
      autodiff::dual_tensor<L> dx(ln->value.mesh(), ln->value.extents(),
                                  autodiff::dual_tensor<L>::uninitialized);
      T* pdx = dx.local().data();
      std::vector<T> dp(E);
      const std::size_t n = r.local_groups * S;
      for (std::size_t t = 0; t < n; ++t) {
        const std::size_t g = t / S;
        const T* p = r.probs.data() + t * E;
        for (std::size_t e = 0; e < E; ++e) {
          dp[e] = static_cast<T>(daux * static_cast<double>(r.first_counts[g * E + e]));
        }
        // The gates' gradients: from combine at the kept slot, and from weight.
        std::array<T, 2> dgate{};
        for (std::size_t j = 0; j < k; ++j) {
          const std::int32_t c = r.slot[t * k + j];
          if (c < 0) continue;  // a dropped gate is the constant 0
          const auto e = static_cast<std::size_t>(r.expert[t * k + j]);
          if (dcombine) dgate[j] += dcombine[(t * E + e) * C + static_cast<std::size_t>(c)];
          if (dweight) dgate[j] += dweight[t * k + j];
        }
        const auto e1 = static_cast<std::size_t>(r.expert[t * k]);
        if (k == 1) {
          dp[e1] += dgate[0];
        } else {
          // g1 = p1 / (p1 + p2), g2 = p2 / (p1 + p2): dg1/dp1 = p2/d^2, dg1/dp2 = -p1/d^2.
          const auto e2 = static_cast<std::size_t>(r.expert[t * k + 1]);
          const T p1 = p[e1], p2 = p[e2], d = p1 + p2;
          const T diff = (dgate[0] - dgate[1]) / (d * d);
          dp[e1] += p2 * diff;
          dp[e2] -= p1 * diff;
        }
        // Softmax backward, plus the z-loss term.
        T dot = 0;
        for (std::size_t e = 0; e < E; ++e) dot += p[e] * dp[e];
        const T zt = dz * r.lse[t];
        T* out = pdx + t * E;
        for (std::size_t e = 0; e < E; ++e) out[e] = p[e] * (dp[e] - dot + zt);
      }
      ln->accumulate(std::move(dx));
    });
  }
  return result_t{.combine = std::move(combine_v),
                  .dispatch = std::move(dispatch),
                  .expert_index = std::move(expert_index),
                  .slot_index = std::move(slot_index),
                  .weight = std::move(weight_v),
                  .aux_loss = std::move(aux_v),
                  .z_loss = std::move(z_v),
                  .stats = std::move(stats),
                  .capacity = C};
}

}  // namespace detail

}  // namespace zest::moe
