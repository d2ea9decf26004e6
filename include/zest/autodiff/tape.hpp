// zest/autodiff/tape.hpp — reverse-mode autodiff over sharded tensors.
//
//   zest::autodiff::tape t;
//   auto x = t.constant(x_tensor);                 // split(b:dp)
//   auto w = t.parameter(w_tensor);                // split(m:dp), ZeRO-3 storage
//   auto y = einsum<"bsm,mh->bsh">(x, w);          // w all-gathered on use
//   auto loss = sum(y * t.constant(r));            // a scalar, partial(dp)
//   backward(loss);
//   w.grad();                                      // split(m:dp): one reduce-scatter
//
// Every variable's gradient has the dual layout of its value (zest/autodiff/dual.hpp). Each
// operation records one backward step on the tape; backward() runs them in reverse, so a
// variable's gradient is complete (summed over all its uses) before it flows further.
// Linear operations (einsum, redistribute, add, sub, scale, sum) accept partial operands;
// a product of two pending sums over one axis does not compile ("reduce first").
//
// Elementwise arithmetic runs the function objects of zest/autodiff/kernels.hpp on every
// backend (float or double elements off the host). zest/autodiff/op.hpp defines the other
// operations the same way, and is how a user adds one.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/einsum_grad.hpp"
#include "zest/autodiff/kernels.hpp"
#include "zest/backend/backend.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/source_site.hpp"
#include "zest/einsum/einsum.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

class tape;

namespace detail {

// Whether X's shards live on the host backend (no operation branches on it: only the element
// type check below reads it).
template <class X>
inline constexpr bool on_host = std::is_same_v<typename X::backend_type, host_backend>;

template <class T>
inline constexpr bool is_real = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <sharded_tensor X>
struct node {
  X value;
  bool requires_grad = false;
  std::optional<dual_tensor<X>> grad;

  // A variable used several times receives the sum of its uses' gradients.
  void accumulate(dual_tensor<X>&& g) {
    if (!grad) {
      grad.emplace(std::move(g));
      return;
    }
    add(g);
  }
  // The same from a gradient that stays with its owner: added in place, or copied when it is
  // the first.
  void accumulate(const dual_tensor<X>& g) {
    if (!grad) {
      grad.emplace(g);
      return;
    }
    add(g);
  }

 private:
  void add(const dual_tensor<X>& g) {
    auto out = grad->local();
    const auto in = g.local();
    using T = typename X::value_type;
    for_each_kernel<typename X::backend_type>(out.size(),
                                              kernels::add_into<T>{out.data(), in.data()});
  }
};

// An output's gradient, handed on unchanged to an input of a linear operation (the input's
// gradient is the output's, in the dual of the input's layout). When `last` (no other input
// of the step reads it after this one) and the step holds the only reference to the output's
// node (no variable names it any more: run_backward releases each step once it has run), the
// gradient is moved out of the node; otherwise it is added into the input's gradient in place
// or copied. Either way no pass over it is made that the sum does not need.
template <sharded_tensor In, sharded_tensor Out>
void pass_gradient(node<In>& to, const std::shared_ptr<node<Out>>& from, bool last) {
  constexpr layout_value in_grad = dual(In::layout);
  const bool take = last && from.use_count() == 1;
  if constexpr (std::is_same_v<dual_tensor<In>, dual_tensor<Out>>) {
    if (take && !to.grad) {
      to.accumulate(std::move(*from->grad));
      from->grad.reset();
    } else {
      to.accumulate(std::as_const(*from->grad));
    }
  } else if (take) {
    to.accumulate(redistribute_to<in_grad>(std::move(*from->grad)));
    from->grad.reset();
  } else {
    to.accumulate(redistribute_to<in_grad>(std::as_const(*from->grad)));
  }
}

}  // namespace detail

template <sharded_tensor X>
class variable;

// The record of a computation: one backward step per operation, in forward order.
class tape {
 public:
  tape() = default;
  tape(const tape&) = delete;
  tape& operator=(const tape&) = delete;

