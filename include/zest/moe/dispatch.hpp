// zest/moe/dispatch.hpp — GShard's dispatch, experts and combine over sharded tensors.
//
// G groups of S tokens (model dim M) go to E experts of capacity C (zest/moe/gating.hpp
// decides where). Two paths with the same results, values and gradients:
//
//   einsum path (GShard's text, dense one-hot tensors, O(G·S·E·C·M)):
//     auto d = autodiff::einsum<"gsec,gsm->egcm">(t.constant(r.dispatch), x);
//     ...
//     auto z = autodiff::einsum<"gsec,egcm->gsm">(r.combine, y);
//
//   index path (gather and scatter-add, as Tutel and MegaBlocks do, O(G·S·k·M)):
//     auto d = moe::dispatch_by_index(x, r.expert_index, r.slot_index, E, C);
//     ...
//     auto z = moe::combine_by_index(y, r.weight, r.expert_index, r.slot_index);
//
// and between them, on either path, the experts on their own ranks:
//
//     auto de = moe::to_expert_layout<"ep">(d);   // all-to-all: g's "ep" split moves to e
//     auto h  = moe::expert_feed_forward(de, w_in, b_in, w_out, b_out);  // "egcm" -> "egcm"
//     auto y  = moe::to_token_layout<decltype(d)::tensor_type::layout>(h);  // all-to-all back
//
// Layouts. The tokens x "gsm" are split on g (e.g. split<'g', "dp", "ep">); S is whole. The
// dispatched "egcm" keeps x's split of g and holds every expert: each rank's block is its
// own groups' tokens, sorted by expert and slot. to_expert_layout moves the expert axis
// from g to e — split<'g', "dp">, split<'e', "ep"> — one all-to-all over the expert axis;
// the expert weights "emh", "ehm" are split<'e', "ep"> too, so the expert einsums need no
// communication (their gradients are partial over "dp" only, as ZeRO expects). The way back
// is the inverse all-to-all, and backward runs both again in the other direction.
//
//   all-to-all bytes per rank and layer (n ranks on the expert axis, even splits, B the
//   bytes of the local "egcm" block in the token layout, E·(G/(dp·n))·C·M elements):
//     forward  2 · (n-1)/n · B,  backward the same          (all_to_all_bytes() exactly)
//
// The capacity makes every shape static: a rank whose experts receive no token still sends
// and receives its (zero) blocks, so no collective depends on the routing.
//
// Backends: dispatch_by_index and combine_by_index are each one definition whose loops are
// function objects (zest/moe/detail/index_kernels.hpp) that every backend runs through
// zest::for_each_kernel: one call per output element, the same sums in the same order, no
// atomics (a slot row finds its tokens through per-slot lists built per group); the host
// runs their host members, a row at a time. The index check is one sum where the indices
// live; nothing else comes to the host.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/moe/detail/index_kernels.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::moe {

// ---------------------------------------------------------------------------------------
// Diagnostics: each is instantiated with what is at fault, shown above the message.

namespace dispatch_error {
using zest::detail::always_false;

template <fixed_string Operation, class Tensor, fixed_string Expected>
struct wrong_dims {
  static_assert(always_false<Tensor>,
                "zest moe: a tensor has other dims than the operation expects (operation, tensor "
                "and the expected dims shown above): tokens \"gsm\", routing \"gsk\", dispatched "
                "\"egcm\", expert weights \"emh\" and \"ehm\". Fix: zest::relabel<\"...\">(t).");
};
template <fixed_string Operation, class Tensor>
struct index_type {
  static_assert(always_false<Tensor>,
                "zest moe: expert and slot indices are int32_t tensors \"gsk\" (operation and "
                "tensor shown above). Fix: use the routing's expert_index and slot_index.");
};
template <fixed_string Operation, class Tensor>
struct split_tokens {
  static_assert(always_false<Tensor>,
                "zest moe: the operation needs every token of a group on one rank, but the "
                "tensor splits s (or k) over a mesh axis (operation and tensor shown above). "
                "Fix: split the group dim g instead, e.g. layout<split<'g', \"dp\", \"ep\">>.");
};
template <fixed_string Operation, class Tensor>
struct split_experts {
  static_assert(always_false<Tensor>,
                "zest moe: combine_by_index needs all experts and slots of its groups on one "
                "rank, but the tensor splits e or c (operation and tensor shown above). Fix: "
                "to_token_layout<...>(y) first, the all-to-all back from the experts.");
};
template <fixed_string ExpertAxis, class Mesh>
struct no_expert_axis {
  static_assert(always_false<Mesh>,
                "zest moe: the mesh has no axis of the expert axis' name (both shown above). "
                "Fix: name one of the mesh's axes, e.g. to_expert_layout<\"ep\">.");
};
template <fixed_string ExpertAxis, class Tensor>
struct expert_axis_busy {
  static_assert(always_false<Tensor>,
                "zest moe: to_expert_layout: the expert axis (shown above) must split the group "
                "dim g as its innermost axis, or be replicated, in the dispatched tensor (shown "
                "above), so that one all-to-all moves it to e. Fix: split the tokens as "
                "split<'g', \"dp\", \"ep\"> (the expert axis last), not over it elsewhere.");
};
}  // namespace dispatch_error

