// zest/moe/detail/dropless_kernels.hpp — the loops of dropless experts
// (zest/moe/dropless.hpp), one definition for every backend: function objects for
// zest::for_each_kernel, one call per output element, each written once or summed in choice
// order (no atomics). Rows of the concatenated expert inputs are found through `base`: the
// row of a kept choice a = t * k + j of group g going to expert e is base[g * E + e] + slot[a].
// The host backend runs the host members (a row at a time), every other backend the call
// operators: the same values either way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "zest/autodiff/kernels.hpp"
#include "zest/config.hpp"

namespace zest::moe {

namespace detail {

// Call i = g * E + e: the kept choices of expert e in group g, and one past their largest
// slot (equal when the slots are 0 .. count - 1, as a routing's are).
struct count_routes {
  const std::int32_t* expert;
  const std::int32_t* slot;
  std::int64_t* kept;              // [G_l][E]
  std::int64_t* span;              // [G_l][E]
  std::size_t experts, per_group;  // per_group = S * k
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t g = i / experts;
    const auto e = static_cast<std::int32_t>(i % experts);
    std::int64_t n = 0, end = 0;
    for (std::size_t a = g * per_group; a < (g + 1) * per_group; ++a) {
      if (slot[a] < 0 || expert[a] != e) continue;
      ++n;
      end = end > slot[a] + 1 ? end : slot[a] + 1;
    }
    kept[i] = n;
    span[i] = end;
  }
  void host(std::size_t cells) const {
    std::fill(kept, kept + cells, std::int64_t{0});
    std::fill(span, span + cells, std::int64_t{0});
    for (std::size_t a = 0; a < cells / experts * per_group; ++a) {
      if (slot[a] < 0) continue;
      const std::size_t i = a / per_group * experts + static_cast<std::size_t>(expert[a]);
      ++kept[i];
      span[i] = std::max<std::int64_t>(span[i], slot[a] + 1);
    }
  }
};

// Where the rows of choices live.
struct choice_rows {
  const std::int32_t* expert;
  const std::int32_t* slot;
  const std::int64_t* base;  // [G_l][E]
  std::size_t experts, per_group, k;
  ZEST_HOST_DEVICE std::size_t row(std::size_t a) const {
    return static_cast<std::size_t>(
        base[a / per_group * experts + static_cast<std::size_t>(expert[a])] + slot[a]);
  }
};

// Element (a, j): rows[row(a), j] = scale(a) * x[t(a), j] for a kept choice a (scale =
// weight[a], or 1 without weight). Every row has one choice: dispatch's forward, and the
// gradient of combine's rows.
template <class T>
struct scatter_choices {
  const T* x;       // [n][width]
  const T* weight;  // [n][k], or null
  choice_rows at;
  T* rows;  // [R][width]
  std::size_t width;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t a = i / width, j = i % width;
    if (at.slot[a] < 0) return;
    const T v = x[(a / at.k) * width + j];
    rows[at.row(a) * width + j] = weight != nullptr ? weight[a] * v : v;
  }
  void host(std::size_t n) const {
    if (width == 0) return;
    using autodiff::kernels::host_loops::as_array;
    for (std::size_t a = 0; a < n / width; ++a) {
      if (at.slot[a] < 0) continue;
      const auto in = as_array(x + (a / at.k) * width, width);
      auto out = as_array(rows + at.row(a) * width, width);
      if (weight != nullptr) {
        out = weight[a] * in;
      } else {
        out = in;
      }
    }
  }
};

// Element (t, j): x[t, j] = the sum over token t's kept choices, in choice order, of
// scale * rows[row(a), j]: combine's forward (scale = weight), dispatch's gradient (1).
template <class T>
struct gather_choices {
  const T* rows;    // [R][width]
  const T* weight;  // [n][k], or null
  choice_rows at;
  T* x;  // [n][width]
  std::size_t width;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t t = i / width, j = i % width;
    T sum{};
    for (std::size_t a = t * at.k; a < (t + 1) * at.k; ++a) {
      if (at.slot[a] < 0) continue;
      const T v = rows[at.row(a) * width + j];
      sum += weight != nullptr ? weight[a] * v : v;
    }
    x[i] = sum;
  }
  void host(std::size_t n) const {
    if (width == 0) return;
    using autodiff::kernels::host_loops::as_array;
    for (std::size_t t = 0; t < n / width; ++t) {
      auto out = as_array(x + t * width, width);
      out.setZero();
      for (std::size_t a = t * at.k; a < (t + 1) * at.k; ++a) {
        if (at.slot[a] < 0) continue;
        const auto in = as_array(rows + at.row(a) * width, width);
        if (weight != nullptr) {
          out += weight[a] * in;
        } else {
          out += in;
        }
      }
    }
  }
};

