// zest/autodiff/elementwise.hpp — element-wise functions of the tape, each an autodiff::unary
// or autodiff::binary op (zest/autodiff/op.hpp) given its value and derivative.
//
//   auto a = autodiff::silu(x);                  // also exp, log, tanh, sigmoid, relu, sqrt,
//   auto r = autodiff::rsqrt(autodiff::shift(v, 1e-6f));   // rsqrt, abs, pow(x, p), shift(x, c)
//   auto p = autodiff::pow(x, y);                // a tensor exponent (x > 0 for y's gradient)
//   auto m = autodiff::maximum(x, y);            // minimum; where(mask, x, y)
//
// exp, tanh, sigmoid and silu have host-vectorised members (Eigen's vectorised exp and tanh);
// the others run their call operators on every backend.
//
// Layouts: the result has the (first) operand's layout; partial operands do not compile
// ("reduce first"), except in where, which is linear in x and y.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "zest/autodiff/diagnostics.hpp"
#include "zest/autodiff/kernels.hpp"
#include "zest/autodiff/op.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/autodiff/walks.hpp"
#include "zest/backend/backend.hpp"
#include "zest/config.hpp"
#include "zest/core/device_math.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

namespace autodiff_error {
template <class Mask, class X>
struct mask_kind {
  static_assert(always_false<Mask>,
                "zest autodiff where: the mask needs the dims and mesh of x and y, arithmetic "
                "elements (nonzero selects x) and no partial axis (mask and x shown above). Fix: "
                "build the mask with x's dims, e.g. a tensor<std::uint8_t, Mesh, Dims>.");
};
}  // namespace autodiff_error

