// zest/moe/detail/route_generic.hpp — the routing of every backend but the host (emulated,
// CUDA): function objects for Backend::for_each and ::sum, the same decisions as the host's
// loops (zest/moe/gating.hpp describes the routing).
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
#include "zest/config.hpp"
#include "zest/core/device_math.hpp"
#include "zest/core/error.hpp"
#include "zest/core/random.hpp"
#include "zest/layout/layout.hpp"
#include "zest/moe/detail/routing_rules.hpp"
#include "zest/moe/routing.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::moe {

namespace detail {

// ---------------------------------------------------------------------------------------
// The generic path (every backend but the host): function objects for Backend::for_each and
// Backend::sum, each a loop body of route_on_host in the same order of operations, so the
// emulated backend reproduces the host's numbers.

// The uniform draw of random routing for global token index i, key = splitmix64(seed).
ZEST_HOST_DEVICE inline double routing_uniform(std::uint64_t key, std::uint64_t i) {
  return static_cast<double>(splitmix64(key ^ i) >> 11) * 0x1p-53;
}

template <class T>
struct gate_pair {
  T first, second;
};

// The gates of a token from its probabilities and its k choices (renormalised for k = 2).
template <class T>
ZEST_HOST_DEVICE gate_pair<T> gates_at(const T* p, const std::int32_t* choice, std::size_t k) {
  const T p1 = p[choice[0]];
  if (k == 1) return {p1, T(0)};
  const T p2 = p[choice[1]];
  return {p1 / (p1 + p2), p2 / (p1 + p2)};
}

// Token t: its softmax row, logsumexp and choices.
template <class T, int K>
struct route_token {
  const T* logits;
  T* probs;
  T* lse;
  std::int32_t* expert;
  std::size_t experts;
  ZEST_HOST_DEVICE void operator()(std::size_t t) const {
    T* p = probs + t * experts;
    lse[t] = softmax_row(logits + t * experts, p, experts);
    const T* x = logits + t * experts;
    const std::size_t e1 = argmax_except(p, x, experts, experts);
    expert[t * K] = static_cast<std::int32_t>(e1);
    if constexpr (K == 2) {
      expert[t * K + 1] = static_cast<std::int32_t>(argmax_except(p, x, experts, e1));
    }
  }
};

// Call i = g * E + e: expert e's slots in group g. Its first choices in s order; then its
// second choices in s order, each routed or not by its draw, a routed one taking the next
// slot after all first choices; then capacity. A sequential count per (g, e), so the slots
// are the host's exactly; every assignment belongs to one expert, so to one call.
template <class T, int K>
struct assign_slots {
  const T* probs;
  const std::int32_t* expert;
  std::int32_t* slot;
  std::int64_t* first_counts;  // [G_l][E]
  std::int64_t* kept_counts;   // [G_l][E]
  std::size_t tokens, experts, capacity, first_group;
  std::uint64_t key;
  bool random;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t g = i / experts;
    const auto e = static_cast<std::int32_t>(i % experts);
    const std::size_t t0 = g * tokens, t1 = t0 + tokens;
    std::int64_t first = 0;
    for (std::size_t t = t0; t < t1; ++t) {
      if (expert[t * K] == e) slot[t * K] = static_cast<std::int32_t>(first++);
    }
    first_counts[i] = first;
    if constexpr (K == 2) {
      std::int64_t second = 0;
      for (std::size_t t = t0; t < t1; ++t) {
        if (expert[t * K + 1] != e) continue;
        const T g2 = gates_at(probs + t * experts, expert + t * K, K).second;
        const std::uint64_t token = (first_group + g) * tokens + (t - t0);
        const bool routed =
            routes_second(static_cast<double>(g2), random, routing_uniform(key, token));
        slot[t * K + 1] = routed ? static_cast<std::int32_t>(first + second++) : -1;
      }
    }
    std::int64_t kept = 0;
    for (std::size_t a = t0 * K; a < t1 * K; ++a) {
      if (expert[a] != e) continue;
      if (slot[a] >= static_cast<std::int64_t>(capacity)) slot[a] = -1;
      if (slot[a] >= 0) ++kept;
    }
    kept_counts[i] = kept;
  }
};

