// zest/autodiff/op.hpp — how an operation of the tape is defined: zest's own and a user's.
//
//   struct silu_fn {                                     // an element-wise op: value, derivative
//     template <class T> ZEST_HOST_DEVICE T value(T x) const { return x / (T(1) + dmath::exp(-x)); }
//     template <class T> ZEST_HOST_DEVICE T derivative(T x, T y) const { ... }  // dy/dx, y = value(x)
//   };
//   auto y = autodiff::unary<"silu">(x, silu_fn{});
//   auto z = autodiff::unary<"cube">(x, [] ZEST_HOST_DEVICE (auto v) { return v * v * v; },
//                                       [] ZEST_HOST_DEVICE (auto v, auto) { return 3 * v * v; });
//   auto m = autodiff::binary<"max">(x, y, max_fn{});    // value(a, b), derivative_first/second
//   auto p = autodiff::rowwise<'v', "softmax">(x, softmax_fn{});   // forward/backward on rows
//   auto q = autodiff::custom<"twice">(zest::scale(x.value(), 2.f),           // any value ...
//       [](const auto& dq, const auto& q, const auto& x) { return ...; }, x);  // ... its backward
//
// One definition per operation. An operation's layout rule, its checks and the step it records
// on the tape are written once, here; its kernel is a function object (zest/autodiff/kernels.hpp)
// that every backend runs: a CUDA kernel on the GPU, a plain loop on the emulated backend and on
// the host. A kernel or an op's function object may add a host-vectorised member (Eigen arrays
// over contiguous host memory) that the host backend calls instead, for speed only.
//
// Function objects run on the device: their members are ZEST_HOST_DEVICE, they are trivially
// copyable (capture by value), use zest::dmath for math, and neither throw nor allocate.
//
// Layout rules.
//   unary, binary      the result has the first operand's layout; the second is brought to
//                      it (a redistribute, whose backward brings its gradient back). A partial
//                      operand does not compile ("reduce first"): f(a + b) is not f(a) + f(b).
//                      A unary op whose function object says `static constexpr bool linear =
//                      true` (f(a + b) = f(a) + f(b)) accepts partial inputs and keeps them
//                      pending.
//   rowwise<D>         D must be a dim of x and whole on every rank: along a split dim no rank
//                      holds a row, and the op does not compile (redistribute to a layout that
//                      keeps D whole first). x may not be partial. The result has x's layout.
//   custom             the value is whatever the forward computed (any type, any layout); each
//                      gradient that the backward returns may have any layout of its input's
//                      dims: it is redistributed to the input's gradient layout (the dual of
//                      its layout, zest/autodiff/dual.hpp).
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "zest/autodiff/diagnostics.hpp"
#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/kernels.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/autodiff/walks.hpp"
#include "zest/backend/backend.hpp"
#include "zest/config.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

namespace autodiff_error {
template <fixed_string Operation, std::size_t Input, class Gradient, class Tensor>
struct custom_gradient {
  static_assert(always_false<Tensor>,
                "zest autodiff custom: the backward returned a gradient (input index, gradient "
                "and input types shown above) whose dims, element type or mesh are not the "
                "input's. Fix: return, for each input, a tensor with the input's dims, element "
                "type and mesh (any layout), in a std::tuple when there are several inputs.");
};
template <fixed_string Operation, class Fn>
struct not_a_unary_fn {
  static_assert(always_false<Fn>,
                "zest autodiff unary: the function object (operation and type shown above) "
                "needs value(x) and derivative(x, y) members, ZEST_HOST_DEVICE. Fix: add them, "
                "or pass the value and the derivative as two callables: unary<\"name\">(x, "
                "value, derivative).");
};
}  // namespace autodiff_error