// Choice a: dz[t(a)] . rows[row(a)], 0 when dropped (combine's gradient of the weight).
template <class T>
struct choice_dot {
  const T* dz;
  const T* rows;
  choice_rows at;
  T* dw;
  std::size_t width;
  ZEST_HOST_DEVICE void operator()(std::size_t a) const {
    if (at.slot[a] < 0) {
      dw[a] = T(0);
      return;
    }
    const T* p = dz + (a / at.k) * width;
    const T* q = rows + at.row(a) * width;
    T sum{};
    for (std::size_t j = 0; j < width; ++j) sum += p[j] * q[j];
    dw[a] = sum;
  }
};

// Rows moved by a permutation: gather dst[r] = src[map[r]], or scatter dst[map[r]] = src[r].
template <class T>
struct move_rows {
  const T* src;
  const std::int64_t* map;
  T* dst;
  std::size_t width;
  bool scatter;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t r = i / width, j = i % width, m = static_cast<std::size_t>(map[r]);
    if (scatter) {
      dst[m * width + j] = src[r * width + j];
    } else {
      dst[r * width + j] = src[m * width + j];
    }
  }
  void host(std::size_t n) const {
    if (width == 0) return;
    for (std::size_t r = 0; r < n / width; ++r) {
      const auto m = static_cast<std::size_t>(map[r]);
      const T* from = src + (scatter ? r : m) * width;
      std::copy_n(from, width, dst + (scatter ? m : r) * width);
    }
  }
};

// rows[i] += bias[i % width]: an expert's bias on each of its rows.
template <class T>
struct add_bias {
  T* rows;
  const T* bias;
  std::size_t width;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const { rows[i] += bias[i % width]; }
  void host(std::size_t n) const {
    if (width == 0) return;
    using autodiff::kernels::host_loops::as_array;
    const auto b = as_array(bias, width);
    for (std::size_t r = 0; r < n / width; ++r) as_array(rows + r * width, width) += b;
  }
};

// The experts' first layer after its GEMM: h[i] += bias[i % width] (no bias: null), then
// a[i] = GELU(h[i]); h is kept for the backward. The host runs it a row at a time, so that
// the row is still in cache for the GELU.
template <class T>
struct bias_gelu {
  T* h;
  const T* bias;
  T* a;
  std::size_t width;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    if (bias != nullptr) h[i] += bias[i % width];
    a[i] = autodiff::kernels::gelu_fn{}.value(h[i]);
  }
  void host(std::size_t n) const {
    if (width == 0) return;
    using autodiff::kernels::host_loops::as_array;
    for (std::size_t r = 0; r < n / width; ++r) {
      T* row = h + r * width;
      if (bias != nullptr) as_array(row, width) += as_array(bias, width);
      autodiff::kernels::gelu_fn{}.host_value(row, a + r * width, width);
    }
  }
};

// Column j: out[j] = the sum of rows[r, j] over r in order (a bias's gradient).
template <class T>
struct column_sums {
  const T* rows;
  T* out;
  std::size_t count, width;
  ZEST_HOST_DEVICE void operator()(std::size_t j) const {
    T sum{};
    for (std::size_t r = 0; r < count; ++r) sum += rows[r * width + j];
    out[j] = sum;
  }
  void host(std::size_t n) const {
    using autodiff::kernels::host_loops::as_array;
    auto o = as_array(out, n);
    o.setZero();
    for (std::size_t r = 0; r < count; ++r) o += as_array(rows + r * width, n);
  }
};

}  // namespace detail

}  // namespace zest::moe