// Assignment a = t * K + j: the index tensors, the weight, and (combine non-null) the
// one-hot entries, distinct for distinct kept assignments.
template <class T, int K>
struct write_routing {
  const T* probs;
  const std::int32_t* expert;
  const std::int32_t* slot;
  std::int32_t* expert_index;
  std::int32_t* slot_index;
  T* weight;
  T* combine;   // [n][E][C], or null
  T* dispatch;  // as combine
  std::size_t experts, capacity;
  ZEST_HOST_DEVICE void operator()(std::size_t a) const {
    const std::size_t t = a / K, j = a % K;
    const std::int32_t c = slot[a];
    expert_index[a] = expert[a];
    slot_index[a] = c;
    if (c < 0) {
      weight[a] = T(0);
      return;
    }
    const gate_pair<T> gate = gates_at(probs + t * experts, expert + t * K, K);
    const T w = j == 0 ? gate.first : gate.second;
    weight[a] = w;
    if (combine != nullptr) {
      const std::size_t at = (t * experts + static_cast<std::size_t>(expert[a])) * capacity +
                             static_cast<std::size_t>(c);
      combine[at] = w;
      dispatch[at] = T(1);
    }
  }
};

// Call i = g * E + e: c_ge * sum_s p[g][s][e] (the host's order: s, then g and e).
template <class T>
struct aux_term {
  const T* probs;
  const std::int64_t* first_counts;
  std::size_t tokens, experts;
  ZEST_HOST_DEVICE double operator()(std::size_t i) const {
    const std::size_t g = i / experts, e = i % experts;
    double mean_gate = 0;
    for (std::size_t s = 0; s < tokens; ++s)
      mean_gate += static_cast<double>(probs[(g * tokens + s) * experts + e]);
    return static_cast<double>(first_counts[i]) * mean_gate;
  }
};

template <class T>
struct squared {
  const T* values;
  ZEST_HOST_DEVICE double operator()(std::size_t i) const {
    return static_cast<double>(values[i]) * static_cast<double>(values[i]);
  }
};

// Token t's row of d logits: the gates' gradients (combine at the kept slot, weight), the
// renormalisation's and softmax's derivatives, aux and z terms — route_on_host's backward
// without its scratch row: dp(e) is recomputed where it is used.
template <class T>
struct gating_backward {
  const T* probs;
  const T* lse;
  const std::int32_t* expert;
  const std::int32_t* slot;
  const std::int64_t* first_counts;
  const T* dcombine;  // or null
  const T* dweight;   // or null
  T* dx;
  double daux;
  T dz;
  std::size_t tokens, experts, capacity, k;
  ZEST_HOST_DEVICE void operator()(std::size_t t) const {
    const std::size_t E = experts;
    const T* p = probs + t * E;
    const std::int64_t* counts = first_counts + (t / tokens) * E;
    T dgate[2] = {T(0), T(0)};
    for (std::size_t j = 0; j < k; ++j) {
      const std::int32_t c = slot[t * k + j];
      if (c < 0) continue;  // a dropped gate is the constant 0
      const auto e = static_cast<std::size_t>(expert[t * k + j]);
      if (dcombine != nullptr) {
        dgate[j] += dcombine[(t * E + e) * capacity + static_cast<std::size_t>(c)];
      }
      if (dweight != nullptr) dgate[j] += dweight[t * k + j];
    }
    const auto e1 = static_cast<std::size_t>(expert[t * k]);
    std::size_t e2 = E;
    T add1 = dgate[0], sub2 = T(0);
    if (k == 2) {
      // g1 = p1 / (p1 + p2), g2 = p2 / (p1 + p2): dg1/dp1 = p2/d^2, dg1/dp2 = -p1/d^2.
      e2 = static_cast<std::size_t>(expert[t * k + 1]);
      const T p1 = p[e1], p2 = p[e2], d = p1 + p2;
      const T diff = (dgate[0] - dgate[1]) / (d * d);
      add1 = p2 * diff;
      sub2 = p1 * diff;
    }
    T dot = 0;
    for (std::size_t e = 0; e < E; ++e) dot += p[e] * dp(counts, e, e1, e2, add1, sub2);
    const T zt = dz * lse[t];
    T* out = dx + t * E;
    for (std::size_t e = 0; e < E; ++e) {
      out[e] = p[e] * (dp(counts, e, e1, e2, add1, sub2) - dot + zt);
    }
  }
  ZEST_HOST_DEVICE T dp(const std::int64_t* counts, std::size_t e, std::size_t e1, std::size_t e2,
                        T add1, T sub2) const {
    T v = static_cast<T>(daux * static_cast<double>(counts[e]));
    if (e == e1) v += add1;
    if (e == e2) v -= sub2;
    return v;
  }
};

