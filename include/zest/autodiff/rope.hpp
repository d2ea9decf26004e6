// zest/autodiff/rope.hpp — rotary position embeddings (RoPE) on the tape.
//
//   auto qr = autodiff::rope<'t', 'd'>(q);                        // q "bkgtd" or "btnd"
//   auto kr = autodiff::rope<'s', 'd'>(k, {.base = 5e5, .offset = 128});   // a KV cache's keys
//
// The convention of Llama and Hugging Face ("rotate_half"): along Dim of even extent D, pair
// i < D/2 is (x[i], x[i + D/2]); it turns by the angle (pos + offset) * base^(-2i/D), pos the
// element's global index along Pos:
//
//   y[i]       = x[i] cos - x[i + D/2] sin
//   y[i + D/2] = x[i + D/2] cos + x[i] sin
//
// D = 4, pos = 1, base = 10000: pair 0 turns by 1 rad, pair 1 by 0.01 rad.
//
// Defined once (zest/autodiff/op.hpp): the layout rule, the checks and the backward step
// here, the loops as two function objects of namespace kernels below, which every backend
// runs: one fills a table of cos and sin for this rank's positions (local extent along Pos x
// D/2 entries, the angles in double), the other rotates every element from it.
//
// Layouts. The result has x's layout. The rotation is linear in x, so a partial x is accepted
// and the result stays pending (each summand is rotated). Pos may be split, evenly or not:
// the angle uses the global position (the shard's offset along Pos). Dim must be whole for a
// pair to be on one rank (x[i] and x[i + D/2] lie in different halves): where Dim is split,
// x is first brought to its layout with Dim whole (an all-gather of Dim over the axes that
// split it), rotated, and each rank keeps its block of the result (a local pick). To avoid
// the gather keep the head dim whole: split heads or batch instead.
//
// Backward: the inverse rotation (the angle negated) of the gradient, gathered along Dim
// the same way where Dim is split.
//
// Checks: compile time, Pos and Dim two distinct dims of x, float or double elements; run
// time (zest::shape_error naming rope, the dim and the extent), an odd extent of Dim, a base
// that is not positive and finite.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "zest/autodiff/diagnostics.hpp"
#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/op.hpp"
#include "zest/autodiff/shape_ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/autodiff/walks.hpp"
#include "zest/backend/backend.hpp"
#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

struct rope_options {
  double base = 10000.0;   // pair i turns by (pos + offset) * base^(-2i/D) at position pos
  std::size_t offset = 0;  // added to every position (a cache's first position)
};

namespace kernels {

// cos and sin in double, as device code calls them.
ZEST_HOST_DEVICE inline double rope_cos(double a) {
#if ZEST_DEVICE_PASS
  return ::cos(a);
#else
  return std::cos(a);
#endif
}
ZEST_HOST_DEVICE inline double rope_sin(double a) {
#if ZEST_DEVICE_PASS
  return ::sin(a);
#else
  return std::sin(a);
#endif
}

// The table for `positions` consecutive positions starting at `first` (global index plus the
// offset) and pairs i < half: entry p * half + i holds cos and sin of
// (first + p) * exp(-(2i / dim) * log(base)). One call per entry.
template <class T>
struct rope_angles {
  T* cosines;
  T* sines;
  std::size_t half, dim, first;
  double log_base;
  ZEST_HOST_DEVICE void operator()(std::size_t k) const {
    const std::size_t p = k / half, i = k % half;
    const double frequency =
        dmath::exp(-(2.0 * static_cast<double>(i) / static_cast<double>(dim)) * log_base);
    const double angle = static_cast<double>(first + p) * frequency;
    cosines[k] = static_cast<T>(rope_cos(angle));
    sines[k] = static_cast<T>(rope_sin(angle));
  }
};

// y = the rotation of x by the table's angles (sign = 1) or its inverse (sign = -1): one call
// per element of a local shard whose Dim is whole (extent n, elements `inner` apart); the
// element's position along Pos is (e / pos_stride) % pos_extent locally.
template <class T>
struct rope_rotate {
  const T* x;
  T* y;
  const T* cosines;
  const T* sines;
  std::size_t n, inner, pos_stride, pos_extent;
  T sign;
  ZEST_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t half = n / 2;
    const std::size_t j = (e / inner) % n;
    const std::size_t p = (e / pos_stride) % pos_extent;
    const bool first_half = j < half;
    const std::size_t k = p * half + (first_half ? j : j - half);
    const T c = cosines[k], s = sign * sines[k];
    y[e] = first_half ? x[e] * c - x[e + half * inner] * s : x[e] * c + x[e - half * inner] * s;
  }
};

}  // namespace kernels