  // A leaf whose gradient backward() computes.
  template <sharded_tensor X>
  variable<std::remove_cvref_t<X>> parameter(X&& value);
  // A leaf without a gradient (data, fixed weights).
  template <sharded_tensor X>
  variable<std::remove_cvref_t<X>> constant(X&& value);

  void record(std::function<void()> step) {
    (regions_.empty() ? steps_ : regions_.back().steps).push_back(std::move(step));
  }
  std::size_t size() const { return steps_.size(); }

  // Runs the recorded steps in reverse, and forgets them: a seeded loss gradient must already
  // be in place. Each step is released as soon as it has run, and with it the operands it
  // kept (activations are freed as backward passes them) and its references to the nodes of
  // its inputs and output, so that an intermediate result's gradient, which no later step
  // reads and no variable names, can be handed on instead of copied (pass_gradient).
  void run_backward() {
    if (!regions_.empty()) {
      throw std::logic_error(
          "zest autodiff: backward() inside a checkpointed function (autodiff::checkpoint); "
          "run backward after the function returns");
    }
    run_and_release(steps_);
  }
  // Runs `steps` last to first, each released once it has run, and empties the list: the
  // tape's own steps, and a checkpointed region's in its recomputation.
  static void run_and_release(std::vector<std::function<void()>>& steps) {
    for (std::size_t i = steps.size(); i-- > 0;) {
      const std::function<void()> step = std::move(steps[i]);
      steps[i] = nullptr;
      step();
    }
    steps.clear();
  }
  // Forgets the recorded steps (variables keep their values and gradients).
  void clear() { steps_.clear(); }

  // A variable made while a region is open, that backward may reach: autodiff::checkpoint
  // checks that none but its output receives a gradient from outside the region.
  struct made_variable {
    std::weak_ptr<const void> node;
    bool (*has_gradient)(const void*);
  };
  // What a region recorded (zest/autodiff/checkpoint.hpp): its backward steps, in forward
  // order, and the variables made in it.
  struct region {
    std::vector<std::function<void()>> steps;
    std::vector<made_variable> made;
  };
  // While a region is open, record() appends to it instead of the tape; regions nest.
  void begin_region() { regions_.emplace_back(); }
  region end_region() {
    if (regions_.empty()) throw std::logic_error("zest autodiff: end_region without begin_region");
    region r = std::move(regions_.back());
    regions_.pop_back();
    return r;
  }
  // Open regions: nonzero inside a checkpointed function, in forward or in its recomputation.
  std::size_t region_depth() const { return regions_.size(); }
  void note_made(made_variable v) {
    if (!regions_.empty()) regions_.back().made.push_back(std::move(v));
  }

 private:
  std::vector<std::function<void()>> steps_;
  std::vector<region> regions_;
};

template <sharded_tensor X>
class variable {
  static_assert(std::is_same_v<X, std::remove_cvref_t<X>>,
                "zest autodiff: variable<X> takes a plain tensor type");

 public:
  using tensor_type = X;
  using gradient_type = dual_tensor<X>;

  variable(tape& owner, X value, bool requires_grad)
      : tape_(&owner),
        node_(std::make_shared<detail::node<X>>(
            detail::node<X>{std::move(value), requires_grad, {}})) {
    if (requires_grad && owner.region_depth() > 0) {
      owner.note_made({std::weak_ptr<const void>(node_), [](const void* n) {
                         return static_cast<const detail::node<X>*>(n)->grad.has_value();
                       }});
    }
  }

  const X& value() const { return node_->value; }
  bool requires_grad() const { return node_->requires_grad; }
  bool has_gradient() const { return node_->grad.has_value(); }
  // The gradient after backward(), in the dual layout of the value.
  const gradient_type& grad() const {
    if (!node_->grad) {
      throw std::logic_error(
          "zest autodiff: this variable has no gradient (not a parameter, not reached by "
          "backward(), "
          "or backward() not run)");
    }
    return *node_->grad;
  }
  void zero_grad() const { node_->grad.reset(); }
  tape& owner() const { return *tape_; }
  const std::shared_ptr<detail::node<X>>& node() const { return node_; }

 private:
  tape* tape_;
  std::shared_ptr<detail::node<X>> node_;
};

