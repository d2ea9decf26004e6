// zest/moe/gating.hpp — Mixture-of-Experts gating: GShard top-2, Switch top-1, and top-k for
// any k; capacity or dropless; an optional routing bias (balancing without an aux loss).
//
//   auto logits = autodiff::einsum<"gsm,me->gse">(x, w_gate);   // "gse" split(g:dp,ep)
//   auto r = moe::top2_gating(logits, {.capacity_factor = 1.25, .seed = step});
//   // r.dispatch "gsec" 0/1, a constant:     einsum<"gsec,gsm->egcm">(dispatch, x)
//   // r.combine  "gsec" gate weights:        einsum<"gsec,egcm->gsm">(combine, expert_out)
//   // r.expert_index, r.slot_index, r.weight "gsk": the same routing for gather/scatter
//   // loss = nll + aux_weight * r.aux_loss + z_weight * r.z_loss
//
// Tokens come as G groups of S tokens (a group is a sequence); each group routes its tokens
// to E experts on its own, with C slots per expert, so a rank needs whole groups: the logits
// may split g over any axes, never s or e, and must not be partial. Every output keeps the
// logits' split of g.
//
// Types, for logits L = basic_tensor<T, Mesh, "gse", Lg> (T float or double, Lg splits only
// g): gating returns routing<Mesh, Lg, T> (routing_for<L>::type, or routing_of<L>), with
//
//   slot_tensor   = basic_tensor<T, Mesh, "gsec", Lg>
//   index_tensor  = basic_tensor<std::int32_t, Mesh, "gsk", Lg>
//   weight_tensor = basic_tensor<T, Mesh, "gsk", Lg>
//   scalar_tensor = basic_tensor<T, Mesh, "", Ls>, Ls partial on the axes that split g (as
//                   cross_entropy's loss), replicated on the others
//
// and the members
//
//   combine       autodiff::variable<slot_tensor>
//   dispatch      slot_tensor (a plain tensor)
//   expert_index  index_tensor
//   slot_index    index_tensor
//   weight        autodiff::variable<weight_tensor>
//   aux_loss      autodiff::variable<scalar_tensor>
//   z_loss        autodiff::variable<scalar_tensor>
//   stats         routing_stats (this rank's groups)
//   capacity      std::size_t, C
//
// (Lg is a valid layout of "gsec" and "gsk" as it is: it names only the dim g.)
//
// The routing, per group, tokens in s order (GShard, Lepikhin et al. 2020, Algorithm 1):
//   p = softmax_e(logits), in T (fp32 or wider); e1 = argmax p, e2 = argmax of the rest
//   (ties: the larger logit, then the lowest index; with logits far apart p underflows to 0
//   for several experts, and the best of those by logit is the second choice). Top-2: gates
//   g1 = p[e1] / (p[e1] + p[e2]), g2 = p[e2] / (...); top-1 (Switch): g1 = p[e1], not
//   renormalised.
//   C = expert_capacity(S, E, k, training ? capacity_factor : eval_capacity_factor).
//   slot of a first choice = the number of earlier tokens with the same first choice;
//   kept iff slot < C.
//   A second choice is routed iff g2 > 0 and (not (training and random_routing), or
//   u < 2 * g2), where
//     u = (splitmix64(splitmix64(seed) ^ (global_g * S + s)) >> 11) * 2^-53,
//   a pure function of the seed and the global token, whatever the number of ranks. This is
//   decided first: an unrouted second choice takes no slot (a gate of exactly 0, p[e2]
//   underflowed, is never dispatched: only what is combined with a non-zero weight is). The slot of a routed second
//   choice = (first choices of that expert in the group) + (earlier routed second choices to
//   it); kept iff slot < C.
//   A dropped assignment (over capacity, or not routed) has weight 0, slot -1, and no entry
//   in dispatch or combine: only the residual connection carries it. expert_index keeps the
//   choice (e1, e2) even when dropped.
//
//   worked example, S = 6, E = 3, k = 2, C = 2 (capacity_factor 0.5), no random routing:
//     p (rows = tokens)  e1 e2   first slot     second slot
//     .6  .3  .1          0  1    0             c1 + 0 = 1
//     .5  .2  .3          0  2    1             c2 + 0 = 2  dropped
//     .7  .1  .2          0  2    2  dropped    c2 + 1 = 3  dropped
//     .2  .5  .3          1  2    0             4           dropped
//     .1  .4  .5          2  1    0             c1 + 1 = 2  dropped
//     .3  .25 .45         2  0    1             c0 + 0 = 3  dropped
//   (c0, c1, c2 = 3, 1, 2). Had the first token's second choice not been routed, the fifth
//   token's would take slot 1 of expert 1.
//
// Top-k for k > 2 (moe::gating): the k best experts by p in order (ties as above), gates
//   g_j = p[e_j] / (p[e_0] + ... + p[e_k-1]); choice j's slots come after those of every
//   choice < j (first choices, then second, then third, ...); no random routing (GShard's
//   rule is for the second of two), a choice with a gate of exactly 0 is not routed.
// Dropless (options.dropless): C = S, so no routed choice is over capacity (an expert takes at
//   most one choice of each token); the slots are as above.
// Routing bias (options.routing_bias, E values, DeepSeek-V3): the choice ranks experts by
//   p[e] + bias[e] (ties as above); the gates, the losses and their gradients use p alone.
//   Stats: routed_per_expert (the load: routed choices before capacity) and
//   dropped_per_expert (routed, then over capacity) besides the counts above.
//
// Losses, scalars already averaged over all G groups (each rank adds its groups' share):
//   aux_loss = (1/G) sum_g E * sum_e (c_ge / S) * m_ge,  c_ge = first choices of e in group g
//     (constant), m_ge = mean over s of p[e]. This is GShard's (1/E) sum_e (c_e/S) m_e scaled
//     by E^2, and Switch's E * sum_i f_i P_i: 1 exactly at perfect balance (c = S/E, m = 1/E).
//     In the example: 3 * (3/6 * .4 + 1/6 * 1.75/6 + 2/6 * 1.85/6) = 253/240.
//   z_loss = mean over all tokens of logsumexp_e(logits)^2 (router z-loss, ST-MoE); computed
//     always, weighted by the caller (gating_options::z_loss_weight records the choice).
//
// Gradients flow into the logits from combine and weight (through the gates: the derivative
// of the renormalisation, then softmax's), from aux_loss (through m) and from z_loss. Argmaxes,
// counts, slots and random decisions are constants.
//
// Backends: one definition, its loops function objects (zest/moe/detail/route_kernels.hpp)
// that every backend runs through zest::for_each_kernel and sum_kernel, the routing decided
// where the logits live, no round trip of them to the host —
//   one call per token       softmax, logsumexp, e1, e2
//   one call per (g, e)      expert e's slots in group g: its first choices in s order, then
//                            its routed second choices (the random draw of each, a pure
//                            function of the seed and the token), then capacity; the counts
//                            c_ge and the kept assignments (a sequential prefix count, so the
//                            decisions are the same on every backend, without atomics; the
//                            host runs it as one pass per group)
//   one call per assignment  expert_index, slot_index, weight, and combine and dispatch
//   one call per token       backward: the row of d logits
// Only the counts per (g, e) come to the host (the statistics) and the losses' sums.
//
// The parts: what gating takes and returns (zest/moe/routing.hpp), and in zest/moe/detail/
// the checks of the logits (gating_checks.hpp), the rules every token follows
// (routing_rules.hpp) and the loops (route_kernels.hpp); this header is the operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/random.hpp"
#include "zest/moe/detail/gating_checks.hpp"
#include "zest/moe/detail/route_kernels.hpp"
#include "zest/moe/routing.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::moe {

