// zest/moe/detail/routing_rules.hpp — the per-token rules that every backend's routing
// follows alike: the random draw, the softmax row, the choice of experts (ties included) and
// whether a second choice is routed.
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

#include "zest/config.hpp"
#include "zest/core/device_math.hpp"
#include "zest/core/random.hpp"

namespace zest::moe {

namespace detail {

// The uniform draw in [0, 1) of random routing for global token index i, key =
// splitmix64(seed).
ZEST_HOST_DEVICE inline double routing_uniform(std::uint64_t key, std::uint64_t i) {
  return static_cast<double>(splitmix64(key ^ i) >> 11) * 0x1p-53;
}

// Softmax of one row of E logits into p; returns logsumexp. (Every backend: dmath's exp and
// log are std::exp and std::log on the host.)
template <class T>
ZEST_HOST_DEVICE T softmax_row(const T* x, T* p, std::size_t n) {
  T m = x[0];
  for (std::size_t e = 1; e < n; ++e) m = dmath::max(m, x[e]);
  T sum = 0;
  for (std::size_t e = 0; e < n; ++e) sum += (p[e] = dmath::exp(x[e] - m));
  const T inv = T(1) / sum;
  for (std::size_t e = 0; e < n; ++e) p[e] *= inv;
  return m + dmath::log(sum);
}

// The index of the largest score p[e] + bias[e] (bias null: p[e]) among the experts not in
// chosen[0, j). Ties (probabilities that underflow to the same value, 0 most often, when
// logits are far apart) go to the larger logit x[e], then to the lowest index: p alone would
// pick the lowest index among experts whose logits differ.
template <class T>
ZEST_HOST_DEVICE std::size_t argmax_excluding(const T* p, const T* bias, const T* x, std::size_t n,
                                              const std::int32_t* chosen, std::size_t j) {
  std::size_t best = n;
  T best_score = T(0);
  for (std::size_t e = 0; e < n; ++e) {
    bool taken = false;
    for (std::size_t i = 0; i < j; ++i) taken = taken || chosen[i] == static_cast<std::int32_t>(e);
    if (taken) continue;
    const T score = bias != nullptr ? p[e] + bias[e] : p[e];
    if (best == n || score > best_score || (score == best_score && x[e] > x[best])) {
      best = e;
      best_score = score;
    }
  }
  return best;
}

// Whether a choice after the first with gate g2 is routed (takes a slot, if one is free):
// never with a zero gate (it would be dispatched and combined with weight 0: a slot taken for
// nothing); under random routing (top-2 only) only when the token's draw u < 2 * g2 (GShard).
ZEST_HOST_DEVICE inline bool routes_second(double g2, bool random, double u) {
  return g2 > 0 && (!random || u < 2 * g2);
}

}  // namespace detail

}  // namespace zest::moe