template <sharded_tensor X>
variable<std::remove_cvref_t<X>> tape::parameter(X&& value) {
  return variable<std::remove_cvref_t<X>>(*this, std::forward<X>(value), true);
}
template <sharded_tensor X>
variable<std::remove_cvref_t<X>> tape::constant(X&& value) {
  return variable<std::remove_cvref_t<X>>(*this, std::forward<X>(value), false);
}

// ---------------------------------------------------------------------------------------
// Diagnostics.

namespace autodiff_error {
using zest::detail::always_false;
// Instantiated with the operation's name and the offending tensor type (shown above the
// message).
template <fixed_string Operation, class Tensor>
struct partial_operand {
  static_assert(always_false<Tensor>,
                "zest autodiff: a nonlinear operation got a partial operand (operation and tensor "
                "shown above); f(a + b) is not f(a) + f(b). Fix: reduce first, e.g. "
                "redistribute<layout<...>>(x) to replicate or split on that axis.");
};
template <class X, class Y>
struct elementwise_mismatch {
  static_assert(
      always_false<X>,
      "zest autodiff: an elementwise operation needs operands with the same dims, element "
      "type and mesh (both shown above). Fix: einsum<\"...\"> to transpose or broadcast.");
};
}  // namespace autodiff_error

namespace detail {

// The layout in which two tensors meet elementwise: x's layout, with y's pending sums
// added (a linear op keeps them pending), and splits that lost their outer axis dropped.
constexpr layout_value meeting_layout(layout_value x, layout_value y) {
  layout_value v = x;
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (y.is_partial(a)) v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
  }
  for (std::size_t k = 1; k < max_axes; ++k) {
    for (std::size_t a = 0; a < v.axis_count; ++a) {
      if (v.is_split(a) && v.axes[a].order == k && v.split_axis(v.axes[a].dim, k - 1) == max_axes) {
        v.axes[a] = axis_placement{};
      }
    }
  }
  return v;
}

// `v` with the partial axes that `own` does not have replicated: the operand of a product
// that is not the pending sum on an axis must be whole there.
constexpr layout_value keep_own_partials(layout_value v, layout_value own) {
  layout_value out = v;
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (v.is_partial(a) && !own.is_partial(a)) out.axes[a] = axis_placement{};
  }
  return out;
}

constexpr bool share_partial_axis(layout_value x, layout_value y) {
  for (std::size_t a = 0; a < x.axis_count; ++a) {
    if (x.is_partial(a) && y.is_partial(a)) return true;
  }
  return false;
}

template <sharded_tensor X, sharded_tensor Y>
constexpr bool same_kind() {
  return X::dims == Y::dims && std::is_same_v<typename X::value_type, typename Y::value_type> &&
         std::is_same_v<typename X::mesh_type, typename Y::mesh_type>;
}

template <class X, class Y>
constexpr bool check_elementwise() {
  if constexpr (!same_kind<X, Y>()) {
    (void)autodiff_error::elementwise_mismatch<X, Y>{};
    return false;
  } else {
    static_assert(on_host<X> || is_real<typename X::value_type>,
                  "zest autodiff: elementwise operations off the host backend need float or "
                  "double elements. Fix: convert the tensors to float or double.");
    return true;
  }
}

// Element-wise operands of the same dims must have the same extents: their shards are read
// element for element (a {5, 3, 4} and a {5, 6, 4} tensor would read past the smaller one).
// `op` names the operation in the message; `a_name` and `b_name` the operands.
template <sharded_tensor A, sharded_tensor B>
void check_same_extents(std::string_view op, const A& a, const B& b, std::string_view a_name = "a",
                        std::string_view b_name = "b") {
  if (a.extents() == b.extents()) return;
  auto text = [](const auto& e) {
    std::string t = "[";
    for (std::size_t k = 0; k < e.size(); ++k) t += (k ? ", " : "") + std::to_string(e[k]);
    return t + "]";
  };
  throw shape_error(zest::detail::message(
      "zest: ", op, ": ", a_name, " \"", view_of<A::dims>, "\" has extents ", text(a.extents()),
      " and ", b_name, " \"", view_of<B::dims>, "\" ", text(b.extents()),
      "; an element-wise operation needs equal extents (broadcast_add and broadcast_multiply "
      "take an operand with fewer dims)"));
}