namespace detail {

template <fixed_string Op, sharded_tensor L>
auto route(const autodiff::variable<L>& logits, const gating_options& o, int required_k) {
  const L& lv = logits.value();
  const std::size_t G = lv.extent('g'), S = lv.extent('s'), E = lv.extent('e');
  const int K = o.top_k;
  if (required_k != 0 && K != required_k) {
    throw shape_error(zest::detail::message(
        "zest: ", view_of<Op>, ": options.top_k is ", K, ", this gating routes to ", required_k,
        " expert(s). Fix: set top_k = ", required_k, ", or call moe::gating(logits, options)"));
  }
  if (K < 1) {
    throw shape_error(zest::detail::message("zest: ", view_of<Op>, ": options.top_k is ", K,
                                            "; a token goes to at least 1 expert"));
  }
  if (G == 0 || S == 0 || E < static_cast<std::size_t>(K)) {
    throw shape_error(zest::detail::message(
        "zest: ", view_of<Op>, ": the logits \"gse\" are ", G, " x ", S, " x ", E, "; top-", K,
        " gating needs at least one group and token and ", K, " expert(s)"));
  }
  if (!o.routing_bias.empty() && o.routing_bias.size() != E) {
    throw shape_error(zest::detail::message(
        "zest: ", view_of<Op>, ": options.routing_bias has ", o.routing_bias.size(),
        " values, the logits \"gse\" have e = ", E, " experts; give one bias per expert or none"));
  }
  const double factor = o.training ? o.capacity_factor : o.eval_capacity_factor;
  // Dropless: an expert takes at most one choice of each token of a group, so S slots hold
  // every routed choice.
  const std::size_t C = o.dropless ? S : expert_capacity(S, E, K, factor);
  const bool random = K == 2 && o.training && o.random_routing;
  const auto k = static_cast<std::size_t>(K);
  using T = typename L::value_type;
  using B = typename L::backend_type;
  using mesh_t = typename L::mesh_type;
  using result_t = routing<mesh_t, L::layout, T>;
  using slot_t = typename result_t::slot_tensor;
  using index_t = typename result_t::index_tensor;
  using weight_t = typename result_t::weight_tensor;
  using scalar_t = typename result_t::scalar_tensor;
  const std::size_t local_groups = lv.local_extents()[0];
  const std::size_t n = local_groups * S, cells = local_groups * E;

  auto tape = std::make_shared<routing_tape<T, B>>();
  routing_tape<T, B>& r = *tape;
  r.groups = G;
  r.local_groups = local_groups;
  r.tokens = S;
  r.experts = E;
  r.capacity = C;
  r.k = k;
  r.probs = typename B::template buffer<T>(n * E);
  r.lse = typename B::template buffer<T>(n);
  r.expert = typename B::template buffer<std::int32_t>(n * k);
  r.slot = typename B::template buffer<std::int32_t>(n * k);
  r.first_counts = typename B::template buffer<std::int64_t>(cells);
  typename B::template buffer<std::int64_t> kept_counts(cells), routed_counts(cells);
  std::optional<typename B::template buffer<T>> bias;
  if (!o.routing_bias.empty()) {
    const std::vector<T> values(o.routing_bias.begin(), o.routing_bias.end());
    bias.emplace(B::template from_host<T>(std::span<const T>(values)));
  }

  for_each_kernel<B>(n, route_token<T>{lv.local().data(), r.probs.data(), r.lse.data(),
                                       r.expert.data(), bias ? bias->data() : nullptr, E, k});
  for_each_kernel<B>(
      cells, assign_slots<T>{r.probs.data(), r.expert.data(), r.slot.data(), r.first_counts.data(),
                             kept_counts.data(), routed_counts.data(), S, E, C,
                             lv.local_offsets()[0], k, splitmix64(o.seed), random});

  // The statistics, from the counts per (group, expert).
  routing_stats stats;
  stats.tokens_per_expert.assign(E, 0);
  stats.routed_per_expert.assign(E, 0);
  stats.kept_per_expert.assign(E, 0);
  stats.dropped_per_expert.assign(E, 0);
  stats.tokens = static_cast<std::int64_t>(n);
  stats.assignments = static_cast<std::int64_t>(n * k);
  {
    std::vector<std::int64_t> first(cells), kept(cells), routed(cells);
    B::to_host(std::span<const std::int64_t>(r.first_counts.data(), cells), first.data());
    B::to_host(std::span<const std::int64_t>(kept_counts.data(), cells), kept.data());
    B::to_host(std::span<const std::int64_t>(routed_counts.data(), cells), routed.data());
    std::int64_t kept_total = 0;
    for (std::size_t i = 0; i < cells; ++i) {
      stats.tokens_per_expert[i % E] += first[i];
      stats.routed_per_expert[i % E] += routed[i];
      stats.kept_per_expert[i % E] += kept[i];
      stats.dropped_per_expert[i % E] += routed[i] - kept[i];
      kept_total += kept[i];
    }
    stats.dropped = stats.assignments - kept_total;
  }

  // The routing tensors.
  const mesh_t& mesh = lv.mesh();
  const std::size_t C_dense = o.one_hot ? C : 0;
  slot_t combine(mesh, {G, S, E, C_dense});
  slot_t dispatch(mesh, {G, S, E, C_dense});
  index_t expert_index(mesh, {G, S, k}, index_t::uninitialized);
  index_t slot_index(mesh, {G, S, k}, index_t::uninitialized);
  weight_t weight(mesh, {G, S, k}, weight_t::uninitialized);
  for_each_kernel<B>(
      n * k,
      write_routing<T>{r.probs.data(), r.expert.data(), r.slot.data(), expert_index.local().data(),
                       slot_index.local().data(), weight.local().data(),
                       C_dense != 0 ? combine.local().data() : nullptr,
                       C_dense != 0 ? dispatch.local().data() : nullptr, E, C, k});

  // The losses: this rank's share of the means over all groups and tokens.
  double aux = sum_kernel<B>(cells, aux_term<T>{r.probs.data(), r.first_counts.data(), S, E});
  aux *= static_cast<double>(E) /
         (static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(G));
  double z = sum_kernel<B>(n, squared<T>{r.lse.data()});
  z /= static_cast<double>(G) * static_cast<double>(S);
  scalar_t aux_loss(mesh, {});
  scalar_t z_loss(mesh, {});
  B::fill(aux_loss.local().data(), 1, static_cast<T>(aux));
  B::fill(z_loss.local().data(), 1, static_cast<T>(z));

  autodiff::tape& owner = logits.owner();
  const bool grads = logits.requires_grad();
  auto combine_v = autodiff::detail::make_result(owner, std::move(combine), grads);
  auto weight_v = autodiff::detail::make_result(owner, std::move(weight), grads);
  auto aux_v = autodiff::detail::make_result(owner, std::move(aux_loss), grads);
  auto z_v = autodiff::detail::make_result(owner, std::move(z_loss), grads);
  if (grads) {
    owner.record([ln = logits.node(), cn = combine_v.node(), wn = weight_v.node(),
                  an = aux_v.node(), zn = z_v.node(), tape] {
      if (!cn->grad && !wn->grad && !an->grad && !zn->grad) return;
      const routing_tape<T, B>& r = *tape;
      const std::size_t E = r.experts, S = r.tokens;
      const double G = static_cast<double>(r.groups);
      const T* dcombine = cn->grad && cn->grad->local_count() != 0
                              ? std::as_const(*cn->grad).local().data()
                              : nullptr;
      const T* dweight = wn->grad ? std::as_const(*wn->grad).local().data() : nullptr;
      // The scalars' gradients, one element each, read on the host.
      const double daux = an->grad
                              ? static_cast<double>(std::as_const(*an->grad).local_to_host()[0]) *
                                    static_cast<double>(E) /
                                    (static_cast<double>(S) * static_cast<double>(S) * G)
                              : 0.0;
      const T dz =
          zn->grad
              ? static_cast<T>(static_cast<double>(std::as_const(*zn->grad).local_to_host()[0]) *
                               2.0 / (G * static_cast<double>(S)))
              : T(0);
      autodiff::dual_tensor<L> dx(ln->value.mesh(), ln->value.extents(),
                                  autodiff::dual_tensor<L>::uninitialized);
      for_each_kernel<B>(r.local_groups * S,
                         gating_backward<T>{r.probs.data(), r.lse.data(), r.expert.data(),
                                            r.slot.data(), r.first_counts.data(), dcombine, dweight,
                                            dx.local().data(), daux, dz, S, E, r.capacity, r.k});
      ln->accumulate(std::move(dx));
    });
  }
  return result_t{.combine = std::move(combine_v),
                  .dispatch = std::move(dispatch),
                  .expert_index = std::move(expert_index),
                  .slot_index = std::move(slot_index),
                  .weight = std::move(weight_v),
                  .aux_loss = std::move(aux_v),
                  .z_loss = std::move(z_v),
                  .stats = std::move(stats),
                  .capacity = C};
}

}  // namespace detail

