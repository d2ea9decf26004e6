// zest/moe/detail/route_kernels.hpp — the loops of MoE routing (zest/moe/gating.hpp), one
// definition for every backend: function objects for zest::for_each_kernel and sum_kernel,
// plain loop bodies in the order of operations of the routing's definition, for any number k
// of choices per token. assign_slots
// carries a host member (one pass per group instead of one per group and expert); the host
// backend runs it, every other backend the call operator: the same slots either way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "zest/config.hpp"
#include "zest/core/device_math.hpp"
#include "zest/core/random.hpp"
#include "zest/moe/detail/routing_rules.hpp"

namespace zest::moe {

namespace detail {

// The gate of choice j of a token from its probabilities and its k choices: p[e_0] itself
// for k = 1 (Switch); renormalised over the k choices, p[e_j] / (p[e_0] + ... + p[e_k-1]),
// for k >= 2 (GShard's top-2: g1 = p1 / (p1 + p2)).
template <class T>
ZEST_HOST_DEVICE T gate_at(const T* p, const std::int32_t* choice, std::size_t k, std::size_t j) {
  if (k == 1) return p[choice[0]];
  T sum = p[choice[0]];
  for (std::size_t i = 1; i < k; ++i) sum += p[choice[i]];
  return p[choice[j]] / sum;
}

// Token t: its softmax row, logsumexp and k choices, by score p[e] + bias[e] (bias null: p
// alone). The bias steers the choice only; the gates are p's (zest/moe/gating.hpp).
template <class T>
struct route_token {
  const T* logits;
  T* probs;
  T* lse;
  std::int32_t* expert;
  const T* bias;  // [E] or null
  std::size_t experts, k;
  ZEST_HOST_DEVICE void operator()(std::size_t t) const {
    T* p = probs + t * experts;
    lse[t] = softmax_row(logits + t * experts, p, experts);
    const T* x = logits + t * experts;
    std::int32_t* choice = expert + t * k;
    for (std::size_t j = 0; j < k; ++j) {
      choice[j] = static_cast<std::int32_t>(argmax_excluding(p, bias, x, experts, choice, j));
    }
  }
};

// Call i = g * E + e: expert e's slots in group g. Its first choices in s order; then its
// second choices in s order, each routed or not (routes_choice), a routed one taking the next
// slot after all first choices; then the third choices after those, and so on; then capacity.
// A sequential count per (g, e), so the slots are the host's exactly; every assignment belongs
// to one expert, so to one call. routed_counts: the routed assignments before capacity (the
// expert's load).
template <class T>
struct assign_slots {
  const T* probs;
  const std::int32_t* expert;
  std::int32_t* slot;
  std::int64_t* first_counts;   // [G_l][E]
  std::int64_t* kept_counts;    // [G_l][E]
  std::int64_t* routed_counts;  // [G_l][E]
  std::size_t tokens, experts, capacity, first_group, k;
  std::uint64_t key;
  bool random;
  ZEST_HOST_DEVICE bool routed(std::size_t g, std::size_t t, std::size_t t0, std::size_t j) const {
    if (j == 0) return true;
    const T gate = gate_at(probs + t * experts, expert + t * k, k, j);
    const std::uint64_t token = (first_group + g) * tokens + (t - t0);
    return routes_second(static_cast<double>(gate), random, routing_uniform(key, token));
  }
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t g = i / experts;
    const auto e = static_cast<std::int32_t>(i % experts);
    const std::size_t t0 = g * tokens, t1 = t0 + tokens;
    std::int64_t count = 0;
    for (std::size_t j = 0; j < k; ++j) {
      for (std::size_t t = t0; t < t1; ++t) {
        if (expert[t * k + j] != e) continue;
        slot[t * k + j] = routed(g, t, t0, j) ? static_cast<std::int32_t>(count++) : -1;
      }
      if (j == 0) first_counts[i] = count;
    }
    routed_counts[i] = count;
    std::int64_t kept = 0;
    for (std::size_t a = t0 * k; a < t1 * k; ++a) {
      if (expert[a] != e) continue;
      if (slot[a] >= static_cast<std::int64_t>(capacity)) slot[a] = -1;
      if (slot[a] >= 0) ++kept;
    }
    kept_counts[i] = kept;
  }
  // The same slots, one pass over each group's tokens per choice instead of one per (g, e):
  // the routed row counts the slots taken so far, then capacity.
  void host(std::size_t cells) const {
    for (std::size_t g = 0; g < cells / experts; ++g) {
      std::int64_t* first = first_counts + g * experts;
      std::int64_t* kept = kept_counts + g * experts;
      std::int64_t* count = routed_counts + g * experts;
      std::fill(count, count + experts, 0);
      std::fill(kept, kept + experts, 0);
      const std::size_t t0 = g * tokens, t1 = t0 + tokens;
      for (std::size_t j = 0; j < k; ++j) {
        for (std::size_t t = t0; t < t1; ++t) {
          const auto e = static_cast<std::size_t>(expert[t * k + j]);
          slot[t * k + j] = routed(g, t, t0, j) ? static_cast<std::int32_t>(count[e]++) : -1;
        }
        if (j == 0) std::copy(count, count + experts, first);
      }
      for (std::size_t a = t0 * k; a < t1 * k; ++a) {
        if (slot[a] >= static_cast<std::int64_t>(capacity)) slot[a] = -1;
        if (slot[a] >= 0) ++kept[static_cast<std::size_t>(expert[a])];
      }
    }
  }
};

// Assignment a = t * k + j: the index tensors, the weight, and (combine non-null) the
// one-hot entries, distinct for distinct kept assignments.
template <class T>
struct write_routing {
  const T* probs;
  const std::int32_t* expert;
  const std::int32_t* slot;
  std::int32_t* expert_index;
  std::int32_t* slot_index;
  T* weight;
  T* combine;   // [n][E][C], or null
  T* dispatch;  // as combine
  std::size_t experts, capacity, k;
  ZEST_HOST_DEVICE void operator()(std::size_t a) const {
    const std::size_t t = a / k, j = a % k;
    const std::int32_t c = slot[a];
    expert_index[a] = expert[a];
    slot_index[a] = c;
    if (c < 0) {
      weight[a] = T(0);
      return;
    }
    const T w = gate_at(probs + t * experts, expert + t * k, k, j);
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
// renormalisation's and softmax's derivatives, aux and z terms; dp(e), the gradient of p[e], is
// recomputed where it is used (no scratch row).
//   k = 1: dp[e1] = dg1.
//   k = 2: dp[e1] = p2 (dg1 - dg2) / d^2, dp[e2] = -p1 (dg1 - dg2) / d^2, d = p1 + p2.
//   k > 2: g_j = p_j / d, d = sum_i p_i: dp[e_j] = dg_j / d - (sum_i dg_i p_i) / d^2.
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
  // The gradient of choice j's gate (0 for a dropped choice: its gate is the constant 0).
  ZEST_HOST_DEVICE T dgate(std::size_t t, std::size_t j) const {
    const std::int32_t c = slot[t * k + j];
    if (c < 0) return T(0);
    T v = T(0);
    const auto e = static_cast<std::size_t>(expert[t * k + j]);
    if (dcombine != nullptr)
      v += dcombine[(t * experts + e) * capacity + static_cast<std::size_t>(c)];
    if (dweight != nullptr) v += dweight[t * k + j];
    return v;
  }
  ZEST_HOST_DEVICE void operator()(std::size_t t) const {
    const std::size_t E = experts;
    const T* p = probs + t * E;
    const std::int32_t* choice = expert + t * k;
    const std::int64_t* counts = first_counts + (t / tokens) * E;
    // The gates' part, as two numbers: for k <= 2 add1 at e1 and -sub2 at e2; for k > 2 the
    // inverse of d and the weighted sum, the per-choice terms taken in dp.
    T add1 = dgate(t, 0), sub2 = T(0), inv = T(0), weighted = T(0);
    if (k == 2) {
      const T dg2 = dgate(t, 1);
      const T p1 = p[choice[0]], p2 = p[choice[1]], d = p1 + p2;
      const T diff = (add1 - dg2) / (d * d);
      add1 = p2 * diff;
      sub2 = p1 * diff;
    } else if (k > 2) {
      T d = p[choice[0]];
      for (std::size_t j = 1; j < k; ++j) d += p[choice[j]];
      inv = T(1) / d;
      for (std::size_t j = 0; j < k; ++j) weighted += dgate(t, j) * p[choice[j]];
      weighted *= inv * inv;
    }
    T dot = 0;
    for (std::size_t e = 0; e < E; ++e)
      dot += p[e] * dp(t, counts, choice, e, add1, sub2, inv, weighted);
    const T zt = dz * lse[t];
    T* out = dx + t * E;
    for (std::size_t e = 0; e < E; ++e) {
      out[e] = p[e] * (dp(t, counts, choice, e, add1, sub2, inv, weighted) - dot + zt);
    }
  }
  ZEST_HOST_DEVICE T dp(std::size_t t, const std::int64_t* counts, const std::int32_t* choice,
                        std::size_t e, T add1, T sub2, T inv, T weighted) const {
    T v = static_cast<T>(daux * static_cast<double>(counts[e]));
    const auto c = static_cast<std::int32_t>(e);
    if (k <= 2) {
      if (c == choice[0]) v += add1;
      if (k == 2 && c == choice[1]) v -= sub2;
      return v;
    }
    for (std::size_t j = 0; j < k; ++j) {
      if (c == choice[j]) v += dgate(t, j) * inv - weighted;
    }
    return v;
  }
};

// What the backward step needs of the forward, in the backend's memory.
template <class T, class B>
struct routing_tape {
  std::size_t groups = 0, local_groups = 0, tokens = 0, experts = 0, capacity = 0, k = 0;
  typename B::template buffer<T> probs;                    // [n][E]
  typename B::template buffer<T> lse;                      // [n]
  typename B::template buffer<std::int32_t> expert;        // [n][k]
  typename B::template buffer<std::int32_t> slot;          // [n][k], -1 = dropped
  typename B::template buffer<std::int64_t> first_counts;  // [local_groups][E]
};

}  // namespace detail

}  // namespace zest::moe
