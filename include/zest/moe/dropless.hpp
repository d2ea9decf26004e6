// zest/moe/dropless.hpp — dropless experts: each expert computes exactly the tokens routed
// to it, no capacity slot computed empty, no token dropped (MegaBlocks' aim, as grouped
// GEMMs over the concatenated rows).
//
//   auto r = moe::gating(logits, {.top_k = 2, .dropless = true});
//   auto z = moe::dropless_experts<"ep">(x, r.weight, r.expert_index, r.slot_index,
//                                        w_in, b_in, w_out, b_out);    // "gsm" -> "gsm"
//
// z[g, s] = sum over the kept choices j of weight[g, s, j] · FFN_e(x[g, s]), e the choice's
// expert, FFN_e(v) = GELU(v W_in[e] + b_in[e]) W_out[e] + b_out[e]: the capacity path's
// dispatch -> expert_feed_forward -> combine (zest/moe/dispatch.hpp) with the same routing,
// without the empty slots. Given a capacity routing it equals that path exactly where no
// choice is dropped, and computes the same kept choices where some are.
//
// On each rank, with n ranks on the expert axis, E_l = E / n experts per rank:
//
//   1. the kept choices of the local tokens in send order: by local expert l, then by the
//      rank p that holds expert p E_l + l, then group, then slot; a row each, R_send rows of
//      width M (a copy of x's rows)
//   2. all-to-all of the counts: E_l numbers to each rank of the expert axis (fixed size),
//      while step 1 copies the rows
//   3. one all-to-all of rows per local expert l (E_l calls, started together): rank p's rows
//      for my expert l land straight in expert l's block of the experts' input, so the
//      experts' rows are expert-major (expert l's n_l rows contiguous) with no permutation
//   4. per expert the GEMMs n_l x M x H and n_l x H x M (none where n_l = 0), its bias and
//      GELU in one pass between them
//   5. the same E_l all-to-alls back, and the weighted sum per token
//
// Backward runs 5 to 3 backwards: E_l all-to-alls of d y's rows (the gates' gradient computed
// while they travel), per expert the GEMMs for d x's rows, which start back at once, then the
// weights' gradients (GEMMs over the rows, column sums for the biases) while they travel.
// Every rank starts the same collectives in the same order whatever the routing (1 + 2 E_l
// in forward, 2 E_l in backward); only the counts differ, so a rank whose experts receive no
// token, or that holds no token, takes part like any other. ZeRO gathers the expert weights
// before the forward and backward of their group as for any parameter. The row buffers'
// sizes are rounded up to a few sizes per power of two, so that the allocator's cache of
// freed blocks serves them again next step although the counts change.
//
// Bytes sent per rank (all_to_all_volume): counts (n - 1) · E_l · 8 in forward; to_experts =
// my rows for other ranks' experts, to_tokens = the rows my experts computed for other ranks'
// tokens, each once in forward and once in backward.
//
// Layouts: x "gsm" splits g only, with the expert axis innermost (or replicated over it when
// it has size 1), never m or s, and is not partial; the weight "gsk" and the int32_t indices
// as routing's; w_in "emh", b_in "eh", w_out "ehm", b_out "em" in the layout that splits e
// over the expert axis and nothing else (moe_layer's parameters as used). Extents that do
// not fit throw zest::shape_error naming the operation, the dims and the extents.
//
// Backends: one definition; the loops are function objects (zest/moe/detail/
// dropless_kernels.hpp) run by for_each_kernel, the GEMMs the backend's contract, the counts
// and the row offsets the only data on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/kernels.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/moe/detail/dropless_kernels.hpp"
#include "zest/moe/dispatch.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::moe {

