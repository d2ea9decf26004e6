// zest/moe/gating.hpp — Mixture-of-Experts gating: GShard top-2 and Switch top-1 routing.
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
// Backends. The host backend runs the loops of route_on_host below. Every other backend
// (emulated, CUDA) runs route_generic: function objects handed to Backend::for_each and
// ::sum, the routing decided on the device, no host round trip of the logits —
//   one call per token       softmax, logsumexp, e1, e2
//   one call per (g, e)      expert e's slots in group g: its first choices in s order, then
//                            its routed second choices (the random draw of each, a pure
//                            function of the seed and the token), then capacity; the counts
//                            c_ge and the kept assignments (a sequential prefix count, so the
//                            decisions are the host's exactly, without atomics)
//   one call per assignment  expert_index, slot_index, weight, and combine and dispatch
//   one call per token       backward: the row of d logits
// Only the counts per (g, e) come to the host (the statistics) and the losses' sums.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/config.hpp"
#include "zest/core/device_math.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/random.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::moe {

struct gating_options {
  int top_k = 2;                      // 2: GShard; 1: Switch
  double capacity_factor = 1.25;      // training
  double eval_capacity_factor = 2.0;  // evaluation
  bool training = true;
  bool random_routing = true;  // GShard: route the 2nd expert with probability min(1, 2 * g2)
  double z_loss_weight = 0;    // router z-loss weight (0 = off), applied by the caller
  std::uint64_t seed = 0;      // random routing: u of (seed, global token index)
  // Also build the one-hot "gsec" dispatch and combine tensors (the einsum path). The index
  // path reads only expert_index, slot_index and weight; without them combine and dispatch
  // have capacity extent 0 (they grow as S^2 and are the layer's largest activations).
  bool one_hot = true;
};

// C = ceil(k * S / E * factor), at least 1. Rounding noise in the product (20 * 1.1 =
// 22.000000000000004) does not add a slot.
inline std::size_t expert_capacity(std::size_t tokens_per_group, std::size_t experts, int top_k,
                                   double factor) {
  if (experts == 0 || top_k < 1 || !(factor > 0) || !std::isfinite(factor)) {
    throw shape_error(zest::detail::message(
        "zest: expert_capacity: needs experts >= 1, top_k >= 1 and a finite factor > 0; got E = ",
        experts, ", k = ", top_k, ", factor = ", factor));
  }
  const double exact = static_cast<double>(top_k) * static_cast<double>(tokens_per_group) /
                       static_cast<double>(experts) * factor;
  const double c = std::ceil(exact * (1 - 1e-12));
  return std::max<std::size_t>(1, static_cast<std::size_t>(c));
}

// Counts over this rank's groups; totals over ranks are sums (the caller's business).
struct routing_stats {
  std::vector<std::int64_t> tokens_per_expert;  // first choices per expert (before capacity)
  std::vector<std::int64_t> kept_per_expert;    // assignments kept (all k), after capacity
  std::int64_t tokens = 0;                      // local tokens
  std::int64_t assignments = 0;                 // tokens * top_k
  std::int64_t dropped = 0;  // assignments dropped (over capacity, or 2nd choice not routed)
};

// Dims of the routing tensors: g group, s token, e expert, c slot, k choice.
inline constexpr fixed_string<5> slot_dims{"gsec"};
inline constexpr fixed_string<4> choice_dims{"gsk"};

// The routing of this rank's groups; TokenLayout is the layout of the "gse" logits.
template <class Mesh, layout_key TokenLayout, class T>
struct routing {
  static constexpr layout_value layout = to_layout(TokenLayout);
  static constexpr layout_value scalar_layout = autodiff::detail::scalar_sum_layout(layout);
  using slot_tensor = basic_tensor<T, Mesh, slot_dims, TokenLayout>;                // "gsec"
  using index_tensor = basic_tensor<std::int32_t, Mesh, choice_dims, TokenLayout>;  // "gsk"
  using weight_tensor = basic_tensor<T, Mesh, choice_dims, TokenLayout>;            // "gsk"
  using scalar_tensor = basic_tensor<T, Mesh, autodiff::detail::no_dims, scalar_layout>;

  // Gate weight where token s of group g goes to slot c of expert e, 0 elsewhere.
  autodiff::variable<slot_tensor> combine;
  // 1 where token s of group g goes to slot c of expert e, 0 elsewhere.
  slot_tensor dispatch;
  // The k-th choice of expert, kept or not, and its slot (-1 = dropped).
  index_tensor expert_index;
  index_tensor slot_index;
  // The k-th gate weight (0 = dropped).
  autodiff::variable<weight_tensor> weight;
  autodiff::variable<scalar_tensor> aux_loss;  // 1 at perfect balance
  autodiff::variable<scalar_tensor> z_loss;    // mean of logsumexp(logits)^2
  routing_stats stats;
  std::size_t capacity = 0;
};