namespace detail {

template <class Fn>
constexpr bool is_linear() {
  if constexpr (requires { Fn::linear; }) {
    return static_cast<bool>(Fn::linear);
  } else {
    return false;
  }
}

// unary's two-callable form: value(x) and derivative(x, y) as members.
template <class Value, class Derivative>
struct unary_pair {
  Value value_fn;
  Derivative derivative_fn;
  template <class T>
  ZEST_HOST_DEVICE auto value(T x) const {
    return value_fn(x);
  }
  template <class T>
  ZEST_HOST_DEVICE auto derivative(T x, T y) const {
    return derivative_fn(x, y);
  }
};

template <class Fn, class T>
constexpr bool is_unary_fn = requires(const Fn& f, T v) {
  f.value(v);
  f.derivative(v, v);
};

// An operand of an element-wise op: real elements, and not partial unless the op is linear.
template <fixed_string Op, class X, bool Linear>
constexpr bool check_elementwise_operand() {
  if constexpr (!check_real_operand<Op, X>()) {
    return false;
  } else if constexpr (!Linear && X::layout.any_partial()) {
    (void)autodiff_error::partial_operand<Op, X>{};
    return false;
  } else {
    return true;
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Element-wise.

// y = fn.value(x) element by element, dx = dz * fn.derivative(x, y). Fn may add
// host_value(x, y, n) and host_backward(x, y, dz, dx, n) over n contiguous host elements.
template <fixed_string Name, sharded_tensor X, class Fn>
auto unary(const variable<X>& x, Fn fn) {
  using T = typename X::value_type;
  if constexpr (!detail::check_elementwise_operand<Name, X, detail::is_linear<Fn>()>()) {
    return 0;
  } else if constexpr (!detail::is_unary_fn<Fn, T>) {
    (void)autodiff_error::not_a_unary_fn<Name, Fn>{};
    return 0;
  } else {
    using B = typename X::backend_type;
    const X& xv = x.value();
    X y(xv.mesh(), xv.extents(), X::uninitialized);
    for_each_kernel<B>(y.local_count(),
                       kernels::unary_forward<T, Fn>{xv.local().data(), y.local().data(), fn});
    auto out = detail::make_result(x.owner(), std::move(y), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), fn] {
        if (!on->grad) return;
        dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
        for_each_kernel<B>(dx.local_count(),
                           kernels::unary_backward<T, Fn>{std::as_const(xn->value).local().data(),
                                                          std::as_const(on->value).local().data(),
                                                          std::as_const(*on->grad).local().data(),
                                                          dx.local().data(), fn});
        xn->accumulate(std::move(dx));
      });
    }
    return out;
  }
}
// The same with the value and its derivative as two callables: value(x), derivative(x, y).
template <fixed_string Name, sharded_tensor X, class Value, class Derivative>
auto unary(const variable<X>& x, Value value, Derivative derivative) {
  return unary<Name>(x, detail::unary_pair<Value, Derivative>{value, derivative});
}

// z = fn.value(a, b) element by element, a and b of the same dims, element type and mesh, not
// partial; da = dz * fn.derivative_first(a, b, z), db = dz * fn.derivative_second(a, b, z).
// z has a's layout; b is used in it.
template <fixed_string Name, sharded_tensor X, sharded_tensor Y, class Fn>
auto binary(const variable<X>& a, const variable<Y>& b, Fn fn) {
  if constexpr (!detail::check_elementwise<X, Y>()) {
    return 0;
  } else if constexpr (!detail::check_elementwise_operand<Name, X, false>() ||
                       !detail::check_elementwise_operand<Name, Y, false>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using B = typename X::backend_type;
    constexpr bool moved = Y::layout != X::layout;
    const X& av = a.value();
    detail::check_same_extents(view_of<Name>, av, b.value());
    decltype(auto) bu = zest::at_layout<X::layout>(b.value());
    X z(av.mesh(), av.extents(), X::uninitialized);
    for_each_kernel<B>(
        z.local_count(),
        kernels::binary_forward<T, Fn>{av.local().data(), bu.local().data(), z.local().data(), fn});
    auto out = detail::make_result(a.owner(), std::move(z), a.requires_grad() || b.requires_grad());
    if (!out.requires_grad()) return out;
    auto b_used = detail::keep_if<moved>(std::move(bu));
    a.owner().record(
        [an = a.node(), bn = b.node(), on = out.node(), fn, b_used = std::move(b_used)] {
          if (!on->grad) return;
          const T* pb = [&] {
            if constexpr (moved) {
              return b_used.local().data();
            } else {
              (void)b_used;
              return std::as_const(bn->value).local().data();
            }
          }();
          const T* pa = std::as_const(an->value).local().data();
          const T* pz = std::as_const(on->value).local().data();
          const T* dz = std::as_const(*on->grad).local().data();
          if (an->requires_grad) {
            dual_tensor<X> da(an->value.mesh(), an->value.extents(), dual_tensor<X>::uninitialized);
            for_each_kernel<B>(da.local_count(), kernels::binary_backward<T, Fn, false>{
                                                     pa, pb, pz, dz, da.local().data(), fn});
            an->accumulate(std::move(da));
          }
          if (bn->requires_grad) {
            dual_tensor<X> db(an->value.mesh(), an->value.extents(), dual_tensor<X>::uninitialized);
            for_each_kernel<B>(db.local_count(), kernels::binary_backward<T, Fn, true>{
                                                     pa, pb, pz, dz, db.local().data(), fn});
            bn->accumulate(redistribute_to<dual(Y::layout)>(std::move(db)));
          }
        });
    return out;
  }
}