// out[i] = f(a[i], b[i]) over local shards of one shape; f is one of kernels.hpp's
// operations (plus, times, ...), which device code can call too.
template <sharded_tensor Out, sharded_tensor A, sharded_tensor B, class F>
Out combine(const A& a, const B& b, F f) {
  Out out(a.mesh(), a.extents(), Out::uninitialized);
  const auto pa = a.local();
  const auto pb = b.local();
  auto po = out.local();
  using T = typename Out::value_type;
  for_each_kernel<typename Out::backend_type>(
      po.size(), kernels::combine<T, F>{pa.data(), pb.data(), po.data(), f});
  return out;
}
template <sharded_tensor Out, sharded_tensor A, class F>
Out transform(const A& a, F f) {
  Out out(a.mesh(), a.extents(), Out::uninitialized);
  const auto pa = a.local();
  auto po = out.local();
  using T = typename Out::value_type;
  for_each_kernel<typename Out::backend_type>(po.size(),
                                              kernels::transform<T, F>{pa.data(), po.data(), f});
  return out;
}

// A scalar tensor whose local value on this rank is `value` (a partial summand on its
// pending axes).
template <sharded_tensor S>
S scalar_of(const typename S::mesh_type& mesh, typename S::value_type value) {
  using T = typename S::value_type;
  return S(mesh, {}, S::backend_type::template from_host<T>(std::span<const T>(&value, 1)));
}
// The local value of a scalar tensor, on the host.
template <sharded_tensor S>
typename S::value_type scalar_value(const S& s) {
  return s.local_to_host()[0];
}

template <sharded_tensor Y>
variable<Y> make_result(tape& t, Y&& value, bool requires_grad) {
  return variable<Y>(t, std::move(value), requires_grad);
}

// What a backward step keeps of an operand that the forward used through a copy: the copy
// (moved in) when Keep, else nothing (0), and the step reads the operand's own node.
template <bool Keep, class V>
auto keep_if([[maybe_unused]] V&& v) {
  if constexpr (Keep) {
    return std::remove_cvref_t<V>(std::forward<V>(v));
  } else {
    return 0;
  }
}

// The scalar dims.
inline constexpr fixed_string<1> no_dims{};

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Operations.

// einsum<Spec, Options...>(a, b) and einsum<Spec, Options...>(a): zest::einsum on the values
// (options: policy and forced output layout, as there); the gradients are the derived einsums.
template <fixed_string Spec, class O1 = void, class O2 = void, sharded_tensor A, sharded_tensor B>
auto einsum(const variable<A>& a, const variable<B>& b, source_site at = source_site::current()) {
  using policy = typename zest::detail::einsum_options<O1, O2>::policy;
  auto y = zest::detail::einsum_at<Spec, O1, O2>(at, a.value(), b.value());
  auto out = detail::make_result(a.owner(), std::move(y), a.requires_grad() || b.requires_grad());
  if (out.requires_grad()) {
    a.owner().record([an = a.node(), bn = b.node(), on = out.node()] {
      if (!on->grad) return;
      if (an->requires_grad)
        an->accumulate(einsum_operand_gradient<Spec, 0, policy>(*on->grad, an->value, bn->value));
      if (bn->requires_grad)
        bn->accumulate(einsum_operand_gradient<Spec, 1, policy>(*on->grad, an->value, bn->value));
    });
  }
  return out;
}

template <fixed_string Spec, class O1 = void, class O2 = void, sharded_tensor A>
auto einsum(const variable<A>& a, source_site at = source_site::current()) {
  using policy = typename zest::detail::einsum_options<O1, O2>::policy;
  auto out = detail::make_result(a.owner(), zest::detail::einsum_at<Spec, O1, O2>(at, a.value()),
                                 a.requires_grad());
  if (out.requires_grad()) {
    a.owner().record([an = a.node(), on = out.node()] {
      if (on->grad) an->accumulate(einsum_operand_gradient<Spec, 0, policy>(*on->grad, an->value));
    });
  }
  return out;
}