// The routing type of logits L (a class: g++ 12 crashes on an alias given a dependent
// class-type argument; routing_of<L> is the alias for code where L is not dependent).
template <sharded_tensor L>
struct routing_for {
  using type = routing<typename L::mesh_type, L::layout, typename L::value_type>;
};
template <sharded_tensor L>
using routing_of = typename routing_for<L>::type;

// ---------------------------------------------------------------------------------------
// Diagnostics: each is instantiated with the operation's name and the logits' type, which
// the compiler prints on the line above the message.

namespace moe_error {
template <class...>
inline constexpr bool always_false = false;
template <fixed_string Operation, class Logits>
struct logits_dims {
  static_assert(always_false<Logits>,
                "zest moe gating: the gate logits have dims \"gse\" (group, token, expert); "
                "these have others (operation and logits shown above). Fix: "
                "autodiff::einsum<\"gsm,me->gse\">(x, w_gate).");
};
template <fixed_string Operation, class Logits>
struct partial_logits {
  static_assert(always_false<Logits>,
                "zest moe gating: the gate logits are a pending sum over a mesh axis (operation "
                "and logits shown above); softmax and top-k need whole values. Fix: reduce "
                "first, e.g. autodiff::redistribute<layout<split<'g', \"dp\">>>(logits).");
};
template <fixed_string Operation, class Logits>
struct split_tokens {
  static_assert(always_false<Logits>,
                "zest moe gating: the gate logits split the token dim s (operation and logits "
                "shown above); slots are counted along s within a group, so a rank needs whole "
                "groups. Fix: split only the group dim, layout<split<'g', \"dp\", \"ep\">>, "
                "e.g. autodiff::redistribute<layout<split<'g', \"dp\">>>(logits).");
};
template <fixed_string Operation, class Logits>
struct split_experts {
  static_assert(always_false<Logits>,
                "zest moe gating: the gate logits split the expert dim e (operation and logits "
                "shown above); softmax and top-k run along e, so a rank needs every expert's "
                "logit. Fix: split only the group dim, layout<split<'g', \"dp\", \"ep\">>, e.g. "
                "autodiff::redistribute<layout<split<'g', \"dp\">>>(logits).");
};
}  // namespace moe_error