namespace fns {

// pow and abs as device code calls them (zest::dmath has neither).
template <class T>
ZEST_HOST_DEVICE inline T power(T x, T p) {
#if ZEST_DEVICE_PASS
  if constexpr (std::is_same_v<T, float>) {
    return ::powf(x, p);
  } else {
    return ::pow(x, p);
  }
#else
  return std::pow(x, p);
#endif
}

struct exp {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return dmath::exp(x);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T, T y) const {
    return y;
  }
  template <class T>
  void host_value(const T* x, T* y, std::size_t n) const {
    kernels::host_loops::as_array(y, n) = kernels::host_loops::as_array(x, n).exp();
  }
  template <class T>
  void host_backward(const T*, const T* y, const T* dz, T* dx, std::size_t n) const {
    using kernels::host_loops::as_array;
    as_array(dx, n) = as_array(dz, n) * as_array(y, n);
  }
};
struct log {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return dmath::log(x);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T x, T) const {
    return T(1) / x;
  }
};
struct tanh {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return dmath::tanh(x);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T, T y) const {
    return T(1) - y * y;
  }
  template <class T>
  void host_value(const T* x, T* y, std::size_t n) const {
    kernels::host_loops::as_array(y, n) = kernels::host_loops::as_array(x, n).tanh();
  }
  template <class T>
  void host_backward(const T*, const T* y, const T* dz, T* dx, std::size_t n) const {
    using kernels::host_loops::as_array;
    as_array(dx, n) = as_array(dz, n) * (T(1) - as_array(y, n).square());
  }
};
// 1 / (1 + exp(-x)), without overflow for large |x|.
struct sigmoid {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    if (x >= T(0)) return T(1) / (T(1) + dmath::exp(-x));
    const T e = dmath::exp(x);
    return e / (T(1) + e);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T, T y) const {
    return y * (T(1) - y);
  }
  // exp(-x) overflows to infinity for very negative x, and 1 / infinity is the right 0.
  template <class T>
  void host_value(const T* x, T* y, std::size_t n) const {
    using kernels::host_loops::as_array;
    as_array(y, n) = T(1) / (T(1) + (-as_array(x, n)).exp());
  }
  template <class T>
  void host_backward(const T*, const T* y, const T* dz, T* dx, std::size_t n) const {
    using kernels::host_loops::as_array;
    as_array(dx, n) = as_array(dz, n) * as_array(y, n) * (T(1) - as_array(y, n));
  }
};
// x sigmoid(x).
struct silu {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return x * sigmoid{}.value(x);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T x, T) const {
    const T s = sigmoid{}.value(x);
    return s * (T(1) + x * (T(1) - s));
  }
  template <class T>
  void host_value(const T* x, T* y, std::size_t n) const {
    using kernels::host_loops::as_array;
    const auto xs = as_array(x, n);
    as_array(y, n) = xs / (T(1) + (-xs).exp());
  }
  template <class T>
  void host_backward(const T* x, const T*, const T* dz, T* dx, std::size_t n) const {
    using kernels::host_loops::as_array;
    const auto xs = as_array(x, n);
    auto s = as_array(dx, n);
    s = T(1) / (T(1) + (-xs).exp());  // dx holds the sigmoid for the second pass
    s = as_array(dz, n) * s * (T(1) + xs * (T(1) - s));
  }
};
// max(x, 0); the derivative at 0 is 0.
struct relu {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return x > T(0) ? x : T(0);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T x, T) const {
    return x > T(0) ? T(1) : T(0);
  }
};
struct sqrt {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return dmath::sqrt(x);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T, T y) const {
    return T(0.5) / y;
  }
};
struct rsqrt {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return T(1) / dmath::sqrt(x);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T x, T y) const {
    return T(-0.5) * y / x;
  }
};
// |x|; the derivative at 0 is 0.
struct abs {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return x < T(0) ? -x : x;
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T x, T) const {
    return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
  }
};
// x^p for a fixed p.
template <class T>
struct pow {
  T p;
  ZEST_HOST_DEVICE T value(T x) const { return power(x, p); }
  ZEST_HOST_DEVICE T derivative(T x, T) const { return p == T(0) ? T(0) : p * power(x, p - T(1)); }
};
// x^y for a tensor y. dz/dx = y x^(y - 1) and dz/dy = z log x, z = x^y. The domain of both
// gradients is x > 0. At x = 0 (and y >= 0) z is 0 or 1 whatever y's nearby values, and both
// derivatives are taken as their limits from x > 0 where those are finite: dz/dy = 0, and
// dz/dx = 0 at y = 0 (not 0 * 0^-1). Elsewhere at x <= 0 the values are std::pow's (x < 0:
// NaN unless y is an integer; 0^y = infinity for y < 0) and dz/dy = z log x is NaN for
// x < 0: x^y has no real derivative in y there.
struct power_of {
  template <class T>
  ZEST_HOST_DEVICE T value(T x, T y) const {
    return power(x, y);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative_first(T x, T y, T) const {
    return y == T(0) ? T(0) : y * power(x, y - T(1));
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative_second(T x, T y, T z) const {
    return (x == T(0) && !(y < T(0))) ? T(0) : z * dmath::log(x);
  }
};
// x + c: affine, not linear (a pending sum would get c once per rank).
template <class T>
struct shift {
  T c;
  ZEST_HOST_DEVICE T value(T x) const { return x + c; }
  ZEST_HOST_DEVICE T derivative(T, T) const { return T(1); }
};
// max(a, b) and min(a, b); at a tie the gradient goes to a.
template <bool Max>
struct extremum {
  template <class T>
  ZEST_HOST_DEVICE T value(T a, T b) const {
    return first(a, b) ? a : b;
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative_first(T a, T b, T) const {
    return first(a, b) ? T(1) : T(0);
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative_second(T a, T b, T) const {
    return first(a, b) ? T(0) : T(1);
  }
  template <class T>
  static ZEST_HOST_DEVICE bool first(T a, T b) {
    return Max ? !(a < b) : !(b < a);
  }
};

}  // namespace fns

template <sharded_tensor X>
auto exp(const variable<X>& x) {
  return unary<"exp">(x, fns::exp{});
}
template <sharded_tensor X>
auto log(const variable<X>& x) {
  return unary<"log">(x, fns::log{});
}
template <sharded_tensor X>
auto tanh(const variable<X>& x) {
  return unary<"tanh">(x, fns::tanh{});
}
template <sharded_tensor X>
auto sigmoid(const variable<X>& x) {
  return unary<"sigmoid">(x, fns::sigmoid{});
}
template <sharded_tensor X>
auto silu(const variable<X>& x) {
  return unary<"silu">(x, fns::silu{});
}
template <sharded_tensor X>
auto relu(const variable<X>& x) {
  return unary<"relu">(x, fns::relu{});
}
template <sharded_tensor X>
auto sqrt(const variable<X>& x) {
  return unary<"sqrt">(x, fns::sqrt{});
}
template <sharded_tensor X>
auto rsqrt(const variable<X>& x) {
  return unary<"rsqrt">(x, fns::rsqrt{});
}
template <sharded_tensor X>
auto abs(const variable<X>& x) {
  return unary<"abs">(x, fns::abs{});
}
// x^p element-wise, p fixed.
template <sharded_tensor X>
auto pow(const variable<X>& x, typename X::value_type p) {
  return unary<"pow">(x, fns::pow<typename X::value_type>{p});
}
// x^y element-wise, x and y of the same dims (y used in x's layout), neither partial; see
// fns::power_of for the domain (x > 0 for y's gradient).
template <sharded_tensor X, sharded_tensor Y>
auto pow(const variable<X>& x, const variable<Y>& y) {
  return binary<"pow">(x, y, fns::power_of{});
}
// x + c element-wise.
template <sharded_tensor X>
auto shift(const variable<X>& x, typename X::value_type c) {
  return unary<"shift">(x, fns::shift<typename X::value_type>{c});
}
// max(x, y) and min(x, y) element-wise, x and y of the same dims (y used in x's layout).
template <sharded_tensor X, sharded_tensor Y>
auto maximum(const variable<X>& x, const variable<Y>& y) {
  return binary<"maximum">(x, y, fns::extremum<true>{});
}
template <sharded_tensor X, sharded_tensor Y>
auto minimum(const variable<X>& x, const variable<Y>& y) {
  return binary<"minimum">(x, y, fns::extremum<false>{});
}

// x where mask is nonzero, y elsewhere; mask a plain tensor with x's dims and mesh, any
// arithmetic element type. Linear in (x, y): they meet as in x + y (pending sums stay
// pending); the mask is used whole on the pending axes. The gradients pass where each was
// picked.
template <sharded_tensor M, sharded_tensor X, sharded_tensor Y>
auto where(const M& mask, const variable<X>& x, const variable<Y>& y) {
  if constexpr (!detail::check_elementwise<X, Y>()) {
    return 0;
  } else if constexpr (!detail::check_real_operand<"where", X>()) {
    return 0;
  } else if constexpr (M::dims != X::dims ||
                       !std::is_same_v<typename M::mesh_type, typename X::mesh_type> ||
                       !std::is_arithmetic_v<typename M::value_type> || M::layout.any_partial()) {
    (void)autodiff_error::mask_kind<M, X>{};
    return 0;
  } else {
    using T = typename X::value_type;
    using C = typename M::value_type;
    using B = typename X::backend_type;
    static constexpr layout_value meet = detail::meeting_layout(X::layout, Y::layout);
    static constexpr layout_value mask_at = detail::keep_own_partials(meet, M::layout);
    using z_t = typename zest::with_layout_for<X, meet>::type;
    using mask_t = typename zest::with_layout_for<M, mask_at>::type;
    detail::check_same_extents("where", x.value(), y.value(), "x", "y");
    detail::check_same_extents("where", x.value(), mask, "x", "mask");
    const auto& xu = at_layout<meet>(x.value());
    const auto& yu = at_layout<meet>(y.value());
    const mask_t& mu = at_layout<mask_at>(mask);
    z_t z(xu.mesh(), xu.extents(), z_t::uninitialized);
    for_each_kernel<B>(z.local_count(), kernels::select<T, C>{mu.local().data(), xu.local().data(),
                                                              yu.local().data(), z.local().data()});
    auto out = detail::make_result(x.owner(), std::move(z), x.requires_grad() || y.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), yn = y.node(), on = out.node(), mu = std::move(mu)] {
        if (!on->grad) return;
        const T* dz = std::as_const(*on->grad).local().data();
        const C* pc = mu.local().data();
        if (xn->requires_grad) {
          dual_tensor<z_t> dx(on->value.mesh(), on->value.extents(),
                              dual_tensor<z_t>::uninitialized);
          for_each_kernel<B>(dx.local_count(),
                             kernels::select<T, C>{pc, dz, nullptr, dx.local().data()});
          xn->accumulate(redistribute_to<dual(X::layout)>(std::move(dx)));
        }
        if (yn->requires_grad) {
          dual_tensor<z_t> dy(on->value.mesh(), on->value.extents(),
                              dual_tensor<z_t>::uninitialized);
          for_each_kernel<B>(dy.local_count(),
                             kernels::select<T, C>{pc, nullptr, dz, dy.local().data()});
          yn->accumulate(redistribute_to<dual(Y::layout)>(std::move(dy)));
        }
      });
    }
    return out;
  }
}

}  // namespace zest::autodiff