namespace dispatch_error {
template <fixed_string ExpertAxis, class Tensor>
struct dropless_tokens_layout {
  static_assert(always_false<Tensor>,
                "zest moe: dropless_experts: the tokens \"gsm\" (shown above) must split only g, "
                "with the expert axis (shown above) innermost or not at all, and be neither "
                "partial nor split on s or m. Fix: layout<split<'g', \"dp\", \"ep\">>.");
};
template <fixed_string ExpertAxis, class Tensor>
struct dropless_weight_layout {
  static_assert(always_false<Tensor>,
                "zest moe: dropless_experts: an expert weight or bias (shown above) must split e "
                "over the expert axis (shown above) and nothing else, as moe_layer's parameters "
                "are used. Fix: parameter<P, \"emh\", layout<split<'e', \"ep\">>, ...>::value().");
};
}  // namespace dispatch_error

namespace detail {

// The layout splitting e over `axis` and nothing else.
constexpr layout_value expert_only(std::size_t axes, std::size_t axis) {
  layout_value v = replicated_layout(axes);
  v.axes[axis] = axis_placement{placement_kind::split, 'e', 0};
  return v;
}

// An expert weight's gradient as this rank computes it: a summand over the axes that split the
// tokens (but the expert axis, which the rows crossed), whole elsewhere.
constexpr layout_value expert_gradient_layout(layout_value w, layout_value tokens,
                                              std::size_t axis) {
  for (std::size_t a = 0; a < w.axis_count; ++a) {
    if (a != axis && tokens.is_split(a)) w.axes[a] = axis_placement{placement_kind::partial, 0, 0};
  }
  return w;
}

template <class W, class X, std::size_t Axis>
struct expert_gradient {
  static constexpr layout_value layout = expert_gradient_layout(W::layout, X::layout, Axis);
  using type = typename zest::with_layout_for<W, layout>::type;
};

template <fixed_string ExpertAxis, class X>
constexpr bool dropless_tokens_ok() {
  constexpr std::size_t axis = axis_index_of<typename X::mesh_type>(view_of<ExpertAxis>);
  constexpr layout_value v = X::layout;
  if (v.any_partial() || v.split_count('s') != 0 || v.split_count('m') != 0) return false;
  return v.is_replicate(axis) ||
         (v.splits(axis, 'g') &&
          static_cast<std::size_t>(v.axes[axis].order) + 1 == v.split_count('g'));
}

template <fixed_string ExpertAxis, class W, fixed_string Dims>
constexpr bool check_expert_weight() {
  if constexpr (!check_dims<"dropless_experts", W, Dims>()) {
    return false;
  } else if constexpr (W::layout !=
                       expert_only(W::mesh_type::axis_count,
                                   axis_index_of<typename W::mesh_type>(view_of<ExpertAxis>))) {
    (void)dispatch_error::dropless_weight_layout<ExpertAxis, W>{};
    return false;
  } else {
    return true;
  }
}

// The backend's buffer of T. Its size may change from step to step with the routing: the
// allocators keep freed blocks by size class (zest/core/memory.hpp, and the device pool), so
// a step finds the blocks of the step before.
template <class B, class T>
using buffer_t = typename B::template buffer<T>;

// What the backward steps keep of the forward, in the backend's memory, and the plan of rows.
// The rows on the tokens' side are in send order: local expert l (of every rank of the expert
// axis), then the rank p, then group and slot; on the experts' side expert-major: local expert
// l, then the rank p the rows came from. Expert l's rows of every rank are contiguous on both
// sides, so that one all-to-all per local expert moves them straight between the two.
template <class T, class B>
struct dropless_state {
  std::size_t tokens = 0, k = 0, width = 0, hidden = 0, local_experts = 0, ranks = 0;
  std::size_t send_rows = 0, recv_rows = 0;
  std::vector<std::size_t> send_counts, recv_counts;  // rows, [l][p]: to and from rank p
  std::vector<std::size_t> send_offsets;           // per local expert: its first row in send order
  std::vector<std::size_t> rows, offsets;          // per local expert: rows received, first row
  std::shared_ptr<index_routes<B>> routes;         // the indices, copied
  typename B::template buffer<std::int64_t> base;  // [G_l][E]
  buffer_t<B, T> x, h, a, y_back;                  // x, h, a expert-major; y_back send order
  choice_rows at() const {
    return {routes->expert.data(), routes->slot.data(), base.data(),
            routes->experts,       tokens * k,          k};
  }
};

// Starts the exchange of rows of `width` between the tokens' side (send order) and the
// experts' (expert-major): one all-to-all per local expert, from `from` straight into `to`,
// all started at once so that they meet the other ranks together (the caller waits for them,
// with work in between where it has some). Every rank starts the same E_l calls; only the
// counts differ.
template <class T, class B, class Comm>
std::vector<request> exchange_rows(Comm& comm, const dropless_state<T, B>& s, const T* from, T* to,
                                   std::size_t width, bool to_experts) {
  const std::size_t n = s.ranks;
  std::vector<request> started;
  started.reserve(s.local_experts);
  std::vector<std::size_t> sent(n), got(n);  // elements (the call keeps a copy)
  for (std::size_t l = 0; l < s.local_experts; ++l) {
    std::size_t total = 0;
    for (std::size_t p = 0; p < n; ++p) {
      sent[p] = s.send_counts[l * n + p] * width;
      got[p] = s.recv_counts[l * n + p] * width;
      total += sent[p];
    }
    const std::size_t tokens_at = s.send_offsets[l] * width, experts_at = s.offsets[l] * width;
    const std::size_t experts_total = s.rows[l] * width;
    if (to_experts) {
      started.push_back(
          comm.template iall_to_all<T>(std::span<const T>(from + tokens_at, total), sent,
                                       std::span<T>(to + experts_at, experts_total), got));
    } else {
      started.push_back(
          comm.template iall_to_all<T>(std::span<const T>(from + experts_at, experts_total), got,
                                       std::span<T>(to + tokens_at, total), sent));
    }
  }
  return started;
}
inline void wait_all(std::vector<request>& started) {
  for (auto& r : started) r.wait();
}

// out (rows x cols) = lhs (rows x inner, labels l) . rhs, one GEMM on the backend.
template <class B, class T>
void gemm(const T* lhs, std::string_view lhs_labels, std::size_t l0, std::size_t l1, const T* rhs,
          std::string_view rhs_labels, std::size_t r0, std::size_t r1, T* out,
          std::string_view out_labels, std::size_t o0, std::size_t o1) {
  const std::size_t le[] = {l0, l1}, re[] = {r0, r1}, oe[] = {o0, o1};
  const contraction::operand_view<T> ops[] = {{lhs, lhs_labels, le}, {rhs, rhs_labels, re}};
  B::contract(std::span<const contraction::operand_view<T>>(ops), out_labels, out, oe);
}

template <fixed_string ExpertAxis, sharded_tensor X, sharded_tensor Wt, sharded_tensor I,
          sharded_tensor W1, sharded_tensor B1, sharded_tensor W2, sharded_tensor B2>
auto dropless(const autodiff::variable<X>& x, const autodiff::variable<Wt>& weight,
              const I& expert_index, const I& slot_index, const autodiff::variable<W1>& w_in,
              const autodiff::variable<B1>* b_in, const autodiff::variable<W2>& w_out,
              const autodiff::variable<B2>* b_out, all_to_all_volume* volume) {
  using Mesh = typename X::mesh_type;
  using T = typename X::value_type;
  using B = typename X::backend_type;
  constexpr std::size_t axis = axis_index_of<Mesh>(view_of<ExpertAxis>);
  constexpr layout_value at_gsk = autodiff::detail::splits_of(X::layout, "gsk");
  using w_grad_t = typename zest::with_layout_for<Wt, autodiff::dual(at_gsk)>::type;
  constexpr bool moved = Wt::layout != at_gsk;
  using g1_t = typename expert_gradient<W1, X, axis>::type;
  using g2_t = typename expert_gradient<W2, X, axis>::type;
  using gb1_t = typename expert_gradient<B1, X, axis>::type;
  using gb2_t = typename expert_gradient<B2, X, axis>::type;
  using out_t = basic_tensor<T, Mesh, "gsm", X::layout>;

  const X& xv = x.value();
  const Mesh& mesh = xv.mesh();
  const auto n = static_cast<std::size_t>(mesh.size(axis));
  const auto q = static_cast<std::size_t>(mesh.coord(axis));
  const auto& xe = xv.extents();
  const auto& wie = w_in.value().extents();
  const auto& woe = w_out.value().extents();
  const std::size_t E = wie[0], M = xe[2], H = wie[2];
  const auto fail = [&](const auto&... what) {
    return shape_error(zest::detail::message("zest: dropless_experts: ", what...));
  };
  if (X::layout.is_replicate(axis) && n > 1) {
    throw fail("the tokens \"gsm\" are replicated over the expert axis '", view_of<ExpertAxis>,
               "' of size ", n, "; split g over it (innermost), e.g. layout<split<'g', \"dp\", \"",
               view_of<ExpertAxis>, "\">>");
  }
  if (wie[1] != M || woe[0] != E || woe[1] != H || woe[2] != M) {
    throw fail("x \"gsm\" is ", xe[0], " x ", xe[1], " x ", M, ", w_in \"emh\" ", E, " x ", wie[1],
               " x ", H, ", w_out \"ehm\" ", woe[0], " x ", woe[1], " x ", woe[2],
               "; they must agree on e, m and h");
  }
  if (b_in != nullptr && (b_in->value().extents()[0] != E || b_in->value().extents()[1] != H)) {
    throw fail("b_in \"eh\" is ", b_in->value().extents()[0], " x ", b_in->value().extents()[1],
               ", w_in \"emh\" has e = ", E, ", h = ", H);
  }
  if (b_out != nullptr && (b_out->value().extents()[0] != E || b_out->value().extents()[1] != M)) {
    throw fail("b_out \"em\" is ", b_out->value().extents()[0], " x ", b_out->value().extents()[1],
               ", w_out \"ehm\" has e = ", E, ", m = ", M);
  }
  if (E % n != 0) {
    throw fail("E = ", E, " experts do not divide over the expert axis '", view_of<ExpertAxis>,
               "' of size ", n);
  }
  check_same_extents<"dropless_experts">(expert_index, slot_index, "expert_index", "slot_index");
  check_same_extents<"dropless_experts">(expert_index, weight.value(), "expert_index", "weight");
  if (expert_index.extents()[0] != xe[0] || expert_index.extents()[1] != xe[1]) {
    throw fail("x \"gsm\" has g = ", xe[0], ", s = ", xe[1],
               " but the routing \"gsk\" has g = ", expert_index.extents()[0],
               ", s = ", expert_index.extents()[1]);
  }

  const auto& ei = zest::at_layout<at_gsk>(expert_index);
  const auto& si = zest::at_layout<at_gsk>(slot_index);
  decltype(auto) wu = zest::at_layout<at_gsk>(weight.value());
  auto st = std::make_shared<dropless_state<T, B>>();
  dropless_state<T, B>& s = *st;
  const std::size_t S = xe[1];
  s.routes = local_routes<"dropless_experts">(ei, si, E, S == 0 ? 1 : S, false);
  const std::size_t G = s.routes->groups;
  s.tokens = S;
  s.k = s.routes->k;
  s.width = M;
  s.hidden = H;
  const std::size_t El = E / n;
  s.local_experts = El;
  const std::size_t cells = G * E, assignments = G * S * s.k;

  // 1. The rows to send, in send order.
  std::vector<std::int64_t> kept(cells), ends(cells);
  {
    typename B::template buffer<std::int64_t> kb(cells), sb(cells);
    for_each_kernel<B>(cells, count_routes{s.routes->expert.data(), s.routes->slot.data(),
                                           kb.data(), sb.data(), E, S * s.k});
    B::to_host(std::span<const std::int64_t>(kb.data(), cells), kept.data());
    B::to_host(std::span<const std::int64_t>(sb.data(), cells), ends.data());
  }
  std::vector<std::int64_t> per_expert(E, 0), base(cells);
  for (std::size_t i = 0; i < cells; ++i) {
    if (kept[i] != ends[i]) {
      throw fail("the kept slots of expert ", i % E, " in group ", ei.local_offsets()[0] + i / E,
                 " are not 0 .. ", kept[i] - 1, " (the largest is ", ends[i] - 1,
                 "); use the slots of moe::gating");
    }
    per_expert[i % E] += kept[i];
  }
  s.ranks = n;
  s.send_counts.assign(El * n, 0);
  s.send_offsets.assign(El, 0);
  {
    std::vector<std::int64_t> next(E);
    std::size_t start = 0;
    for (std::size_t l = 0; l < El; ++l) {
      s.send_offsets[l] = start;
      for (std::size_t p = 0; p < n; ++p) {
        const std::size_t e = p * El + l;
        next[e] = static_cast<std::int64_t>(start);
        s.send_counts[l * n + p] = static_cast<std::size_t>(per_expert[e]);
        start += s.send_counts[l * n + p];
      }
    }
    s.send_rows = start;
    for (std::size_t i = 0; i < cells; ++i) {
      base[i] = next[i % E];
      next[i % E] += kept[i];
    }
  }
  s.base = B::template from_host<std::int64_t>(std::span<const std::int64_t>(base));

  // 2. The counts: E_l to each rank of the expert axis (rank p's for my expert l at p E_l + l),
  // while the rows to send are gathered.
  auto& comm = mesh.axis(axis);
  buffer_t<B, T> send(s.send_rows * M);
  std::vector<std::int64_t> received(n * El);
  {
    auto cs = B::template from_host<std::int64_t>(std::span<const std::int64_t>(per_expert));
    typename B::template buffer<std::int64_t> cr(n * El);
    request counts =
        comm.template iall_to_all<std::int64_t>(std::span<const std::int64_t>(cs.data(), n * El),
                                                {}, std::span<std::int64_t>(cr.data(), n * El), {});
    for_each_kernel<B>(assignments * M,
                       scatter_choices<T>{xv.local().data(), nullptr, s.at(), send.data(), M});
    counts.wait();
    B::to_host(std::span<const std::int64_t>(cr.data(), n * El), received.data());
  }
  s.recv_counts.assign(El * n, 0);
  s.rows.assign(El, 0);
  s.offsets.assign(El, 0);
  for (std::size_t l = 0; l < El; ++l) {
    s.offsets[l] = s.recv_rows;
    for (std::size_t p = 0; p < n; ++p) {
      s.recv_counts[l * n + p] = static_cast<std::size_t>(received[p * El + l]);
      s.rows[l] += s.recv_counts[l * n + p];
    }
    s.recv_rows += s.rows[l];
  }

  // 3. The rows, straight from the tokens into my experts' inputs (expert-major).
  s.x = buffer_t<B, T>(s.recv_rows * M);
  {
    auto incoming = exchange_rows(comm, s, send.data(), s.x.data(), M, true);
    wait_all(incoming);
  }
  send = {};

  // 4. Per expert: the GEMMs n_e x M x H and n_e x H x M (none where n_e = 0), bias and GELU
  // between them on the rows just computed.
  s.h = buffer_t<B, T>(s.recv_rows * H);
  s.a = buffer_t<B, T>(s.recv_rows * H);
  buffer_t<B, T> y(s.recv_rows * M);
  const T* pw1 = w_in.value().local().data();
  const T* pw2 = w_out.value().local().data();
  for (std::size_t l = 0; l < El; ++l) {
    const std::size_t o = s.offsets[l], rows = s.rows[l];
    if (rows == 0) continue;
    gemm<B>(s.x.data() + o * M, "tm", rows, M, pw1 + l * M * H, "mh", M, H, s.h.data() + o * H,
            "th", rows, H);
    for_each_kernel<B>(
        rows * H, bias_gelu<T>{s.h.data() + o * H,
                               b_in != nullptr ? b_in->value().local().data() + l * H : nullptr,
                               s.a.data() + o * H, H});
    gemm<B>(s.a.data() + o * H, "th", rows, H, pw2 + l * H * M, "hm", H, M, y.data() + o * M, "tm",
            rows, M);
    if (b_out != nullptr) {
      for_each_kernel<B>(rows * M,
                         add_bias<T>{y.data() + o * M, b_out->value().local().data() + l * M, M});
    }
  }

  // 5. Back to the tokens' ranks, and the weighted sum.
  s.y_back = buffer_t<B, T>(s.send_rows * M);
  {
    auto outgoing = exchange_rows(comm, s, y.data(), s.y_back.data(), M, false);
    wait_all(outgoing);
  }
  out_t z(mesh, xe, out_t::uninitialized);
  for_each_kernel<B>(z.local_count(), gather_choices<T>{s.y_back.data(), wu.local().data(), s.at(),
                                                        z.local().data(), M});

  if (volume != nullptr) {
    *volume = {};
    for (std::size_t p = 0; p < n; ++p) {
      if (p == q) continue;
      for (std::size_t l = 0; l < El; ++l) {
        volume->to_experts += s.send_counts[l * n + p] * M * sizeof(T);
        volume->to_tokens += s.recv_counts[l * n + p] * M * sizeof(T);
      }
      volume->counts += El * sizeof(std::int64_t);
    }
  }

  const bool grads = x.requires_grad() || weight.requires_grad() || w_in.requires_grad() ||
                     w_out.requires_grad() || (b_in != nullptr && b_in->requires_grad()) ||
                     (b_out != nullptr && b_out->requires_grad());
  auto out = autodiff::detail::make_result(x.owner(), std::move(z), grads);
  if (!grads) return out;
  auto w_used = autodiff::detail::keep_if<moved>(std::move(wu));
  x.owner().record([xn = x.node(), wn = weight.node(), w1n = w_in.node(), w2n = w_out.node(),
                    b1n = b_in != nullptr ? b_in->node() : nullptr,
                    b2n = b_out != nullptr ? b_out->node() : nullptr, on = out.node(), st,
                    w_used = std::move(w_used)] {
    (void)w_used;  // used in one branch of an if constexpr only
    if (!on->grad) return;
    const dropless_state<T, B>& s = *st;
    const std::size_t M = s.width, H = s.hidden, n_rows = s.recv_rows;
    const T* dz = std::as_const(*on->grad).local().data();
    const T* pw = [&] {
      if constexpr (moved) {
        return w_used.local().data();
      } else {
        return std::as_const(wn->value).local().data();
      }
    }();
    const Mesh& mesh = on->value.mesh();
    auto& comm = mesh.axis(axis);
    // d y, sent to the experts' ranks straight into the experts' order; the weights' gradient
    // while it travels.
    buffer_t<B, T> sent(s.send_rows * M), dy(n_rows * M);
    for_each_kernel<B>(s.routes->groups * s.tokens * s.k * M,
                       scatter_choices<T>{dz, pw, s.at(), sent.data(), M});
    auto incoming = exchange_rows(comm, s, sent.data(), dy.data(), M, true);
    if (wn->requires_grad) {
      w_grad_t dw(wn->value.mesh(), wn->value.extents(), w_grad_t::uninitialized);
      for_each_kernel<B>(dw.local_count(),
                         choice_dot<T>{dz, s.y_back.data(), s.at(), dw.local().data(), M});
      wait_all(incoming);
      wn->accumulate(zest::redistribute_to<autodiff::dual(Wt::layout)>(std::move(dw)));
    }
    wait_all(incoming);
    sent = {};

    // Per expert: d x's rows first, which start back at once; the experts' weight gradients
    // while they travel. An idle expert's stay 0.
    const T* pw1 = std::as_const(w1n->value).local().data();
    const T* pw2 = std::as_const(w2n->value).local().data();
    buffer_t<B, T> da(n_rows * H), dh(n_rows * H);
    buffer_t<B, T> dx_rows(n_rows * M);
    for (std::size_t l = 0; l < s.local_experts; ++l) {
      const std::size_t o = s.offsets[l], rows = s.rows[l];
      if (rows == 0) continue;
      gemm<B>(dy.data() + o * M, "tm", rows, M, pw2 + l * H * M, "hm", H, M, da.data() + o * H,
              "th", rows, H);
      for_each_kernel<B>(
          rows * H,
          autodiff::kernels::unary_backward<T, autodiff::kernels::gelu_fn>{
              s.h.data() + o * H, s.a.data() + o * H, da.data() + o * H, dh.data() + o * H, {}});
      gemm<B>(dh.data() + o * H, "th", rows, H, pw1 + l * M * H, "mh", M, H, dx_rows.data() + o * M,
              "tm", rows, M);
    }
    buffer_t<B, T> back(s.send_rows * M);
    auto outgoing = exchange_rows(comm, s, dx_rows.data(), back.data(), M, false);
    g1_t dw1(w1n->value.mesh(), w1n->value.extents());
    g2_t dw2(w2n->value.mesh(), w2n->value.extents());
    std::optional<gb1_t> db1;
    std::optional<gb2_t> db2;
    if (b1n) db1.emplace(b1n->value.mesh(), b1n->value.extents());
    if (b2n) db2.emplace(b2n->value.mesh(), b2n->value.extents());
    for (std::size_t l = 0; l < s.local_experts; ++l) {
      const std::size_t o = s.offsets[l], rows = s.rows[l];
      if (rows == 0) continue;
      gemm<B>(s.a.data() + o * H, "th", rows, H, dy.data() + o * M, "tm", rows, M,
              dw2.local().data() + l * H * M, "hm", H, M);
      if (db2) {
        for_each_kernel<B>(M,
                           column_sums<T>{dy.data() + o * M, db2->local().data() + l * M, rows, M});
      }
      gemm<B>(s.x.data() + o * M, "tm", rows, M, dh.data() + o * H, "th", rows, H,
              dw1.local().data() + l * M * H, "mh", M, H);
      if (db1) {
        for_each_kernel<B>(H,
                           column_sums<T>{dh.data() + o * H, db1->local().data() + l * H, rows, H});
      }
    }
    wait_all(outgoing);
    if (w1n->requires_grad) {
      w1n->accumulate(zest::redistribute_to<autodiff::dual(W1::layout)>(std::move(dw1)));
    }
    if (w2n->requires_grad) {
      w2n->accumulate(zest::redistribute_to<autodiff::dual(W2::layout)>(std::move(dw2)));
    }
    if (b1n && b1n->requires_grad) {
      b1n->accumulate(zest::redistribute_to<autodiff::dual(B1::layout)>(std::move(*db1)));
    }
    if (b2n && b2n->requires_grad) {
      b2n->accumulate(zest::redistribute_to<autodiff::dual(B2::layout)>(std::move(*db2)));
    }
    // d x: summed per token.
    if (xn->requires_grad) {
      autodiff::dual_tensor<X> dx(xn->value.mesh(), xn->value.extents(),
                                  autodiff::dual_tensor<X>::uninitialized);
      for_each_kernel<B>(dx.local_count(),
                         gather_choices<T>{back.data(), nullptr, s.at(), dx.local().data(), M});
      xn->accumulate(std::move(dx));
    }
  });
  return out;
}

}  // namespace detail

