// zest/moe/detail/route_kernels.hpp — the loops of MoE routing (zest/moe/gating.hpp), one
// definition for every backend: function objects for zest::for_each_kernel and sum_kernel,
// plain loop bodies in the order of operations of the routing's definition. assign_slots
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
  // The same slots, one pass over each group's tokens instead of one per (g, e): the slots
  // of a group's first choices in s order, then its routed second choices after them (the
  // group's row of kept_counts counts them meanwhile), then capacity.
  void host(std::size_t cells) const {
    for (std::size_t g = 0; g < cells / experts; ++g) {
      std::int64_t* first = first_counts + g * experts;
      std::int64_t* kept = kept_counts + g * experts;
      std::fill(first, first + experts, 0);
      std::fill(kept, kept + experts, 0);
      const std::size_t t0 = g * tokens, t1 = t0 + tokens;
      for (std::size_t t = t0; t < t1; ++t) {
        slot[t * K] = static_cast<std::int32_t>(first[expert[t * K]]++);
      }
      if constexpr (K == 2) {
        std::int64_t* second = kept;
        for (std::size_t t = t0; t < t1; ++t) {
          const auto e2 = static_cast<std::size_t>(expert[t * K + 1]);
          const T g2 = gates_at(probs + t * experts, expert + t * K, K).second;
          const std::uint64_t token = (first_group + g) * tokens + (t - t0);
          const bool routed =
              routes_second(static_cast<double>(g2), random, routing_uniform(key, token));
          slot[t * K + 1] = routed ? static_cast<std::int32_t>(first[e2] + second[e2]++) : -1;
        }
        std::fill(kept, kept + experts, 0);
      }
      for (std::size_t a = t0 * K; a < t1 * K; ++a) {
        if (slot[a] >= static_cast<std::int64_t>(capacity)) slot[a] = -1;
        if (slot[a] >= 0) ++kept[static_cast<std::size_t>(expert[a])];
      }
    }
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
// renormalisation's and softmax's derivatives, aux and z terms; dp(e), the gradient of p[e], is
// recomputed where it is used (no scratch row).
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