namespace detail {

template <fixed_string Op, class L>
constexpr bool check_logits() {
  if constexpr (!autodiff::detail::check_real_operand<Op, L>()) {
    return false;
  } else if constexpr (!(L::dims == fixed_string("gse"))) {
    (void)moe_error::logits_dims<Op, L>{};
    return false;
  } else if constexpr (L::layout.any_partial()) {
    (void)moe_error::partial_logits<Op, L>{};
    return false;
  } else if constexpr (L::layout.split_count('s') != 0) {
    (void)moe_error::split_tokens<Op, L>{};
    return false;
  } else if constexpr (L::layout.split_count('e') != 0) {
    (void)moe_error::split_experts<Op, L>{};
    return false;
  } else {
    return true;
  }
}

// The uniform draw in [0, 1) of random routing for global token index i.
struct routing_draw {
  std::uint64_t key = 0;
  explicit routing_draw(std::uint64_t seed) : key(splitmix64(seed)) {}
  double operator()(std::uint64_t i) const {
    return static_cast<double>(splitmix64(key ^ i) >> 11) * 0x1p-53;
  }
};

// What the backward step needs of the forward, per local token (n = local groups * S).
template <class T>
struct routing_tape {
  std::size_t groups = 0, local_groups = 0, tokens = 0, experts = 0, capacity = 0;
  std::size_t k = 0;
  std::vector<T> probs;                    // [n][E]
  std::vector<T> lse;                      // [n]
  std::vector<std::int32_t> expert;        // [n][k]
  std::vector<std::int32_t> slot;          // [n][k], -1 = dropped
  std::vector<std::int64_t> first_counts;  // [local_groups][E]
};

// Softmax of one row of E logits into p; returns logsumexp. (Every backend: dmath's exp and
// log are std::exp and std::log on the host.)
template <class T>
ZEST_HOST_DEVICE T softmax_row(const T* x, T* p, std::size_t n) {
  T m = x[0];
  for (std::size_t e = 1; e < n; ++e) m = dmath::max(m, x[e]);
  T sum = 0;
  for (std::size_t e = 0; e < n; ++e) sum += (p[e] = dmath::exp(x[e] - m));
  const T inv = T(1) / sum;
  for (std::size_t e = 0; e < n; ++e) p[e] *= inv;
  return m + dmath::log(sum);
}

// The index of the largest p[e], e != skip. Ties (probabilities that underflow to the same
// value, 0 most often, when logits are far apart) go to the larger logit x[e], then to the
// lowest index: p alone would pick the lowest index among experts whose logits differ.
template <class T>
ZEST_HOST_DEVICE std::size_t argmax_except(const T* p, const T* x, std::size_t n,
                                           std::size_t skip) {
  std::size_t best = n;
  for (std::size_t e = 0; e < n; ++e) {
    if (e == skip) continue;
    if (best == n || p[e] > p[best] || (p[e] == p[best] && x[e] > x[best])) best = e;
  }
  return best;
}

// Whether a second choice with gate g2 is routed (takes a slot, if one is free): never with
// a zero gate (it would be dispatched and combined with weight 0: a slot taken for nothing);
// under random routing only when the token's draw u < 2 * g2 (GShard).
ZEST_HOST_DEVICE inline bool routes_second(double g2, bool random, double u) {
  return g2 > 0 && (!random || u < 2 * g2);
}

// The gates of token t (renormalised for k = 2), kept or not.
template <class T>
std::array<T, 2> gates_of(const routing_tape<T>& r, std::size_t t) {
  const T* p = r.probs.data() + t * r.experts;
  const T p1 = p[r.expert[t * r.k]];
  if (r.k == 1) return {p1, T(0)};
  const T p2 = p[r.expert[t * r.k + 1]];
  return {p1 / (p1 + p2), p2 / (p1 + p2)};
}

// The host backend's routing: loops over host memory.
template <int K, sharded_tensor L>
auto route_on_host(const autodiff::variable<L>& logits, const gating_options& o, std::size_t C,
                   bool random) {
  using T = typename L::value_type;
  using mesh_t = typename L::mesh_type;
  using result_t = routing<mesh_t, L::layout, T>;
  using slot_t = typename result_t::slot_tensor;
  using index_t = typename result_t::index_tensor;
  using weight_t = typename result_t::weight_tensor;
  using scalar_t = typename result_t::scalar_tensor;
  const L& lv = logits.value();
  const std::size_t G = lv.extent('g'), S = lv.extent('s'), E = lv.extent('e');
  const routing_draw draw(o.seed);

  auto tape = std::make_shared<routing_tape<T>>();
  routing_tape<T>& r = *tape;
  r.groups = G;
  r.local_groups = lv.local_extents()[0];
  r.tokens = S;
  r.experts = E;
  r.capacity = C;
  r.k = K;
  const std::size_t n = r.local_groups * S;
  const std::size_t first_group = lv.local_offsets()[0];
  r.probs.resize(n * E);
  r.lse.resize(n);
  r.expert.assign(n * K, -1);
  r.slot.assign(n * K, -1);
  r.first_counts.assign(r.local_groups * E, 0);

  routing_stats stats;
  stats.tokens_per_expert.assign(E, 0);
  stats.kept_per_expert.assign(E, 0);
  stats.tokens = static_cast<std::int64_t>(n);
  stats.assignments = static_cast<std::int64_t>(n) * K;

  const T* px = lv.local().data();
  std::vector<std::int64_t> second_counts(E);
  for (std::size_t g = 0; g < r.local_groups; ++g) {
    std::int64_t* first = r.first_counts.data() + g * E;
    // First choices: slots in token order.
    for (std::size_t s = 0; s < S; ++s) {
      const std::size_t t = g * S + s;
      T* p = r.probs.data() + t * E;
      r.lse[t] = softmax_row(px + t * E, p, E);
      const std::size_t e1 = argmax_except(p, px + t * E, E, E);
      r.expert[t * K] = static_cast<std::int32_t>(e1);
      r.slot[t * K] = static_cast<std::int32_t>(first[e1]++);
      if constexpr (K == 2)
        r.expert[t * K + 1] = static_cast<std::int32_t>(argmax_except(p, px + t * E, E, e1));
    }
    // Second choices: the random decision first, then slots after all first choices.
    if constexpr (K == 2) {
      std::fill(second_counts.begin(), second_counts.end(), 0);
      for (std::size_t s = 0; s < S; ++s) {
        const std::size_t t = g * S + s;
        const auto e2 = static_cast<std::size_t>(r.expert[t * K + 1]);
        const bool routed = routes_second(static_cast<double>(gates_of(r, t)[1]), random,
                                          draw((first_group + g) * S + s));
        if (routed) r.slot[t * K + 1] = static_cast<std::int32_t>(first[e2] + second_counts[e2]++);
      }
    }
    for (std::size_t e = 0; e < E; ++e) stats.tokens_per_expert[e] += first[e];
  }
  for (std::size_t a = 0; a < n * K; ++a) {
    if (r.slot[a] >= static_cast<std::int64_t>(C)) r.slot[a] = -1;
    if (r.slot[a] >= 0) ++stats.kept_per_expert[static_cast<std::size_t>(r.expert[a])];
  }
  std::int64_t kept = 0;
  for (auto v : stats.kept_per_expert) kept += v;
  stats.dropped = stats.assignments - kept;

  // The routing tensors.
  const mesh_t& mesh = lv.mesh();
  const std::size_t C_dense = o.one_hot ? C : 0;
  slot_t combine(mesh, {G, S, E, C_dense});
  slot_t dispatch(mesh, {G, S, E, C_dense});
  index_t expert_index(mesh, {G, S, static_cast<std::size_t>(K)}, index_t::uninitialized);
  index_t slot_index(mesh, {G, S, static_cast<std::size_t>(K)}, index_t::uninitialized);
  weight_t weight(mesh, {G, S, static_cast<std::size_t>(K)});
  {
    T* pc = combine.local().data();
    T* pd = dispatch.local().data();
    T* pw = weight.local().data();
    std::copy(r.expert.begin(), r.expert.end(), expert_index.local().begin());
    std::copy(r.slot.begin(), r.slot.end(), slot_index.local().begin());
    for (std::size_t t = 0; t < n; ++t) {
      const std::array<T, 2> gate = gates_of(r, t);
      for (std::size_t j = 0; j < static_cast<std::size_t>(K); ++j) {
        const std::int32_t c = r.slot[t * K + j];
        if (c < 0) continue;
        const std::size_t at = (t * E + static_cast<std::size_t>(r.expert[t * K + j])) * C +
                               static_cast<std::size_t>(c);
        if (C_dense != 0) {
          pc[at] = gate[j];
          pd[at] = T(1);
        }
        pw[t * K + j] = gate[j];
      }
    }
  }

  // The losses: this rank's share of the means over all groups and tokens.
  double aux = 0, z = 0;
  for (std::size_t g = 0; g < r.local_groups; ++g) {
    for (std::size_t e = 0; e < E; ++e) {
      double mean_gate = 0;
      for (std::size_t s = 0; s < S; ++s)
        mean_gate += static_cast<double>(r.probs[(g * S + s) * E + e]);
      aux += static_cast<double>(r.first_counts[g * E + e]) * mean_gate;
    }
  }
  aux *= static_cast<double>(E) /
         (static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(G));
  for (std::size_t t = 0; t < n; ++t)
    z += static_cast<double>(r.lse[t]) * static_cast<double>(r.lse[t]);
  z /= static_cast<double>(G) * static_cast<double>(S);
  scalar_t aux_loss(mesh, {});
  scalar_t z_loss(mesh, {});
  aux_loss.local()[0] = static_cast<T>(aux);
  z_loss.local()[0] = static_cast<T>(z);

  autodiff::tape& owner = logits.owner();
  const bool grads = logits.requires_grad();
  auto combine_v = autodiff::detail::make_result(owner, std::move(combine), grads);
  auto weight_v = autodiff::detail::make_result(owner, std::move(weight), grads);
  auto aux_v = autodiff::detail::make_result(owner, std::move(aux_loss), grads);
  auto z_v = autodiff::detail::make_result(owner, std::move(z_loss), grads);
  if (grads) {
    // One step for all four outputs: they are made here, so every later use of them has run
    // (backward goes in reverse) when this step reads their gradients.
    owner.record([ln = logits.node(), cn = combine_v.node(), wn = weight_v.node(),
                  an = aux_v.node(), zn = z_v.node(), tape] {
      if (!cn->grad && !wn->grad && !an->grad && !zn->grad) return;
      const routing_tape<T>& r = *tape;
      const std::size_t E = r.experts, C = r.capacity, S = r.tokens;
      const std::size_t k = r.k;
      const double G = static_cast<double>(r.groups);
      const T* dcombine = cn->grad && cn->grad->local_count() != 0
                              ? std::as_const(*cn->grad).local().data()
                              : nullptr;
      const T* dweight = wn->grad ? std::as_const(*wn->grad).local().data() : nullptr;
      // d aux / d p[g][s][e] = daux * E * c_ge / (S^2 G);  d z / d x = dz * 2 lse p / (G S).
      const double daux = an->grad ? static_cast<double>(std::as_const(*an->grad).local()[0]) *
                                         static_cast<double>(E) /
                                         (static_cast<double>(S) * static_cast<double>(S) * G)
                                   : 0.0;
      const T dz = zn->grad
                       ? static_cast<T>(static_cast<double>(std::as_const(*zn->grad).local()[0]) *
                                        2.0 / (G * static_cast<double>(S)))
                       : T(0);
      autodiff::dual_tensor<L> dx(ln->value.mesh(), ln->value.extents(),
                                  autodiff::dual_tensor<L>::uninitialized);
      T* pdx = dx.local().data();
      std::vector<T> dp(E);
      const std::size_t n = r.local_groups * S;
      for (std::size_t t = 0; t < n; ++t) {
        const std::size_t g = t / S;
        const T* p = r.probs.data() + t * E;
        for (std::size_t e = 0; e < E; ++e) {
          dp[e] = static_cast<T>(daux * static_cast<double>(r.first_counts[g * E + e]));
        }
        // The gates' gradients: from combine at the kept slot, and from weight.
        std::array<T, 2> dgate{};
        for (std::size_t j = 0; j < k; ++j) {
          const std::int32_t c = r.slot[t * k + j];
          if (c < 0) continue;  // a dropped gate is the constant 0
          const auto e = static_cast<std::size_t>(r.expert[t * k + j]);
          if (dcombine) dgate[j] += dcombine[(t * E + e) * C + static_cast<std::size_t>(c)];
          if (dweight) dgate[j] += dweight[t * k + j];
        }
        const auto e1 = static_cast<std::size_t>(r.expert[t * k]);
        if (k == 1) {
          dp[e1] += dgate[0];
        } else {
          // g1 = p1 / (p1 + p2), g2 = p2 / (p1 + p2): dg1/dp1 = p2/d^2, dg1/dp2 = -p1/d^2.
          const auto e2 = static_cast<std::size_t>(r.expert[t * k + 1]);
          const T p1 = p[e1], p2 = p[e2], d = p1 + p2;
          const T diff = (dgate[0] - dgate[1]) / (d * d);
          dp[e1] += p2 * diff;
          dp[e2] -= p1 * diff;
        }
        // Softmax backward, plus the z-loss term.
        T dot = 0;
        for (std::size_t e = 0; e < E; ++e) dot += p[e] * dp[e];
        const T zt = dz * r.lse[t];
        T* out = pdx + t * E;
        for (std::size_t e = 0; e < E; ++e) out[e] = p[e] * (dp[e] - dot + zt);
      }
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

// ---------------------------------------------------------------------------------------
// The generic path (every backend but the host): function objects for Backend::for_each and
// Backend::sum, each a loop body of route_on_host in the same order of operations, so the
// emulated backend reproduces the host's numbers.

// The uniform draw of random routing for global token index i, key = splitmix64(seed).
ZEST_HOST_DEVICE inline double routing_uniform(std::uint64_t key, std::uint64_t i) {
  return static_cast<double>(splitmix64(key ^ i) >> 11) * 0x1p-53;
}

template <class T>
struct gate_pair {
  T first, second;
};

// The gates of a token from its probabilities and its k choices (renormalised for k = 2).
template <class T>
ZEST_HOST_DEVICE gate_pair<T> gates_at(const T* p, const std::int32_t* choice, std::size_t k) {
  const T p1 = p[choice[0]];
  if (k == 1) return {p1, T(0)};
  const T p2 = p[choice[1]];
  return {p1 / (p1 + p2), p2 / (p1 + p2)};
}

// Token t: its softmax row, logsumexp and choices.
template <class T, int K>
struct route_token {
  const T* logits;
  T* probs;
  T* lse;
  std::int32_t* expert;
  std::size_t experts;
  ZEST_HOST_DEVICE void operator()(std::size_t t) const {
    T* p = probs + t * experts;
    lse[t] = softmax_row(logits + t * experts, p, experts);
    const T* x = logits + t * experts;
    const std::size_t e1 = argmax_except(p, x, experts, experts);
    expert[t * K] = static_cast<std::int32_t>(e1);
    if constexpr (K == 2) {
      expert[t * K + 1] = static_cast<std::int32_t>(argmax_except(p, x, experts, e1));
    }
  }
};

// Call i = g * E + e: expert e's slots in group g. Its first choices in s order; then its
// second choices in s order, each routed or not by its draw, a routed one taking the next
// slot after all first choices; then capacity. A sequential count per (g, e), so the slots
// are the host's exactly; every assignment belongs to one expert, so to one call.
template <class T, int K>
struct assign_slots {
  const T* probs;
  const std::int32_t* expert;
  std::int32_t* slot;
  std::int64_t* first_counts;  // [G_l][E]
  std::int64_t* kept_counts;   // [G_l][E]
  std::size_t tokens, experts, capacity, first_group;
  std::uint64_t key;
  bool random;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t g = i / experts;
    const auto e = static_cast<std::int32_t>(i % experts);
    const std::size_t t0 = g * tokens, t1 = t0 + tokens;
    std::int64_t first = 0;
    for (std::size_t t = t0; t < t1; ++t) {
      if (expert[t * K] == e) slot[t * K] = static_cast<std::int32_t>(first++);
    }
    first_counts[i] = first;
    if constexpr (K == 2) {
      std::int64_t second = 0;
      for (std::size_t t = t0; t < t1; ++t) {
        if (expert[t * K + 1] != e) continue;
        const T g2 = gates_at(probs + t * experts, expert + t * K, K).second;
        const std::uint64_t token = (first_group + g) * tokens + (t - t0);
        const bool routed =
            routes_second(static_cast<double>(g2), random, routing_uniform(key, token));
        slot[t * K + 1] = routed ? static_cast<std::int32_t>(first + second++) : -1;
      }
    }
    std::int64_t kept = 0;
    for (std::size_t a = t0 * K; a < t1 * K; ++a) {
      if (expert[a] != e) continue;
      if (slot[a] >= static_cast<std::int64_t>(capacity)) slot[a] = -1;
      if (slot[a] >= 0) ++kept;
    }
    kept_counts[i] = kept;
  }
};

// Assignment a = t * K + j: the index tensors, the weight, and (combine non-null) the
// one-hot entries, distinct for distinct kept assignments.
template <class T, int K>
struct write_routing {
  const T* probs;
  const std::int32_t* expert;
  const std::int32_t* slot;
  std::int32_t* expert_index;
  std::int32_t* slot_index;
  T* weight;
  T* combine;   // [n][E][C], or null
  T* dispatch;  // as combine
  std::size_t experts, capacity;
  ZEST_HOST_DEVICE void operator()(std::size_t a) const {
    const std::size_t t = a / K, j = a % K;
    const std::int32_t c = slot[a];
    expert_index[a] = expert[a];
    slot_index[a] = c;
    if (c < 0) {
      weight[a] = T(0);
      return;
    }
    const gate_pair<T> gate = gates_at(probs + t * experts, expert + t * K, K);
    const T w = j == 0 ? gate.first : gate.second;
    weight[a] = w;
    if (combine != nullptr) {
      const std::size_t at = (t * experts + static_cast<std::size_t>(expert[a])) * capacity +
                             static_cast<std::size_t>(c);
      combine[at] = w;
      dispatch[at] = T(1);
    }
  }
};

// Call i = g * E + e: c_ge * sum_s p[g][s][e] (the host's order: s, then g and e).
template <class T>
struct aux_term {
  const T* probs;
  const std::int64_t* first_counts;
  std::size_t tokens, experts;
  ZEST_HOST_DEVICE double operator()(std::size_t i) const {
    const std::size_t g = i / experts, e = i % experts;
    double mean_gate = 0;
    for (std::size_t s = 0; s < tokens; ++s)
      mean_gate += static_cast<double>(probs[(g * tokens + s) * experts + e]);
    return static_cast<double>(first_counts[i]) * mean_gate;
  }
};

template <class T>
struct squared {
  const T* values;
  ZEST_HOST_DEVICE double operator()(std::size_t i) const {
    return static_cast<double>(values[i]) * static_cast<double>(values[i]);
  }
};

// Token t's row of d logits: the gates' gradients (combine at the kept slot, weight), the
// renormalisation's and softmax's derivatives, aux and z terms — route_on_host's backward
// without its scratch row: dp(e) is recomputed where it is used.
template <class T>
struct gating_backward {
  const T* probs;
  const T* lse;
  const std::int32_t* expert;
  const std::int32_t* slot;
  const std::int64_t* first_counts;
  const T* dcombine;  // or null
  const T* dweight;   // or null
  T* dx;
  double daux;
  T dz;
  std::size_t tokens, experts, capacity, k;
  ZEST_HOST_DEVICE void operator()(std::size_t t) const {
    const std::size_t E = experts;
    const T* p = probs + t * E;
    const std::int64_t* counts = first_counts + (t / tokens) * E;
    T dgate[2] = {T(0), T(0)};
    for (std::size_t j = 0; j < k; ++j) {
      const std::int32_t c = slot[t * k + j];
      if (c < 0) continue;  // a dropped gate is the constant 0
      const auto e = static_cast<std::size_t>(expert[t * k + j]);
      if (dcombine != nullptr) {
        dgate[j] += dcombine[(t * E + e) * capacity + static_cast<std::size_t>(c)];
      }
      if (dweight != nullptr) dgate[j] += dweight[t * k + j];
    }
    const auto e1 = static_cast<std::size_t>(expert[t * k]);
    std::size_t e2 = E;
    T add1 = dgate[0], sub2 = T(0);
    if (k == 2) {
      // g1 = p1 / (p1 + p2), g2 = p2 / (p1 + p2): dg1/dp1 = p2/d^2, dg1/dp2 = -p1/d^2.
      e2 = static_cast<std::size_t>(expert[t * k + 1]);
      const T p1 = p[e1], p2 = p[e2], d = p1 + p2;
      const T diff = (dgate[0] - dgate[1]) / (d * d);
      add1 = p2 * diff;
      sub2 = p1 * diff;
    }
    T dot = 0;
    for (std::size_t e = 0; e < E; ++e) dot += p[e] * dp(counts, e, e1, e2, add1, sub2);
    const T zt = dz * lse[t];
    T* out = dx + t * E;
    for (std::size_t e = 0; e < E; ++e) {
      out[e] = p[e] * (dp(counts, e, e1, e2, add1, sub2) - dot + zt);
    }
  }
  ZEST_HOST_DEVICE T dp(const std::int64_t* counts, std::size_t e, std::size_t e1, std::size_t e2,
                        T add1, T sub2) const {
    T v = static_cast<T>(daux * static_cast<double>(counts[e]));
    if (e == e1) v += add1;
    if (e == e2) v -= sub2;
    return v;
  }
};

// What the backward step needs of the forward, in the backend's memory.
template <class T, class B>
struct device_routing_tape {
  std::size_t groups = 0, local_groups = 0, tokens = 0, experts = 0, capacity = 0, k = 0;
  typename B::template buffer<T> probs;                    // [n][E]
  typename B::template buffer<T> lse;                      // [n]
  typename B::template buffer<std::int32_t> expert;        // [n][k]
  typename B::template buffer<std::int32_t> slot;          // [n][k], -1 = dropped
  typename B::template buffer<std::int64_t> first_counts;  // [local_groups][E]
};

// The routing on any backend but the host: decided on the device (see the top of this file);
// the counts per (group, expert) come to the host for the statistics.
template <int K, sharded_tensor L>
auto route_generic(const autodiff::variable<L>& logits, const gating_options& o, std::size_t C,
                   bool random) {
  using T = typename L::value_type;
  using B = typename L::backend_type;
  using mesh_t = typename L::mesh_type;
  using result_t = routing<mesh_t, L::layout, T>;
  using slot_t = typename result_t::slot_tensor;
  using index_t = typename result_t::index_tensor;
  using weight_t = typename result_t::weight_tensor;
  using scalar_t = typename result_t::scalar_tensor;
  const L& lv = logits.value();
  const std::size_t G = lv.extent('g'), S = lv.extent('s'), E = lv.extent('e');
  const std::size_t local_groups = lv.local_extents()[0];
  const std::size_t n = local_groups * S, cells = local_groups * E;

  auto tape = std::make_shared<device_routing_tape<T, B>>();
  device_routing_tape<T, B>& r = *tape;
  r.groups = G;
  r.local_groups = local_groups;
  r.tokens = S;
  r.experts = E;
  r.capacity = C;
  r.k = K;
  r.probs = typename B::template buffer<T>(n * E);
  r.lse = typename B::template buffer<T>(n);
  r.expert = typename B::template buffer<std::int32_t>(n * K);
  r.slot = typename B::template buffer<std::int32_t>(n * K);
  r.first_counts = typename B::template buffer<std::int64_t>(cells);
  typename B::template buffer<std::int64_t> kept_counts(cells);

  B::for_each(
      n, route_token<T, K>{lv.local().data(), r.probs.data(), r.lse.data(), r.expert.data(), E});
  B::for_each(cells, assign_slots<T, K>{r.probs.data(), r.expert.data(), r.slot.data(),
                                        r.first_counts.data(), kept_counts.data(), S, E, C,
                                        lv.local_offsets()[0], splitmix64(o.seed), random});

  // The statistics, from the counts per (group, expert).
  routing_stats stats;
  stats.tokens_per_expert.assign(E, 0);
  stats.kept_per_expert.assign(E, 0);
  stats.tokens = static_cast<std::int64_t>(n);
  stats.assignments = static_cast<std::int64_t>(n) * K;
  {
    std::vector<std::int64_t> first(cells), kept(cells);
    B::to_host(std::span<const std::int64_t>(r.first_counts.data(), cells), first.data());
    B::to_host(std::span<const std::int64_t>(kept_counts.data(), cells), kept.data());
    std::int64_t kept_total = 0;
    for (std::size_t i = 0; i < cells; ++i) {
      stats.tokens_per_expert[i % E] += first[i];
      stats.kept_per_expert[i % E] += kept[i];
      kept_total += kept[i];
    }
    stats.dropped = stats.assignments - kept_total;
  }

  // The routing tensors.
  const mesh_t& mesh = lv.mesh();
  const std::size_t C_dense = o.one_hot ? C : 0;
  slot_t combine(mesh, {G, S, E, C_dense});
  slot_t dispatch(mesh, {G, S, E, C_dense});
  index_t expert_index(mesh, {G, S, static_cast<std::size_t>(K)}, index_t::uninitialized);
  index_t slot_index(mesh, {G, S, static_cast<std::size_t>(K)}, index_t::uninitialized);
  weight_t weight(mesh, {G, S, static_cast<std::size_t>(K)}, weight_t::uninitialized);
  B::for_each(n * K, write_routing<T, K>{r.probs.data(), r.expert.data(), r.slot.data(),
                                         expert_index.local().data(), slot_index.local().data(),
                                         weight.local().data(),
                                         C_dense != 0 ? combine.local().data() : nullptr,
                                         C_dense != 0 ? dispatch.local().data() : nullptr, E, C});

  // The losses: this rank's share of the means over all groups and tokens.
  double aux = B::sum(cells, aux_term<T>{r.probs.data(), r.first_counts.data(), S, E});
  aux *= static_cast<double>(E) /
         (static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(G));
  double z = B::sum(n, squared<T>{r.lse.data()});
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
      const device_routing_tape<T, B>& r = *tape;
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
      B::for_each(r.local_groups * S,
                  gating_backward<T>{r.probs.data(), r.lse.data(), r.expert.data(), r.slot.data(),
                                     r.first_counts.data(), dcombine, dweight, dx.local().data(),
                                     daux, dz, S, E, r.capacity, r.k});
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

template <int K, fixed_string Op, sharded_tensor L>
auto route(const autodiff::variable<L>& logits, const gating_options& o) {
  const L& lv = logits.value();
  const std::size_t G = lv.extent('g'), S = lv.extent('s'), E = lv.extent('e');
  if (o.top_k != K) {
    throw shape_error(zest::detail::message(
        "zest: ", view_of<Op>, ": options.top_k is ", o.top_k, ", this gating routes to ", K,
        " expert(s). Fix: set top_k = ", K, ", or call moe::gating(logits, options)"));
  }
  if (G == 0 || S == 0 || E < static_cast<std::size_t>(K)) {
    throw shape_error(zest::detail::message(
        "zest: ", view_of<Op>, ": the logits \"gse\" are ", G, " x ", S, " x ", E, "; top-", K,
        " gating needs at least one group and token and ", K, " expert(s)"));
  }
  const double factor = o.training ? o.capacity_factor : o.eval_capacity_factor;
  const std::size_t C = expert_capacity(S, E, K, factor);
  const bool random = K == 2 && o.training && o.random_routing;
  if constexpr (autodiff::detail::on_host<L>) {
    return route_on_host<K>(logits, o, C, random);
  } else {
    return route_generic<K>(logits, o, C, random);
  }
}

}  // namespace detail

// GShard top-2 gating of "gse" logits (options.top_k must be 2).
template <sharded_tensor L>
auto top2_gating(const autodiff::variable<L>& logits, const gating_options& options) {
  if constexpr (!detail::check_logits<"top2_gating", L>()) {
    return 0;
  } else {
    return detail::route<2, "top2_gating">(logits, options);
  }
}

// Switch top-1 gating of "gse" logits (options.top_k must be 1): the gate is p[e1] itself.
template <sharded_tensor L>
auto top1_gating(const autodiff::variable<L>& logits, const gating_options& options) {
  if constexpr (!detail::check_logits<"top1_gating", L>()) {
    return 0;
  } else {
    return detail::route<1, "top1_gating">(logits, options);
  }
}

// top1_gating or top2_gating as options.top_k says; both return routing_for<L>::type.
template <sharded_tensor L>
auto gating(const autodiff::variable<L>& logits, const gating_options& options) {
  if constexpr (!detail::check_logits<"gating", L>()) {
    return 0;
  } else {
    if (options.top_k == 1) return detail::route<1, "top1_gating">(logits, options);
    if (options.top_k != 2) {
      throw shape_error(zest::detail::message("zest: gating: options.top_k is ", options.top_k,
                                              "; GShard routes to 2 experts, Switch to 1"));
    }
    return detail::route<2, "top2_gating">(logits, options);
  }
}

}  // namespace zest::moe