// What the backward step needs of the forward, in the backend's memory.
template <class T, class B>
struct device_routing_tape {
  std::size_t groups = 0, local_groups = 0, tokens = 0, experts = 0, capacity = 0, k = 0;
  typename B::template buffer<T> probs;                    // [n][E]
  typename B::template buffer<T> lse;                      // [n]
  typename B::template buffer<std::int32_t> expert;        // [n][k]
  typename B::template buffer<std::int32_t> slot;          // [n][k], -1 = dropped
  typename B::template buffer<std::int64_t> first_counts;  // [local_groups][E]
};

// The routing on any backend but the host: decided on the device (see the top of this file);
// the counts per (group, expert) come to the host for the statistics.
template <int K, sharded_tensor L>
auto route_generic(const autodiff::variable<L>& logits, const gating_options& o, std::size_t C,
                   bool random) {
  using T = typename L::value_type;
  using B = typename L::backend_type;
  using mesh_t = typename L::mesh_type;
  using result_t = routing<mesh_t, L::layout, T>;
  using slot_t = typename result_t::slot_tensor;
  using index_t = typename result_t::index_tensor;
  using weight_t = typename result_t::weight_tensor;
  using scalar_t = typename result_t::scalar_tensor;
  const L& lv = logits.value();
  const std::size_t G = lv.extent('g'), S = lv.extent('s'), E = lv.extent('e');
  const std::size_t local_groups = lv.local_extents()[0];
  const std::size_t n = local_groups * S, cells = local_groups * E;

  auto tape = std::make_shared<device_routing_tape<T, B>>();
  device_routing_tape<T, B>& r = *tape;
  r.groups = G;
  r.local_groups = local_groups;
  r.tokens = S;
  r.experts = E;
  r.capacity = C;
  r.k = K;
  r.probs = typename B::template buffer<T>(n * E);
  r.lse = typename B::template buffer<T>(n);
  r.expert = typename B::template buffer<std::int32_t>(n * K);
  r.slot = typename B::template buffer<std::int32_t>(n * K);
  r.first_counts = typename B::template buffer<std::int64_t>(cells);
  typename B::template buffer<std::int64_t> kept_counts(cells);

  B::for_each(
      n, route_token<T, K>{lv.local().data(), r.probs.data(), r.lse.data(), r.expert.data(), E});
  B::for_each(cells, assign_slots<T, K>{r.probs.data(), r.expert.data(), r.slot.data(),
                                        r.first_counts.data(), kept_counts.data(), S, E, C,
                                        lv.local_offsets()[0], splitmix64(o.seed), random});

  // The statistics, from the counts per (group, expert).
  routing_stats stats;
  stats.tokens_per_expert.assign(E, 0);
  stats.kept_per_expert.assign(E, 0);
  stats.tokens = static_cast<std::int64_t>(n);
  stats.assignments = static_cast<std::int64_t>(n) * K;
  {
    std::vector<std::int64_t> first(cells), kept(cells);
    B::to_host(std::span<const std::int64_t>(r.first_counts.data(), cells), first.data());
    B::to_host(std::span<const std::int64_t>(kept_counts.data(), cells), kept.data());
    std::int64_t kept_total = 0;
    for (std::size_t i = 0; i < cells; ++i) {
      stats.tokens_per_expert[i % E] += first[i];
      stats.kept_per_expert[i % E] += kept[i];
      kept_total += kept[i];
    }
    stats.dropped = stats.assignments - kept_total;
  }

  // The routing tensors.
  const mesh_t& mesh = lv.mesh();
  const std::size_t C_dense = o.one_hot ? C : 0;
  slot_t combine(mesh, {G, S, E, C_dense});
  slot_t dispatch(mesh, {G, S, E, C_dense});
  index_t expert_index(mesh, {G, S, static_cast<std::size_t>(K)}, index_t::uninitialized);
  index_t slot_index(mesh, {G, S, static_cast<std::size_t>(K)}, index_t::uninitialized);
  weight_t weight(mesh, {G, S, static_cast<std::size_t>(K)}, weight_t::uninitialized);
  B::for_each(n * K, write_routing<T, K>{r.probs.data(), r.expert.data(), r.slot.data(),
                                         expert_index.local().data(), slot_index.local().data(),
                                         weight.local().data(),
                                         C_dense != 0 ? combine.local().data() : nullptr,
                                         C_dense != 0 ? dispatch.local().data() : nullptr, E, C});

  // The losses: this rank's share of the means over all groups and tokens.
  double aux = B::sum(cells, aux_term<T>{r.probs.data(), r.first_counts.data(), S, E});
  aux *= static_cast<double>(E) /
         (static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(G));
  double z = B::sum(n, squared<T>{r.lse.data()});
  z /= static_cast<double>(G) * static_cast<double>(S);
  scalar_t aux_loss(mesh, {});
  scalar_t z_loss(mesh, {});
  B::fill(aux_loss.local().data(), 1, static_cast<T>(aux));
  B::fill(z_loss.local().data(), 1, static_cast<T>(z));

  autodiff::tape& owner = logits.owner();
  const bool grads = logits.requires_grad();
  auto combine_v = autodiff::detail::make_result(owner, std::move(combine), grads);
  auto weight_v = autodiff::detail::make_result(owner, std::move(weight), grads);
  auto aux_v = autodiff::detail::make_result(owner, std::move(aux_loss), grads);
  auto z_v = autodiff::detail::make_result(owner, std::move(z_loss), grads);
  if (grads) {
    owner.record([ln = logits.node(), cn = combine_v.node(), wn = weight_v.node(),
                  an = aux_v.node(), zn = z_v.node(), tape] {
      if (!cn->grad && !wn->grad && !an->grad && !zn->grad) return;
      const device_routing_tape<T, B>& r = *tape;
      const std::size_t E = r.experts, S = r.tokens;
      const double G = static_cast<double>(r.groups);
      const T* dcombine = cn->grad && cn->grad->local_count() != 0
                              ? std::as_const(*cn->grad).local().data()
                              : nullptr;
      const T* dweight = wn->grad ? std::as_const(*wn->grad).local().data() : nullptr;
      // The scalars' gradients, one element each, read on the host.
      const double daux = an->grad
                              ? static_cast<double>(std::as_const(*an->grad).local_to_host()[0]) *
                                    static_cast<double>(E) /
                                    (static_cast<double>(S) * static_cast<double>(S) * G)
                              : 0.0;
      const T dz =
          zn->grad
              ? static_cast<T>(static_cast<double>(std::as_const(*zn->grad).local_to_host()[0]) *
                               2.0 / (G * static_cast<double>(S)))
              : T(0);
      autodiff::dual_tensor<L> dx(ln->value.mesh(), ln->value.extents(),
                                  autodiff::dual_tensor<L>::uninitialized);
      B::for_each(r.local_groups * S,
                  gating_backward<T>{r.probs.data(), r.lse.data(), r.expert.data(), r.slot.data(),
                                     r.first_counts.data(), dcombine, dweight, dx.local().data(),
                                     daux, dz, S, E, r.capacity, r.k});
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