// With expert biases b_in "eh" and b_out "em".
template <fixed_string ExpertAxis, sharded_tensor X, sharded_tensor Wt, sharded_tensor I,
          sharded_tensor W1, sharded_tensor B1, sharded_tensor W2, sharded_tensor B2>
auto dropless_experts(const autodiff::variable<X>& x, const autodiff::variable<Wt>& weight,
                      const I& expert_index, const I& slot_index,
                      const autodiff::variable<W1>& w_in, const autodiff::variable<B1>& b_in,
                      const autodiff::variable<W2>& w_out, const autodiff::variable<B2>& b_out,
                      all_to_all_volume* volume = nullptr) {
  constexpr std::size_t axis = detail::axis_index_of<typename X::mesh_type>(view_of<ExpertAxis>);
  if constexpr (!autodiff::detail::check_real_operand<"dropless_experts", X>() ||
                !detail::check_dims<"dropless_experts", X, "gsm">()) {
    return 0;
  } else if constexpr (axis == X::mesh_type::axis_count) {
    (void)dispatch_error::no_expert_axis<ExpertAxis, typename X::mesh_type>{};
    return 0;
  } else if constexpr (!detail::dropless_tokens_ok<ExpertAxis, X>()) {
    (void)dispatch_error::dropless_tokens_layout<ExpertAxis, X>{};
    return 0;
  } else if constexpr (!detail::check_dims<"dropless_experts", Wt, "gsk">() ||
                       !autodiff::detail::check_same_kind<"dropless_experts", X, Wt>() ||
                       !detail::check_indices<"dropless_experts", I>()) {
    return 0;
  } else if constexpr (Wt::layout.any_partial() || Wt::layout.split_count('s') != 0 ||
                       Wt::layout.split_count('k') != 0) {
    (void)dispatch_error::split_tokens<"dropless_experts", Wt>{};
    return 0;
  } else if constexpr (!detail::check_expert_weight<ExpertAxis, W1, "emh">() ||
                       !detail::check_expert_weight<ExpertAxis, W2, "ehm">() ||
                       !detail::check_expert_weight<ExpertAxis, B1, "eh">() ||
                       !detail::check_expert_weight<ExpertAxis, B2, "em">()) {
    return 0;
  } else {
    return detail::dropless<ExpertAxis>(x, weight, expert_index, slot_index, w_in, &b_in, w_out,
                                        &b_out, volume);
  }
}