// ---------------------------------------------------------------------------------------
// Along one dim.
//
// Fn has forward(row<const T> x, row<T> y) and backward(row<const T> x, row<const T> y,
// row<const T> dy, row<T> dx), ZEST_HOST_DEVICE, called once per row (a row is x's elements
// along D with the other indices fixed; row[j] is its j-th element). Fn may add
// host_forward(x, y, n) and host_backward(x, y, dy, dx, n) over rows of n contiguous host
// elements (rows along the last dim), which the host backend calls instead.

namespace kernels {
// Fn::forward on each row; entries outside a causal window (when masked) get Fn's
// masked_value<T>() and take no part.
template <class T, class Fn>
struct row_forward {
  const T* x;
  T* y;
  shard_rows walk;
  causal_window window;
  Fn fn;
  static ZEST_HOST_DEVICE T masked() {
    if constexpr (requires { Fn::template masked_value<T>(); }) {
      return Fn::template masked_value<T>();
    } else {
      return T(0);
    }
  }
  ZEST_HOST_DEVICE void operator()(std::size_t r) const {
    const std::size_t f = walk.first(r), s = walk.inner;
    std::size_t lo = 0, hi = walk.n;
    window.kept(r, lo, hi);
    for (std::size_t j = 0; j < lo; ++j) y[f + j * s] = masked();
    for (std::size_t j = hi; j < walk.n; ++j) y[f + j * s] = masked();
    if (lo >= hi) return;
    fn.forward(row<const T>{x + f + lo * s, hi - lo, s}, row<T>{y + f + lo * s, hi - lo, s});
  }
  void host(std::size_t rows) const {
    if constexpr (requires(const T* a, T* b) { fn.host_forward(a, b, walk.n); }) {
      if (walk.inner == 1) {
        const std::size_t n = walk.n;
        for (std::size_t r = 0; r < rows; ++r) {
          T* yr = y + r * n;
          std::size_t lo = 0, hi = n;
          window.kept(r, lo, hi);
          std::fill(yr, yr + lo, masked());
          std::fill(yr + hi, yr + n, masked());
          if (lo < hi) fn.host_forward(x + r * n + lo, yr + lo, hi - lo);
        }
        return;
      }
    }
    for (std::size_t r = 0; r < rows; ++r) (*this)(r);
  }
};
template <class T, class Fn>
struct row_backward {
  const T* x;
  const T* y;
  const T* dy;
  T* dx;
  shard_rows walk;
  Fn fn;
  ZEST_HOST_DEVICE void operator()(std::size_t r) const {
    const std::size_t f = walk.first(r), s = walk.inner, n = walk.n;
    fn.backward(row<const T>{x + f, n, s}, row<const T>{y + f, n, s}, row<const T>{dy + f, n, s},
                row<T>{dx + f, n, s});
  }
  void host(std::size_t rows) const {
    if constexpr (requires(const T* a, T* b) { fn.host_backward(a, a, a, b, walk.n); }) {
      if (walk.inner == 1) {
        const std::size_t n = walk.n;
        if (n == 0) return;
        for (std::size_t r = 0; r < rows; ++r)
          fn.host_backward(x + r * n, y + r * n, dy + r * n, dx + r * n, n);
        return;
      }
    }
    for (std::size_t r = 0; r < rows; ++r) (*this)(r);
  }
};
}  // namespace kernels

namespace detail {
// A row op with an optional causal window (Q != 0: rows along D of a Q, K pair).
template <char D, char Q, char K, sharded_tensor X, class Fn>
variable<X> rows_op(const variable<X>& x, Fn fn) {
  using T = typename X::value_type;
  using B = typename X::backend_type;
  const X& xv = x.value();
  X y(xv.mesh(), xv.extents(), X::uninitialized);
  const shard_rows rows = rows_around(xv.local_extents(), X::dim_index(D));
  const shard_rows walk = rows;
  kernels::causal_window window;
  window.n = rows.n;
  if constexpr (Q != 0) window = causal_window_of<D, Q, K>(xv);
  for_each_kernel<B>(rows.count(), kernels::row_forward<T, Fn>{xv.local().data(), y.local().data(),
                                                               walk, window, fn});
  auto out = make_result(x.owner(), std::move(y), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), count = rows.count(), walk, fn] {
      if (!on->grad) return;
      dual_tensor<X> dx(on->value.mesh(), on->value.extents(), dual_tensor<X>::uninitialized);
      for_each_kernel<B>(count,
                         kernels::row_backward<T, Fn>{std::as_const(xn->value).local().data(),
                                                      std::as_const(on->value).local().data(),
                                                      std::as_const(*on->grad).local().data(),
                                                      dx.local().data(), walk, fn});
      xn->accumulate(std::move(dx));
    });
  }
  return out;
}
}  // namespace detail

