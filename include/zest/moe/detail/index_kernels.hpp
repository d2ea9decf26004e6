// zest/moe/detail/index_kernels.hpp — the loops of MoE's index path (dispatch_by_index,
// combine_by_index in zest/moe/dispatch.hpp), one definition for every backend: function
// objects for zest::for_each_kernel and sum_kernel, one call per output element, each summing
// its inputs in assignment order (no atomics). A slot row is filled by the assignments routed
// to it, listed by link_routes; a token row by its k choices. The host backend runs the host
// members (a row at a time, vectorised; the lists in one pass per group), every other backend
// the call operators: the same sums in the same order either way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "zest/autodiff/kernels.hpp"
#include "zest/config.hpp"

namespace zest::moe {

namespace detail {

// 1 for a kept route outside [0, E) x [0, C).
struct bad_route {
  const std::int32_t* expert;
  const std::int32_t* slot;
  std::size_t experts, capacity;
  ZEST_HOST_DEVICE double operator()(std::size_t a) const {
    const std::int32_t c = slot[a];
    if (c < 0) return 0.0;
    const std::int32_t e = expert[a];
    return e < 0 || static_cast<std::size_t>(e) >= experts ||
                   static_cast<std::size_t>(c) >= capacity
               ? 1.0
               : 0.0;
  }
};

// Call i = g * E + e: the lists of expert e's slot rows in group g, row (e, g, c) = (e * G_l +
// g) * C + c: head[row] is its first assignment a = t * k + j, next[a] the one after a (-1:
// none), in assignment order (built backwards).
struct link_routes {
  const std::int32_t* expert;
  const std::int32_t* slot;
  std::int64_t* head;                                // [E][G_l][C]
  std::int64_t* next;                                // [n][k]
  std::size_t groups, per_group, experts, capacity;  // per_group = S * k
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t g = i / experts, e = i % experts;
    std::int64_t* h = head + (e * groups + g) * capacity;
    for (std::size_t c = 0; c < capacity; ++c) h[c] = -1;
    for (std::size_t a = (g + 1) * per_group; a-- > g * per_group;) {
      const std::int32_t c = slot[a];
      if (c < 0 || expert[a] != static_cast<std::int32_t>(e)) continue;
      next[a] = h[c];
      h[c] = static_cast<std::int64_t>(a);
    }
  }
  // The same lists, one backward pass over each group's assignments instead of one per
  // (g, e).
  void host(std::size_t) const {
    std::fill(head, head + experts * groups * capacity, std::int64_t{-1});
    for (std::size_t g = 0; g < groups; ++g) {
      for (std::size_t a = (g + 1) * per_group; a-- > g * per_group;) {
        const std::int32_t c = slot[a];
        if (c < 0) continue;
        std::int64_t& h = head[(static_cast<std::size_t>(expert[a]) * groups + g) * capacity +
                               static_cast<std::size_t>(c)];
        next[a] = h;
        h = static_cast<std::int64_t>(a);
      }
    }
  }
};

// Element (row, j) of a slot-side tensor [E][G_l][C][width]: the sum over the assignments a
// listed at row of scale(a) * x[t(a), j], scale = weight[a] (or 1 without weight).
// dispatch_by_index's forward; combine_by_index's gradient of y.
template <class T>
struct gather_slots {
  const T* x;       // [n][width]
  const T* weight;  // [n][k], or null
  const std::int64_t* head;
  const std::int64_t* next;
  T* y;
  std::size_t width, k;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t row = i / width, j = i % width;
    T sum{};
    for (std::int64_t a = head[row]; a >= 0; a = next[a]) {
      const T v = x[(static_cast<std::size_t>(a) / k) * width + j];
      sum += weight != nullptr ? weight[a] * v : v;
    }
    y[i] = sum;
  }
  // A row at a time: the same sums, each element's terms in the same order.
  void host(std::size_t n) const {
    if (width == 0) return;
    using autodiff::kernels::host_loops::as_array;
    for (std::size_t row = 0; row < n / width; ++row) {
      auto out = as_array(y + row * width, width);
      out.setZero();
      for (std::int64_t a = head[row]; a >= 0; a = next[a]) {
        const auto in = as_array(x + (static_cast<std::size_t>(a) / k) * width, width);
        if (weight != nullptr) {
          out += weight[a] * in;
        } else {
          out += in;
        }
      }
    }
  }
};

// Element (t, j) of a token-side tensor [n][width]: the sum over token t's kept choices of
// scale * y[row, j]. dispatch_by_index's gradient of x; combine_by_index's forward.
template <class T>
struct gather_tokens {
  const T* y;       // [E][G_l][C][width]
  const T* weight;  // [n][k], or null
  const std::int32_t* expert;
  const std::int32_t* slot;
  T* x;
  std::size_t width, k, tokens, groups, capacity;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t t = i / width, j = i % width, g = t / tokens;
    T sum{};
    for (std::size_t a = t * k; a < (t + 1) * k; ++a) {
      const std::int32_t c = slot[a];
      if (c < 0) continue;
      const std::size_t row = (static_cast<std::size_t>(expert[a]) * groups + g) * capacity +
                              static_cast<std::size_t>(c);
      const T v = y[row * width + j];
      sum += weight != nullptr ? weight[a] * v : v;
    }
    x[i] = sum;
  }
  // A row at a time: the same sums, each element's terms in the same order.
  void host(std::size_t n) const {
    if (width == 0) return;
    using autodiff::kernels::host_loops::as_array;
    for (std::size_t t = 0; t < n / width; ++t) {
      const std::size_t g = t / tokens;
      auto out = as_array(x + t * width, width);
      out.setZero();
      for (std::size_t a = t * k; a < (t + 1) * k; ++a) {
        const std::int32_t c = slot[a];
        if (c < 0) continue;
        const std::size_t row = (static_cast<std::size_t>(expert[a]) * groups + g) * capacity +
                                static_cast<std::size_t>(c);
        const auto in = as_array(y + row * width, width);
        if (weight != nullptr) {
          out += weight[a] * in;
        } else {
          out += in;
        }
      }
    }
  }
};

// Assignment a: dz[t(a)] . y[row(a)], 0 when dropped (combine_by_index's gradient of weight).
template <class T>
struct route_dot {
  const T* dz;
  const T* y;
  const std::int32_t* expert;
  const std::int32_t* slot;
  T* dw;
  std::size_t width, k, tokens, groups, capacity;
  ZEST_HOST_DEVICE void operator()(std::size_t a) const {
    const std::int32_t c = slot[a];
    if (c < 0) {
      dw[a] = T(0);
      return;
    }
    const std::size_t t = a / k, g = t / tokens;
    const std::size_t row =
        (static_cast<std::size_t>(expert[a]) * groups + g) * capacity + static_cast<std::size_t>(c);
    const T* p = dz + t * width;
    const T* q = y + row * width;
    T sum{};
    for (std::size_t j = 0; j < width; ++j) sum += p[j] * q[j];
    dw[a] = sum;
  }
};

// The routes of the local "gsk" shards in the backend's memory: the indices (copied, for the
// backward steps) and, if asked, the lists of the slot rows.
template <class B>
struct index_routes {
  typename B::template buffer<std::int32_t> expert, slot;  // [n][k]
  typename B::template buffer<std::int64_t> head;          // [E][G_l][C]
  typename B::template buffer<std::int64_t> next;          // [n][k]
  std::size_t groups = 0, tokens = 0, k = 0, experts = 0, capacity = 0;
};

}  // namespace detail

}  // namespace zest::moe