// redistribute<layout<...>>(x): its backward is the redistribute between the duals, the
// other way round (all-gather <-> reduce-scatter, all-reduce <-> local zero_partial).
// redistribute<L>(x) takes the layout as a value (a layout_key, as layers compute it).
// A variable that has the layout already is itself the result (no copy, no tape step).
template <layout_key L, sharded_tensor X>
auto redistribute(const variable<X>& x, source_site at = source_site::current()) {
  if constexpr (static_cast<layout_key>(X::layout) == L) {
    return x;
  } else {
    const user_call user(at);
    auto out =
        detail::make_result(x.owner(), zest::redistribute_to<L>(x.value()), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node()] {
        if (on->grad) detail::pass_gradient(*xn, on, true);
      });
    }
    return out;
  }
}
template <class Layout, sharded_tensor X>
auto redistribute(const variable<X>& x, source_site at = source_site::current()) {
  return redistribute<layout_key(layout_value_of<typename X::mesh_type, X::dims, Layout>)>(x, at);
}

namespace detail {
// x + sign * y, both brought to their meeting layout; linear, so pending sums stay pending.
template <int Sign, sharded_tensor X, sharded_tensor Y>
auto add_signed(const variable<X>& x, const variable<Y>& y) {
  if constexpr (!check_elementwise<X, Y>()) {
    return 0;
  } else {
    static constexpr layout_value meet = meeting_layout(X::layout, Y::layout);
    using z_t = typename zest::with_layout_for<X, meet>::type;
    using T = typename X::value_type;
    using op_t = std::conditional_t<(Sign > 0), kernels::plus<T>, kernels::minus<T>>;
    check_same_extents(Sign > 0 ? "x + y" : "x - y", x.value(), y.value(), "x", "y");
    auto z = combine<z_t>(at_layout<meet>(x.value()), at_layout<meet>(y.value()), op_t{});
    auto out = make_result(x.owner(), std::move(z), x.requires_grad() || y.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), yn = y.node(), on = out.node()] {
        if (!on->grad) return;
        if (xn->requires_grad) pass_gradient(*xn, on, !yn->requires_grad);
        if (yn->requires_grad) {
          if constexpr (Sign > 0) {
            pass_gradient(*yn, on, true);
          } else {
            auto negated = transform<dual_tensor<z_t>>(*on->grad, kernels::negate<T>{});
            yn->accumulate(redistribute_to<dual(Y::layout)>(std::move(negated)));
          }
        }
      });
    }
    return out;
  }
}
}  // namespace detail

template <sharded_tensor X, sharded_tensor Y>
auto add(const variable<X>& x, const variable<Y>& y) {
  return detail::add_signed<1>(x, y);
}
template <sharded_tensor X, sharded_tensor Y>
auto sub(const variable<X>& x, const variable<Y>& y) {
  return detail::add_signed<-1>(x, y);
}
template <sharded_tensor X, sharded_tensor Y>
auto operator+(const variable<X>& x, const variable<Y>& y) {
  return add(x, y);
}
template <sharded_tensor X, sharded_tensor Y>
auto operator-(const variable<X>& x, const variable<Y>& y) {
  return sub(x, y);
}

// c * x: linear, any layout.
template <sharded_tensor X>
variable<X> scale(const variable<X>& x, typename X::value_type c) {
  static_assert(detail::check_elementwise<X, X>());
  using T = typename X::value_type;
  auto out = detail::make_result(
      x.owner(), detail::transform<X>(x.value(), kernels::scale_by<T>{c}), x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node(), c] {
      if (on->grad)
        xn->accumulate(detail::transform<dual_tensor<X>>(*on->grad, kernels::scale_by<T>{c}));
    });
  }
  return out;
}