// fn along dim D of x, row by row (see above); D whole on every rank, x not partial.
template <char D, fixed_string Name, sharded_tensor X, class Fn>
auto rowwise(const variable<X>& x, Fn fn) {
  if constexpr (!detail::check_operand<Name, X>()) {
    return 0;
  } else if constexpr (!detail::check_whole_dim<Name, D, X>()) {
    return 0;
  } else {
    return detail::rows_op<D, 0, 0>(x, fn);
  }
}

// ---------------------------------------------------------------------------------------
// A general op: the value as computed, and a backward closure.

namespace detail {
template <class R>
auto as_tuple(R&& r) {
  if constexpr (requires { std::tuple_size<std::remove_cvref_t<R>>::value; }) {
    return std::forward<R>(r);
  } else {
    return std::tuple<std::remove_cvref_t<R>>(std::forward<R>(r));
  }
}
template <fixed_string Name, std::size_t I, class G, class X>
constexpr bool check_custom_gradient() {
  using g_t = std::remove_cvref_t<G>;
  if constexpr (!sharded_tensor<g_t>) {
    (void)autodiff_error::custom_gradient<Name, I, g_t, X>{};
    return false;
  } else if constexpr (!same_kind<g_t, X>()) {
    (void)autodiff_error::custom_gradient<Name, I, g_t, X>{};
    return false;
  } else {
    return true;
  }
}
template <fixed_string Name, class Nodes, class Grads, std::size_t... I>
void accumulate_custom(const Nodes& nodes, Grads&& grads, std::index_sequence<I...>) {
  (
      [&] {
        auto& node = *std::get<I>(nodes);
        using x_t = std::remove_cvref_t<decltype(node.value)>;
        using g_t = std::remove_cvref_t<std::tuple_element_t<I, std::remove_cvref_t<Grads>>>;
        if constexpr (check_custom_gradient<Name, I, g_t, x_t>()) {
          if (node.requires_grad) {
            node.accumulate(redistribute_to<dual(x_t::layout)>(std::move(std::get<I>(grads))));
          }
        }
      }(),
      ...);
}
}  // namespace detail

// A variable of value `value` computed from `inputs` (at least one, all on one tape) by the
// caller; backward(dy, y, x...) gets the result's gradient dy (layout dual of y's), the
// result y and the inputs' values, and returns each input's gradient (a std::tuple when there
// are several inputs), each with its input's dims, element type and mesh, in any layout (it
// is redistributed to the input's gradient layout).
template <fixed_string Name, sharded_tensor Y, class Backward, sharded_tensor... X>
auto custom(Y&& value, Backward backward, const variable<X>&... inputs) {
  static_assert(sizeof...(X) > 0,
                "zest autodiff custom: name the inputs the value was computed from. Fix: "
                "custom<\"name\">(value, backward, x, ...).");
  using y_t = std::remove_cvref_t<Y>;
  tape& owner = std::get<0>(std::forward_as_tuple(inputs...)).owner();
  const bool grads = (inputs.requires_grad() || ...);
  auto out = detail::make_result(owner, y_t(std::forward<Y>(value)), grads);
  if (grads) {
    owner.record([nodes = std::make_tuple(inputs.node()...), on = out.node(),
                  backward = std::move(backward)] {
      if (!on->grad) return;
      auto g = std::apply(
          [&](const auto&... n) {
            return detail::as_tuple(backward(std::as_const(*on->grad), std::as_const(on->value),
                                             std::as_const(n->value)...));
          },
          nodes);
      static_assert(std::tuple_size_v<decltype(g)> == sizeof...(X),
                    "zest autodiff custom: the backward must return one gradient per input. "
                    "Fix: return a std::tuple of them, in the inputs' order.");
      detail::accumulate_custom<Name>(nodes, std::move(g), std::index_sequence_for<X...>{});
    });
  }
  return out;
}

}  // namespace zest::autodiff