// Without expert biases.
template <fixed_string ExpertAxis, sharded_tensor X, sharded_tensor Wt, sharded_tensor I,
          sharded_tensor W1, sharded_tensor W2>
auto dropless_experts(const autodiff::variable<X>& x, const autodiff::variable<Wt>& weight,
                      const I& expert_index, const I& slot_index,
                      const autodiff::variable<W1>& w_in, const autodiff::variable<W2>& w_out,
                      all_to_all_volume* volume = nullptr) {
  constexpr std::size_t axis = detail::axis_index_of<typename X::mesh_type>(view_of<ExpertAxis>);
  if constexpr (!autodiff::detail::check_real_operand<"dropless_experts", X>() ||
                !detail::check_dims<"dropless_experts", X, "gsm">()) {
    return 0;
  } else if constexpr (axis == X::mesh_type::axis_count) {
    (void)dispatch_error::no_expert_axis<ExpertAxis, typename X::mesh_type>{};
    return 0;
  } else if constexpr (!detail::dropless_tokens_ok<ExpertAxis, X>()) {
    (void)dispatch_error::dropless_tokens_layout<ExpertAxis, X>{};
    return 0;
  } else if constexpr (!detail::check_dims<"dropless_experts", Wt, "gsk">() ||
                       !autodiff::detail::check_same_kind<"dropless_experts", X, Wt>() ||
                       !detail::check_indices<"dropless_experts", I>()) {
    return 0;
  } else if constexpr (Wt::layout.any_partial() || Wt::layout.split_count('s') != 0 ||
                       Wt::layout.split_count('k') != 0) {
    (void)dispatch_error::split_tokens<"dropless_experts", Wt>{};
    return 0;
  } else if constexpr (!detail::check_expert_weight<ExpertAxis, W1, "emh">() ||
                       !detail::check_expert_weight<ExpertAxis, W2, "ehm">()) {
    return 0;
  } else {
    return detail::dropless<ExpertAxis>(x, weight, expert_index, slot_index, w_in,
                                        static_cast<const autodiff::variable<W1>*>(nullptr), w_out,
                                        static_cast<const autodiff::variable<W2>*>(nullptr),
                                        volume);
  }
}

}  // namespace zest::moe