// x * y elementwise. Bilinear: one operand may be a pending sum on an axis (the other is
// made whole there), not both.
template <sharded_tensor X, sharded_tensor Y>
auto multiply(const variable<X>& x, const variable<Y>& y) {
  if constexpr (!detail::check_elementwise<X, Y>()) {
    return 0;
  } else if constexpr (detail::share_partial_axis(X::layout, Y::layout)) {
    (void)autodiff_error::partial_operand<"multiply", Y>{};
    return 0;
  } else {
    using T = typename X::value_type;
    detail::check_same_extents("x * y", x.value(), y.value(), "x", "y");
    static constexpr layout_value meet = detail::meeting_layout(X::layout, Y::layout);
    constexpr layout_value x_at = detail::keep_own_partials(meet, X::layout);
    constexpr layout_value y_at = detail::keep_own_partials(meet, Y::layout);
    static constexpr layout_value x_grad = dual(x_at);
    static constexpr layout_value y_grad = dual(y_at);
    using z_t = typename zest::with_layout_for<X, meet>::type;
    auto xu = zest::at_layout<x_at>(x.value());
    auto yu = zest::at_layout<y_at>(y.value());
    auto out = detail::make_result(x.owner(), detail::combine<z_t>(xu, yu, kernels::times<T>{}),
                                   x.requires_grad() || y.requires_grad());
    if (out.requires_grad()) {
      // dz is dual(meet); times the other operand as used it is dual of this one's as used.
      x.owner().record(
          [xn = x.node(), yn = y.node(), on = out.node(), xu = std::move(xu), yu = std::move(yu)] {
            if (!on->grad) return;
            const kernels::times<T> mul{};
            if (xn->requires_grad) {
              xn->accumulate(redistribute_to<dual(X::layout)>(
                  detail::combine<typename zest::with_layout_for<X, x_grad>::type>(*on->grad, yu,
                                                                                   mul)));
            }
            if (yn->requires_grad) {
              yn->accumulate(redistribute_to<dual(Y::layout)>(
                  detail::combine<typename zest::with_layout_for<Y, y_grad>::type>(*on->grad, xu,
                                                                                   mul)));
            }
          });
    }
    return out;
  }
}
template <sharded_tensor X, sharded_tensor Y>
auto operator*(const variable<X>& x, const variable<Y>& y) {
  return multiply(x, y);
}

// The sum of all elements, a scalar: partial on every axis that splits x or is partial in
// it, replicated on the others. Its gradient fills x's gradient with the scalar's gradient.
template <sharded_tensor X>
auto sum(const variable<X>& x) {
  static_assert(detail::check_elementwise<X, X>());
  using T = typename X::value_type;
  constexpr layout_value scalar_layout = [] {
    layout_value v = X::layout;
    for (std::size_t a = 0; a < v.axis_count; ++a) {
      if (!v.is_replicate(a)) v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
    }
    return v;
  }();
  using s_t = basic_tensor<T, typename X::mesh_type, detail::no_dims, scalar_layout>;
  // Accumulated in double on every backend.
  const auto p = x.value().local();
  const T total =
      static_cast<T>(sum_kernel<typename X::backend_type>(p.size(), kernels::element<T>{p.data()}));
  auto out = detail::make_result(x.owner(), detail::scalar_of<s_t>(x.value().mesh(), total),
                                 x.requires_grad());
  if (out.requires_grad()) {
    x.owner().record([xn = x.node(), on = out.node()] {
      if (!on->grad) return;
      const T seed = detail::scalar_value(*on->grad);
      dual_tensor<X> g(xn->value.mesh(), xn->value.extents(), dual_tensor<X>::uninitialized);
      X::backend_type::fill(g.local().data(), g.local_count(), seed);
      xn->accumulate(std::move(g));
    });
  }
  return out;
}

// Runs backward from a scalar: its gradient is 1 (on coordinate 0 of its partial axes...
// which are replicated in the dual), then every recorded step in reverse.
template <sharded_tensor L>
void backward(const variable<L>& loss, source_site at = source_site::current()) {
  static_assert(L::rank == 0,
                "zest autodiff backward: start from a scalar. Fix: sum(...) the loss first.");
  using g_t = dual_tensor<L>;
  if (!loss.requires_grad()) return;
  const user_call user(at);  // the gradients' collectives (and the hooks') name this line
  loss.node()->grad.emplace(g_t::generate(loss.value().mesh(), {},
                                          [](const auto&) { return typename L::value_type(1); }));
  loss.owner().run_backward();
}

}  // namespace zest::autodiff