// GShard top-2 gating of "gse" logits (options.top_k must be 2).
template <sharded_tensor L>
auto top2_gating(const autodiff::variable<L>& logits, const gating_options& options) {
  if constexpr (!detail::check_logits<"top2_gating", L>()) {
    return 0;
  } else {
    return detail::route<"top2_gating">(logits, options, 2);
  }
}

// Switch top-1 gating of "gse" logits (options.top_k must be 1): the gate is p[e1] itself.
template <sharded_tensor L>
auto top1_gating(const autodiff::variable<L>& logits, const gating_options& options) {
  if constexpr (!detail::check_logits<"top1_gating", L>()) {
    return 0;
  } else {
    return detail::route<"top1_gating">(logits, options, 1);
  }
}

// Top-k gating for k = options.top_k, 1 <= k <= E: top1_gating for k = 1, top2_gating for
// k = 2, and for k > 2 the same rules with k choices (gates renormalised over them, choice j's
// slots after those of choices < j, no random routing); returns routing_for<L>::type.
template <sharded_tensor L>
auto gating(const autodiff::variable<L>& logits, const gating_options& options) {
  if constexpr (!detail::check_logits<"gating", L>()) {
    return 0;
  } else {
    if (options.top_k == 1) return detail::route<"top1_gating">(logits, options, 1);
    if (options.top_k == 2) return detail::route<"top2_gating">(logits, options, 2);
    return detail::route<"gating">(logits, options, 0);
  }
}

}  // namespace zest::moe