namespace detail {

using zest::detail::axis_index_of;

// "egcm" on the experts' side: the expert axis stops splitting g (the axes nested inside it
// move up one level) and splits e instead.
constexpr layout_value expert_side(layout_value v, std::size_t axis) {
  const axis_placement p = v.axes[axis];
  if (p.kind == placement_kind::split) {
    for (std::size_t a = 0; a < v.axis_count; ++a) {
      if (v.is_split(a) && v.axes[a].dim == p.dim && v.axes[a].order > p.order) --v.axes[a].order;
    }
  }
  v.axes[axis] = axis_placement{placement_kind::split, 'e', 0};
  return v;
}

// Whether the expert axis of the token-side layout v may move to e in one all-to-all (it
// splits g innermost) or by a local slice (it is replicated), with e split nowhere.
constexpr bool expert_axis_movable(layout_value v, std::size_t axis) {
  if (v.split_count('e') != 0) return false;
  if (v.is_replicate(axis)) return true;
  return v.splits(axis, 'g') &&
         static_cast<std::size_t>(v.axes[axis].order) + 1 == v.split_count('g');
}

template <fixed_string Op, class X, fixed_string Dims>
constexpr bool check_dims() {
  if constexpr (view_of<X::dims> != view_of<Dims>) {
    (void)dispatch_error::wrong_dims<Op, X, Dims>{};
    return false;
  } else {
    return true;
  }
}

template <fixed_string Op, class I>
constexpr bool check_indices() {
  if constexpr (!check_dims<Op, I, "gsk">()) {
    return false;
  } else if constexpr (!std::is_same_v<typename I::value_type, std::int32_t>) {
    (void)dispatch_error::index_type<Op, I>{};
    return false;
  } else if constexpr (I::layout.any_partial()) {
    (void)autodiff::autodiff_error::partial_operand<Op, I>{};
    return false;
  } else if constexpr (I::layout.split_count('s') != 0 || I::layout.split_count('k') != 0) {
    (void)dispatch_error::split_tokens<Op, I>{};
    return false;
  } else {
    return true;
  }
}

// The error of a kept route outside the experts or the capacity.
template <fixed_string Op>
shape_error route_error(std::size_t group, std::size_t token, std::size_t choice, std::int32_t e,
                        std::int32_t c, std::size_t experts, std::size_t capacity) {
  return shape_error(zest::detail::message("zest: ", view_of<Op>, ": token (g=", group,
                                           ", s=", token, ") choice ", choice, " goes to expert ",
                                           e, ", slot ", c, ", outside ", experts,
                                           " experts of capacity ", capacity));
}

template <fixed_string Op, class A, class B>
void check_same_extents(const A& a, const B& b, std::string_view a_name, std::string_view b_name) {
  if (a.extents() != b.extents()) {
    throw shape_error(zest::detail::message("zest: ", view_of<Op>, ": ", a_name, " and ", b_name,
                                            " \"gsk\" have different extents"));
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Layouts.

// expert_layout_of<ExpertAxis, D>: the layout (and type) of a dispatched "egcm" tensor D on
// the experts' side.
template <fixed_string ExpertAxis, sharded_tensor D>
struct expert_layout_of {
  using mesh_type = typename D::mesh_type;
  static constexpr std::size_t axis = detail::axis_index_of<mesh_type>(view_of<ExpertAxis>);
  static constexpr layout_value layout =
      axis < mesh_type::axis_count ? detail::expert_side(D::layout, axis) : D::layout;
  using type = typename with_layout_for<D, layout>::type;
};

// The dispatched tensor "egcm" moved to the experts' ranks: an all-to-all over ExpertAxis
// (a free slice if the tokens are replicated over it). Backward: the inverse all-to-all.
template <fixed_string ExpertAxis, sharded_tensor D>
auto to_expert_layout(const autodiff::variable<D>& dispatched) {
  using target = expert_layout_of<ExpertAxis, D>;
  if constexpr (!detail::check_dims<"to_expert_layout", D, "egcm">()) {
    return 0;
  } else if constexpr (target::axis == D::mesh_type::axis_count) {
    (void)dispatch_error::no_expert_axis<ExpertAxis, typename D::mesh_type>{};
    return 0;
  } else if constexpr (!detail::expert_axis_movable(D::layout, target::axis)) {
    (void)dispatch_error::expert_axis_busy<ExpertAxis, D>{};
    return 0;
  } else {
    return autodiff::redistribute<target::layout>(dispatched);
  }
}

// The experts' output back to the layout of the dispatched tensor (TokenLayout, e.g.
// decltype(d)::tensor_type::layout): the inverse all-to-all.
template <layout_key TokenLayout, sharded_tensor Y>
auto to_token_layout(const autodiff::variable<Y>& y) {
  if constexpr (!detail::check_dims<"to_token_layout", Y, "egcm">()) {
    return 0;
  } else {
    return autodiff::redistribute<TokenLayout>(y);
  }
}

// ---------------------------------------------------------------------------------------
// The index path.

namespace detail {

// The routes of the local "gsk" shards: the indices copied (for the backward steps) and, if
// asked, the lists of the slot rows. Indices outside [0, E) x [0, C) throw zest::shape_error
// (slot -1 means dropped): one sum where the indices live; the message, on the error path
// only, from host copies.
template <fixed_string Op, sharded_tensor I>
std::shared_ptr<index_routes<typename I::backend_type>> local_routes(const I& expert_index,
                                                                     const I& slot_index,
                                                                     std::size_t experts,
                                                                     std::size_t capacity,
                                                                     bool lists) {
  using B = typename I::backend_type;
  const auto& le = expert_index.local_extents();  // [G_l][S][K]
  auto r = std::make_shared<index_routes<B>>();
  r->groups = le[0];
  r->tokens = le[1];
  r->k = le[2];
  r->experts = experts;
  r->capacity = capacity;
  const std::size_t n = r->groups * r->tokens * r->k;
  const std::int32_t* pe = expert_index.local().data();
  const std::int32_t* ps = slot_index.local().data();
  if (sum_kernel<B>(n, bad_route{pe, ps, experts, capacity}) != 0) {
    const auto ei = expert_index.local_to_host();
    const auto si = slot_index.local_to_host();
    for (std::size_t a = 0; a < n; ++a) {
      const std::int32_t c = si[a], e = ei[a];
      if (c >= 0 && (e < 0 || static_cast<std::size_t>(e) >= experts ||
                     static_cast<std::size_t>(c) >= capacity)) {
        const std::size_t t = a / r->k;
        throw route_error<Op>(expert_index.local_offsets()[0] + t / r->tokens, t % r->tokens,
                              a % r->k, e, c, experts, capacity);
      }
    }
  }
  r->expert = typename B::template buffer<std::int32_t>(n);
  r->slot = typename B::template buffer<std::int32_t>(n);
  B::copy_slices(pe, 1, n, 0, r->expert.data(), n, 0, n, 1);
  B::copy_slices(ps, 1, n, 0, r->slot.data(), n, 0, n, 1);
  if (lists) {
    r->head = typename B::template buffer<std::int64_t>(experts * r->groups * capacity);
    r->next = typename B::template buffer<std::int64_t>(n);
    for_each_kernel<B>(r->groups * experts,
                       link_routes{r->expert.data(), r->slot.data(), r->head.data(), r->next.data(),
                                   r->groups, r->tokens * r->k, experts, capacity});
  }
  return r;
}

}  // namespace detail

// Row (e, g, c) of the result is x[g, s] for the token s of group g whose choice routes it to
// expert e, slot c (the sum, should two routes share a slot), zeros in empty slots: GShard's
// einsum<"gsec,gsm->egcm">(dispatch, x) without the one-hot tensor. x "gsm" is split on g
// (any axes) and may be split on m or partial; s is whole. expert_index and slot_index are
// int32_t "gsk" (slot -1: dropped), used split as x is on g. The result has x's layout; its
// gradient gathers: dx[g, s] = sum over kept choices of dy[e, g, c]. Local, O(G·S·k·M).
template <sharded_tensor X, sharded_tensor I>
auto dispatch_by_index(const autodiff::variable<X>& x, const I& expert_index, const I& slot_index,
                       std::size_t experts, std::size_t capacity) {
  if constexpr (!autodiff::detail::check_real_operand<"dispatch_by_index", X>()) {
    return 0;
  } else if constexpr (!detail::check_dims<"dispatch_by_index", X, "gsm">()) {
    return 0;
  } else if constexpr (X::layout.split_count('s') != 0) {
    (void)dispatch_error::split_tokens<"dispatch_by_index", X>{};
    return 0;
  } else if constexpr (!detail::check_indices<"dispatch_by_index", I>()) {
    return 0;
  } else if constexpr (!std::is_same_v<typename I::mesh_type, typename X::mesh_type>) {
    (void)autodiff::autodiff_error::operand_mismatch<"dispatch_by_index", X, I>{};
    return 0;
  } else {
    using T = typename X::value_type;
    using out_t = basic_tensor<T, typename X::mesh_type, "egcm", X::layout>;
    constexpr layout_value index_at = autodiff::detail::splits_of(X::layout, "gsk");
    const X& xv = x.value();
    detail::check_same_extents<"dispatch_by_index">(expert_index, slot_index, "expert_index",
                                                    "slot_index");
    if (expert_index.extents()[0] != xv.extents()[0] ||
        expert_index.extents()[1] != xv.extents()[1]) {
      throw shape_error(zest::detail::message(
          "zest: dispatch_by_index: x \"gsm\" has g=", xv.extents()[0], ", s=", xv.extents()[1],
          " but the routing \"gsk\" has g=", expert_index.extents()[0],
          ", s=", expert_index.extents()[1]));
    }
    const auto& ei = zest::at_layout<index_at>(expert_index);
    const auto& si = zest::at_layout<index_at>(slot_index);
    using B = typename X::backend_type;
    auto routes = detail::local_routes<"dispatch_by_index">(ei, si, experts, capacity, true);
    const std::size_t width = xv.local_extents()[2];
    out_t y(xv.mesh(), {experts, xv.extents()[0], capacity, xv.extents()[2]}, out_t::uninitialized);
    for_each_kernel<B>(
        y.local_count(),
        detail::gather_slots<T>{xv.local().data(), nullptr, routes->head.data(),
                                routes->next.data(), y.local().data(), width, routes->k});
    auto out = autodiff::detail::make_result(x.owner(), std::move(y), x.requires_grad());
    if (out.requires_grad()) {
      x.owner().record([xn = x.node(), on = out.node(), routes = std::move(routes), width] {
        if (!on->grad) return;
        const detail::index_routes<B>& r = *routes;
        autodiff::dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(),
                                    autodiff::dual_tensor<X>::uninitialized);
        for_each_kernel<B>(dx.local_count(), detail::gather_tokens<T>{
                                                 std::as_const(*on->grad).local().data(), nullptr,
                                                 r.expert.data(), r.slot.data(), dx.local().data(),
                                                 width, r.k, r.tokens, r.groups, r.capacity});
        xn->accumulate(std::move(dx));
      });
    }
    return out;
  }
}

// z[g, s] = sum over the kept choices k of weight[g, s, k] · y[e_k, g, c_k]: GShard's
// einsum<"gsec,egcm->gsm">(combine, y) without the one-hot tensor. y "egcm" is back in the
// token layout (g split, e and c whole; m may be split, y may be partial); weight "gsk"
// (a variable, not partial) and the indices are used split as y is on g. The result has y's
// layout. Gradients: dy[e_k, g, c_k] += weight · dz[g, s] (a scatter-add), dweight[g, s, k] =
// dz[g, s] · y[e_k, g, c_k] (0 for dropped choices), pending where y splits m or is partial.
template <sharded_tensor Y, sharded_tensor W, sharded_tensor I>
auto combine_by_index(const autodiff::variable<Y>& y, const autodiff::variable<W>& weight,
                      const I& expert_index, const I& slot_index) {
  if constexpr (!autodiff::detail::check_real_operand<"combine_by_index", Y>()) {
    return 0;
  } else if constexpr (!detail::check_dims<"combine_by_index", Y, "egcm">()) {
    return 0;
  } else if constexpr (Y::layout.split_count('e') != 0 || Y::layout.split_count('c') != 0) {
    (void)dispatch_error::split_experts<"combine_by_index", Y>{};
    return 0;
  } else if constexpr (!detail::check_dims<"combine_by_index", W, "gsk">()) {
    return 0;
  } else if constexpr (!autodiff::detail::check_same_kind<"combine_by_index", Y, W>()) {
    return 0;
  } else if constexpr (W::layout.any_partial()) {
    (void)autodiff::autodiff_error::partial_operand<"combine_by_index", W>{};
    return 0;
  } else if constexpr (W::layout.split_count('s') != 0 || W::layout.split_count('k') != 0) {
    (void)dispatch_error::split_tokens<"combine_by_index", W>{};
    return 0;
  } else if constexpr (!detail::check_indices<"combine_by_index", I>()) {
    return 0;
  } else if constexpr (!std::is_same_v<typename I::mesh_type, typename Y::mesh_type>) {
    (void)autodiff::autodiff_error::operand_mismatch<"combine_by_index", Y, I>{};
    return 0;
  } else {
    using T = typename Y::value_type;
    using out_t = basic_tensor<T, typename Y::mesh_type, "gsm", Y::layout>;
    constexpr layout_value at = autodiff::detail::splits_of(Y::layout, "gsk");
    using w_grad_t = typename zest::with_layout_for<W, autodiff::dual(at)>::type;
    constexpr bool moved = W::layout != at;  // weight used through a copy in layout `at`
    const Y& yv = y.value();
    detail::check_same_extents<"combine_by_index">(expert_index, slot_index, "expert_index",
                                                   "slot_index");
    detail::check_same_extents<"combine_by_index">(expert_index, weight.value(), "expert_index",
                                                   "weight");
    if (expert_index.extents()[0] != yv.extents()[1]) {
      throw shape_error(
          zest::detail::message("zest: combine_by_index: y \"egcm\" has g=", yv.extents()[1],
                                " but the routing \"gsk\" has g=", expert_index.extents()[0]));
    }
    const auto& ei = zest::at_layout<at>(expert_index);
    const auto& si = zest::at_layout<at>(slot_index);
    decltype(auto) wu = zest::at_layout<at>(weight.value());
    using B = typename Y::backend_type;
    auto routes = detail::local_routes<"combine_by_index">(ei, si, yv.extents()[0], yv.extents()[2],
                                                           y.requires_grad());
    const std::size_t width = yv.local_extents()[3];
    out_t z(yv.mesh(), {yv.extents()[1], ei.extents()[1], yv.extents()[3]}, out_t::uninitialized);
    for_each_kernel<B>(
        z.local_count(),
        detail::gather_tokens<T>{yv.local().data(), wu.local().data(), routes->expert.data(),
                                 routes->slot.data(), z.local().data(), width, routes->k,
                                 routes->tokens, routes->groups, routes->capacity});
    auto out = autodiff::detail::make_result(y.owner(), std::move(z),
                                             y.requires_grad() || weight.requires_grad());
    if (!out.requires_grad()) return out;
    // The weight as used, for y's gradient: the weight's own node unless it was moved.
    auto w_used = autodiff::detail::keep_if<moved>(std::move(wu));
    y.owner().record([yn = y.node(), wn = weight.node(), on = out.node(),
                      routes = std::move(routes), width, w_used = std::move(w_used)] {
      (void)w_used;  // used in one branch of an if constexpr only
      if (!on->grad) return;
      const detail::index_routes<B>& r = *routes;
      const T* dz = std::as_const(*on->grad).local().data();
      if (yn->requires_grad) {
        autodiff::dual_tensor<Y> dy(yn->value.mesh(), yn->value.extents(),
                                    autodiff::dual_tensor<Y>::uninitialized);
        const T* pw = [&] {
          if constexpr (moved) {
            return w_used.local().data();
          } else {
            return std::as_const(wn->value).local().data();
          }
        }();
        for_each_kernel<B>(dy.local_count(),
                           detail::gather_slots<T>{dz, pw, r.head.data(), r.next.data(),
                                                   dy.local().data(), width, r.k});
        yn->accumulate(std::move(dy));
      }
      if (wn->requires_grad) {
        w_grad_t dw(wn->value.mesh(), wn->value.extents(), w_grad_t::uninitialized);
        for_each_kernel<B>(dw.local_count(),
                           detail::route_dot<T>{dz, std::as_const(yn->value).local().data(),
                                                r.expert.data(), r.slot.data(), dw.local().data(),
                                                width, r.k, r.tokens, r.groups, r.capacity});
        wn->accumulate(zest::redistribute_to<autodiff::dual(W::layout)>(std::move(dw)));
      }
    });
    return out;
  }
}

// ---------------------------------------------------------------------------------------
// The experts.

// Each expert's feed-forward on its slots: GELU(x W_in (+ b_in)) W_out (+ b_out), as the
// einsums "egcm,emh->egch" and "egch,ehm->egcm" (biases "eh", "em" broadcast over g and c).
// With x on the experts' side and the weights split<'e', ExpertAxis>, nothing moves.
template <sharded_tensor X, sharded_tensor W1, sharded_tensor W2>
auto expert_feed_forward(const autodiff::variable<X>& x, const autodiff::variable<W1>& w_in,
                         const autodiff::variable<W2>& w_out) {
  return autodiff::einsum<"egch,ehm->egcm">(
      autodiff::gelu(autodiff::einsum<"egcm,emh->egch">(x, w_in)), w_out);
}
template <sharded_tensor X, sharded_tensor W1, sharded_tensor B1, sharded_tensor W2,
          sharded_tensor B2>
auto expert_feed_forward(const autodiff::variable<X>& x, const autodiff::variable<W1>& w_in,
                         const autodiff::variable<B1>& b_in, const autodiff::variable<W2>& w_out,
                         const autodiff::variable<B2>& b_out) {
  auto h = autodiff::broadcast_add(autodiff::einsum<"egcm,emh->egch">(x, w_in), b_in);
  return autodiff::broadcast_add(autodiff::einsum<"egch,ehm->egcm">(autodiff::gelu(h), w_out),
                                 b_out);
}

// ---------------------------------------------------------------------------------------
// Communication volume.

// The bytes this rank sends in the all-to-alls of one MoE layer over the expert axis (the
// communicator's counters count exactly these, zest/comm/communicator.hpp):
//   to_experts  token side -> experts' side: my block of every other rank's experts,
//               (E - E_mine) · g_tokens · C · m_local elements
//   to_tokens   experts' side -> token side: my experts' slots of the other ranks' groups,
//               E_mine · (g_experts - g_tokens) · C · m_local elements
// where g_tokens and g_experts are this rank's extents of g on either side. Forward runs
// each once; backward runs each once more (the dual redistributes, in the other direction).
// Even splits: each is (n - 1)/n of the local block, so a step moves 4 (n - 1)/n blocks.
// Dropless experts (zest/moe/dropless.hpp) send their rows' counts first, in forward only.
struct all_to_all_volume {
  std::size_t to_experts = 0;
  std::size_t to_tokens = 0;
  std::size_t counts = 0;
  std::size_t forward() const { return to_experts + to_tokens + counts; }
  std::size_t backward() const { return to_experts + to_tokens; }
  std::size_t step() const { return forward() + backward(); }  // forward + backward
};

// From the shape of the dispatched tensor D "egcm" (token side): global extents, on `mesh`.
// Zero when the tokens are not split over the expert axis (then dispatch slices locally and
// the way back all-gathers: no all-to-all).
template <sharded_tensor D, fixed_string ExpertAxis = "ep">
all_to_all_volume all_to_all_bytes(const typename D::mesh_type& mesh,
                                   const typename D::extents_type& extents) {
  using target = expert_layout_of<ExpertAxis, D>;
  static_assert(view_of<D::dims> == "egcm",
                "zest moe all_to_all_bytes: D is the dispatched tensor, dims \"egcm\"");
  static_assert(target::axis < D::mesh_type::axis_count,
                "zest moe all_to_all_bytes: the mesh has no axis of the expert axis' name");
  if (!D::layout.splits(target::axis, 'g') || mesh.size(target::axis) == 1) return {};
  const auto local = [&](layout_value v) {
    std::array<std::size_t, 4> out{};
    for (std::size_t i = 0; i < 4; ++i) {
      out[i] = dim_range(v, D::dims[i], extents[i], mesh.sizes(), mesh.coords()).size;
    }
    return out;
  };
  const auto tok = local(D::layout);       // [E][g_tokens][C][m]
  const auto exp = local(target::layout);  // [E_mine][g_experts][C][m]
  const std::size_t rest = tok[2] * tok[3] * sizeof(typename D::value_type);
  all_to_all_volume v;
  v.to_experts = (tok[0] - exp[0]) * tok[1] * rest;
  v.to_tokens = exp[0] * (exp[1] - tok[1]) * rest;
  return v;
}
template <fixed_string ExpertAxis = "ep", sharded_tensor D>
all_to_all_volume all_to_all_bytes(const D& dispatched) {
  return all_to_all_bytes<D, ExpertAxis>(dispatched.mesh(), dispatched.extents());
}

}  // namespace zest::moe