namespace autodiff_error {
template <char Pos, char Dim, class Tensor>
struct rope_dims {
  static_assert(always_false<Tensor>,
                "zest autodiff rope<Pos, Dim>: Pos (the position dim) and Dim (the rotated head "
                "dim) must be two different dims of x (dims and tensor shown above). Fix: e.g. "
                "rope<'t', 'd'>(q) for q \"btnd\".");
};
}  // namespace autodiff_error

namespace detail {

template <char Pos, char Dim, class X>
constexpr bool check_rope() {
  if constexpr (!check_real_operand<"rope", X>()) {
    return false;
  } else if constexpr (!X::dims.contains(Pos)) {
    (void)autodiff_error::missing_dim<"rope", Pos, X>{};
    return false;
  } else if constexpr (!X::dims.contains(Dim)) {
    (void)autodiff_error::missing_dim<"rope", Dim, X>{};
    return false;
  } else if constexpr (Pos == Dim) {
    (void)autodiff_error::rope_dims<Pos, Dim, X>{};
    return false;
  } else {
    return true;
  }
}

template <char Pos, char Dim, sharded_tensor X>
void check_rope_extents(const X& x, const rope_options& o) {
  const std::size_t n = x.extent(Dim);
  if (n % 2 != 0) {
    throw shape_error(
        zest::detail::message("zest: rope<'", Pos, "', '", Dim, "'>: dim '", Dim, "' of \"",
                              view_of<X::dims>, "\" has extent ", n,
                              ", odd: rope pairs element i with element i + extent / 2, so the "
                              "rotated dim needs an even extent"));
  }
  if (!(o.base > 0) || !std::isfinite(o.base)) {
    throw shape_error(zest::detail::message("zest: rope<'", Pos, "', '", Dim, "'>: base ", o.base,
                                            " is not a positive finite number"));
  }
}

// The rotation (or, inverse, its inverse) of z, whose Dim is whole on every rank.
template <char Pos, char Dim, sharded_tensor Z>
Z rope_rotated(const Z& z, const rope_options& o, bool inverse) {
  using T = typename Z::value_type;
  using B = typename Z::backend_type;
  constexpr std::size_t d = Z::dim_index(Dim), p = Z::dim_index(Pos);
  const auto& local = z.local_extents();
  const std::size_t n = local[d], half = n / 2, positions = local[p];
  typename B::template buffer<T> cosines(positions * half), sines(positions * half);
  for_each_kernel<B>(positions * half,
                     kernels::rope_angles<T>{cosines.data(), sines.data(), half, n,
                                             z.local_offsets()[p] + o.offset, std::log(o.base)});
  std::size_t pos_stride = 1;
  for (std::size_t k = p + 1; k < Z::rank; ++k) pos_stride *= local[k];
  Z y(z.mesh(), z.extents(), Z::uninitialized);
  const shard_rows rows = rows_around(local, d);
  for_each_kernel<B>(y.local_count(), kernels::rope_rotate<T>{
                                          z.local().data(), y.local().data(), cosines.data(),
                                          sines.data(), n, rows.inner, pos_stride,
                                          positions == 0 ? 1 : positions, inverse ? T(-1) : T(1)});
  return y;
}

}  // namespace detail

// x with every pair along Dim turned by its position's angle along Pos (see the top); x's
// layout, partial included; Dim gathered first where it is split.
template <char Pos, char Dim, sharded_tensor X>
auto rope(const variable<X>& x, rope_options o = {}) {
  if constexpr (!detail::check_rope<Pos, Dim, X>()) {
    return 0;
  } else {
    using W = zest::detail::along_whole<X, Dim>;
    detail::check_rope_extents<Pos, Dim>(x.value(), o);
    auto y = redistribute_to<X::layout>(detail::rope_rotated<Pos, Dim>(
        zest::at_layout<W::layout>(x.value()), o, /*inverse=*/false));
    return custom<"rope">(
        std::move(y),
        [o](const auto& dy, const auto&, const X&) {
          return detail::rope_rotated<Pos, Dim>(zest::at_layout<W::grad_layout>(dy), o,
                                                /*inverse=*/true);
        },
        x);
  }
}

}  // namespace zest::autodiff
