// zest/core/device_math.hpp — the few math functions that loop bodies of every backend use.
//
//   ZEST_HOST_DEVICE float f(float x) { return zest::dmath::exp(x) * zest::dmath::tanh(x); }
//
// std::exp and friends are host functions; a body that a CUDA kernel runs calls these
// instead: the device's expf/exp etc. in nvcc's device pass, <cmath> everywhere else. float
// and double only (the types the autodiff operations and optimizers compute in).
#pragma once

#include <cmath>
#include <type_traits>

#include "zest/config.hpp"

namespace zest::dmath {

#if ZEST_DEVICE_PASS
#define ZEST_DMATH_UNARY(name)                                           \
  template <class T>                                                     \
  ZEST_HOST_DEVICE inline T name(T x) {                                  \
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, \
                  "zest::dmath::" #name ": float or double");            \
    if constexpr (std::is_same_v<T, float>) return ::name##f(x);         \
    else return ::name(x);                                               \
  }
#else
#define ZEST_DMATH_UNARY(name)                                           \
  template <class T>                                                     \
  ZEST_HOST_DEVICE inline T name(T x) {                                  \
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, \
                  "zest::dmath::" #name ": float or double");            \
    return std::name(x);                                                 \
  }
#endif
ZEST_DMATH_UNARY(exp)
ZEST_DMATH_UNARY(log)
ZEST_DMATH_UNARY(tanh)
ZEST_DMATH_UNARY(sqrt)
ZEST_DMATH_UNARY(floor)
#undef ZEST_DMATH_UNARY

template <class T>
ZEST_HOST_DEVICE inline bool isfinite(T x) {
#if ZEST_DEVICE_PASS
  return ::isfinite(x);
#else
  return std::isfinite(x);
#endif
}
template <class T>
ZEST_HOST_DEVICE constexpr T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
ZEST_HOST_DEVICE constexpr T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
ZEST_HOST_DEVICE constexpr T infinity() {
  return static_cast<T>(__builtin_huge_valf());
}

}  // namespace zest::dmath
