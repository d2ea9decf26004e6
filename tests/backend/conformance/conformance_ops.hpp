// The ops of the backend-conformance suite, one line each (conformance.hpp: the harness, the
// inputs of `c` and what the tolerances mean). A new op is one more line in all_ops(): a
// name, its tolerance (`exact`, or {k_float, k_double} in units of epsilon), and the op on
// c's inputs, ending in c.finish(result, the parameters whose gradients to compare).
// op<2>(...) runs on mesh<"dp", "tp"> in each 2-D shape of the world.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/conformance/conformance.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/rope.hpp"
#include "zest/autodiff/shape_ops.hpp"
#include "zest/moe/dispatch.hpp"
#include "zest/moe/dropless.hpp"
#include "zest/moe/gating.hpp"
#include "zest/moe/moe_layer.hpp"

namespace zest::testing::conformance {

// ---------------------------------------------------------------------------------------
// MoE inputs: G = 6 groups (uneven over 4 ranks) of S = 10 tokens, E = 4 experts.

inline constexpr std::size_t moe_groups = 6, moe_tokens = 10, moe_experts = 4;
inline constexpr std::size_t moe_width = 6, moe_choices = 2, moe_capacity = 5;

// Gate logits "gse" split over dp on g, spread so that the top choices differ, no ties.
template <class C>
auto gate_logits(C& c) {
  using T = typename C::value_type;
  using l_t =
      tensor<typename C::value_type, typename C::mesh_type, "gse", layout<split<'g', "dp">>>;
  const std::array<std::size_t, 3> e{moe_groups, moe_tokens, moe_experts};
  const auto g = global_values(e, 23);
  std::vector<T> v(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    v[i] = static_cast<T>(2 * g[i] + 0.01 * static_cast<double>(i % 7));
  }
  return c.tape().parameter(l_t::from_global(c.mesh(), e, std::span<const T>(v)));
}

// The routing of gate_logits under o, its outcome from combine, weight and the losses, with
// the integer outputs and statistics observed.
template <class C>
outcome gating_case(C& c, const moe::gating_options& o) {
  using T = typename C::value_type;
  auto logits = gate_logits(c);
  auto r = moe::gating(logits, o);
  c.observe(r.expert_index);
  c.observe(r.slot_index);
  c.observe(r.dispatch);
  c.observe(r.stats);
  return c.finish(c.mix(r.combine) + c.mix(r.weight) + ad::scale(r.aux_loss, T(0.7)) +
                      ad::scale(r.z_loss, T(-0.3)),
                  logits);
}

// Hand-made routes "gsk" (expert, slot) split over dp on g: second choices another expert
// than the first, dropped slots (-1), and tokens (g = 1, s = 2) and (1, 7) sharing expert 1's
// slot 3.
template <class C>
auto hand_routes(const C& c) {
  using I = tensor<std::int32_t, typename C::mesh_type, "gsk", layout<split<'g', "dp">>>;
  const std::size_t G = moe_groups, S = moe_tokens, E = moe_experts, K = moe_choices;
  std::vector<std::int32_t> expert, slot;
  for (std::size_t g = 0; g < G; ++g) {
    for (std::size_t s = 0; s < S; ++s) {
      const auto e1 = static_cast<std::int32_t>((g * 3 + s * 5) % E);
      expert.push_back(e1);
      expert.push_back(static_cast<std::int32_t>((static_cast<std::size_t>(e1) + 1 + s % 3) % E));
      slot.push_back(static_cast<std::int32_t>((s + g) % (moe_capacity + 1)) - 1);
      slot.push_back(std::max<std::int32_t>(
          static_cast<std::int32_t>((s * 3 + g * 2) % (moe_capacity + 2)) - 2, -1));
    }
  }
  const std::size_t a = (1 * S + 2) * K, b = (1 * S + 7) * K;
  expert[a] = expert[b] = 1;
  slot[a] = slot[b] = 3;
  expert[a + 1] = expert[b + 1] = 2;
  const std::array<std::size_t, 3> e{G, S, K};
  return std::pair{I::from_global(c.mesh(), e, std::span<const std::int32_t>(expert)),
                   I::from_global(c.mesh(), e, std::span<const std::int32_t>(slot))};
}

template <class C>
auto moe_tokens_x(C& c) {
  using x_t =
      tensor<typename C::value_type, typename C::mesh_type, "gsm", layout<split<'g', "dp">>>;
  return c.template param<x_t>({moe_groups, moe_tokens, moe_width}, 24);
}

// combine_by_index of slots y in layout YLayout with the hand routes and a weight variable.
template <class YLayout, class C>
outcome combine_case(C& c) {
  using y_t = tensor<typename C::value_type, typename C::mesh_type, "egcm", YLayout>;
  using w_t =
      tensor<typename C::value_type, typename C::mesh_type, "gsk", layout<split<'g', "dp">>>;
  const auto [ei, si] = hand_routes(c);
  auto y = c.template param<y_t>({moe_experts, moe_groups, moe_capacity, moe_width}, 25);
  auto w = c.template param<w_t>({moe_groups, moe_tokens, moe_choices}, 26);
  return c.finish(moe::combine_by_index(y, w, ei, si), y, w);
}

// The MoE layer's pieces in a row: gating, dispatch, the experts on their ranks (the
// all-to-alls over dp), back, combine.
template <class C>
outcome moe_pipeline_case(C& c) {
  using expert_split = layout<split<'e', "dp">>;
  auto x = moe_tokens_x(c);
  auto logits = gate_logits(c);
  auto r = moe::gating(logits, {.top_k = 2, .capacity_factor = 1.0, .seed = 5, .one_hot = false});
  auto d = moe::dispatch_by_index(x, r.expert_index, r.slot_index, moe_experts, r.capacity);
  auto w_in =
      c.template param<tensor<typename C::value_type, typename C::mesh_type, "emh", expert_split>>(
          {moe_experts, moe_width, 5}, 27);
  auto w_out =
      c.template param<tensor<typename C::value_type, typename C::mesh_type, "ehm", expert_split>>(
          {moe_experts, 5, moe_width}, 28);
  auto h = moe::expert_feed_forward(moe::to_expert_layout<"dp">(d), w_in, w_out);
  auto y = moe::to_token_layout<decltype(d)::tensor_type::layout>(h);
  return c.finish(moe::combine_by_index(y, r.weight, r.expert_index, r.slot_index), x, logits, w_in,
                  w_out);
}

// Dropless experts with biases over dp (every rank both a token and an expert rank): top-3
// gating without capacity, a routing bias, the counts and rows all-to-alls, the per-expert
// GEMMs, combine.
template <class C>
outcome dropless_case(C& c) {
  using T = typename C::value_type;
  using M = typename C::mesh_type;
  using expert_split = layout<split<'e', "dp">>;
  static const std::vector<double> bias{0.05, 0, -0.05, 0.1};
  auto x = moe_tokens_x(c);
  auto logits = gate_logits(c);
  moe::gating_options o{.top_k = 3, .dropless = true, .one_hot = false};
  o.routing_bias = bias;
  auto r = moe::gating(logits, o);
  c.observe(r.slot_index);
  auto w_in = c.template param<tensor<T, M, "emh", expert_split>>({moe_experts, moe_width, 5}, 27);
  auto b_in = c.template param<tensor<T, M, "eh", expert_split>>({moe_experts, 5}, 29);
  auto w_out = c.template param<tensor<T, M, "ehm", expert_split>>({moe_experts, 5, moe_width}, 28);
  auto b_out = c.template param<tensor<T, M, "em", expert_split>>({moe_experts, moe_width}, 30);
  return c.finish(moe::dropless_experts<"dp">(x, r.weight, r.expert_index, r.slot_index, w_in, b_in,
                                              w_out, b_out),
                  x, logits, w_in, b_in, w_out, b_out);
}

// moe_layer under ZeRO 3 (experts over "tp", the engine's gradient collectives): the output,
// the input's gradient and every parameter's reduced gradient.
template <class C>
outcome moe_layer_case(C& c) {
  using T = typename C::value_type;
  using M = typename C::mesh_type;
  using P = training_policy<M, zero_stage<3>>;
  using x_t = tensor<float, M, "btm", layout<split<'b', "dp", "tp">>>;
  if constexpr (!std::is_same_v<T, float>) {
    return {};  // the training policy's parameters are float
  } else {
    zero_engine<P> engine(c.mesh(), {.seed = 5});
    const std::size_t group = engine.begin_group("moe");
    moe::moe_layer<P, "tp"> layer(engine, "moe", 8, 12, 4,
                                  {.top_k = 2, .capacity_factor = 1.0, .seed = 11}, true);
    engine.end_group();
    auto x = c.template param<x_t>({4, 8, 8}, 33);
    auto loss = [&] {
      auto in_scope = engine.use(c.tape(), group);
      auto y = layer(x);
      c.observe(y.value());
      return c.mix(y) + ad::scale(layer.aux_loss(), 0.1F) + ad::scale(layer.z_loss(), 0.01F);
    }();
    engine.backward(loss);
    c.observe(loss.value());
    c.observe(x.grad());
    c.observe(layer.gate().gradient_buffer_tensor());
    c.observe(layer.in_weight().gradient_buffer_tensor());
    c.observe(layer.out_weight().gradient_buffer_tensor());
    c.observe(layer.in_bias().gradient_buffer_tensor());
    c.observe(layer.out_bias().gradient_buffer_tensor());
    c.observe(layer.stats());
    return c.observed();
  }
}

// ---------------------------------------------------------------------------------------
// The table.

// Tolerances used below: the host sums a row with Eigen (vectorised, in another order:
// within an ulp or two); vectorised exp, log, tanh on the host (a few ulp); long sums (the
// device in chunks).
inline constexpr tolerance reordered_sums{4, 4};
inline constexpr tolerance transcendental{16, 16};
inline constexpr tolerance long_sums{256, 64};

inline auto all_ops() {
  using moe::gating_options;
  return std::tuple{
      // Arithmetic on the tape, a pending operand, reductions.
      op("add, sub, scale, multiply (one pending)", exact,
         [](auto& c) {
           auto x = c.x();
           auto y = c.x_other();
           auto w = c.vector_m();
           return c.finish(ad::reduce_sum<"m">(ad::scale(x - y, 1.5F) + x) * w, x, y, w);
         }),
      op("redistribute", exact,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::redistribute<layout<split<'t', "dp">>>(x), x);
         }),
      op("reduce_sum to m (pending over dp)", exact,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::reduce_sum<"m">(x), x);
         }),
      op("reduce_sum over the last dim", reordered_sums,
         [](auto& c) {
           auto x = c.x_split_t();
           return c.finish(ad::reduce_sum<"bt">(ad::reduce_sum<"btm">(x)), x);
         }),
      op("sum", exact,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::sum(x), x);
         }),
      op("mean", exact,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::mean(x), x);
         }),
      op("mean<m>", reordered_sums,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::mean<'m'>(x), x);
         }),
      op("variance<m>", reordered_sums,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::variance<'m'>(x), x);
         }),
      // Element-wise.
      op("exp", transcendental,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::exp(x), x);
         }),
      op("log", transcendental,
         [](auto& c) {
           auto x = c.x_positive();
           return c.finish(ad::log(x), x);
         }),
      op("tanh", transcendental,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::tanh(x), x);
         }),
      op("sigmoid", transcendental,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::sigmoid(x), x);
         }),
      op("silu", transcendental,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::silu(x), x);
         }),
      op("relu", exact,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::relu(x), x);
         }),
      op("sqrt", exact,
         [](auto& c) {
           auto x = c.x_positive();
           return c.finish(ad::sqrt(x), x);
         }),
      op("rsqrt", exact,
         [](auto& c) {
           auto x = c.x_positive();
           return c.finish(ad::rsqrt(x), x);
         }),
      op("abs", exact,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::abs(x), x);
         }),
      op("pow(x, p)", exact,
         [](auto& c) {
           auto x = c.x_positive();
           return c.finish(ad::pow(x, 1.5F), x);
         }),
      op("shift", exact,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::shift(x, 0.25F), x);
         }),
      op("maximum, minimum", exact,
         [](auto& c) {
           auto x = c.x();
           auto y = c.x_other();
           return c.finish(ad::maximum(x, y) + ad::minimum(y, x), x, y);
         }),
      op("where", exact,
         [](auto& c) {
           auto x = c.x();
           auto y = c.x_other();
           return c.finish(ad::where(c.mask_btm(), x, y), x, y);
         }),
      op("gelu", {32, 16},
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::gelu(ad::scale(x, 2.0F)), x);
         }),
      op("dropout", exact,
         [](auto& c) {
           auto x = c.x_split_t();
           return c.finish(ad::dropout(x, 0.3, 1234), x);
         }),
      op<2>("dropout of gelu, 2-D", {32, 16},
            [](auto& c) {
              auto x =
                  c.template param<tensor<typename std::remove_cvref_t<decltype(c)>::value_type,
                                          typename std::remove_cvref_t<decltype(c)>::mesh_type,
                                          "btm", layout<split<'m', "dp">, split<'b', "tp">>>>(
                      {5, 3, 6}, 30);
              return c.finish(ad::dropout(ad::gelu(x), 0.25, 77), x);
            }),
      // Broadcasts.
      op("broadcast_add, broadcast_multiply", reordered_sums,
         [](auto& c) {
           auto x = c.x();
           auto b = c.vector_m();
           auto s = c.matrix_bt();
           return c.finish(ad::broadcast_multiply(ad::broadcast_add(x, b), s), x, b, s);
         }),
      op("broadcast of a split operand", exact,
         [](auto& c) {
           auto x = c.x_split_t();
           auto y = c.matrix_bm_split_m();
           return c.finish(ad::broadcast_add(ad::broadcast_multiply(x, y), y), x, y);
         }),
      op<2>("broadcast_multiply, 2-D", reordered_sums,
            [](auto& c) {
              auto x =
                  c.template param<tensor<typename std::remove_cvref_t<decltype(c)>::value_type,
                                          typename std::remove_cvref_t<decltype(c)>::mesh_type,
                                          "btm", layout<split<'b', "dp">, split<'m', "tp">>>>(
                      {5, 3, 6}, 31);
              auto b = c.vector_m6();
              return c.finish(ad::broadcast_multiply(x, b), x, b);
            }),
      // Row-wise: softmax family, norms.
      op("softmax<m>", transcendental,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::softmax<'m'>(x), x);
         }),
      op("softmax<t>, strided rows", transcendental,
         [](auto& c) {
           auto x = c.x_split_m();
           return c.finish(ad::softmax<'t'>(x), x);
         }),
      op("softmax, a rank without rows", transcendental,
         [](auto& c) {
           auto x = c.x_few_rows();
           auto b = c.vector_m();
           return c.finish(ad::softmax<'m'>(ad::broadcast_add(x, b)), x, b);
         }),
      op("log_softmax<m>", transcendental,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::log_softmax<'m'>(x), x);
         }),
      op<2>("log_softmax<t>, 2-D", transcendental,
            [](auto& c) {
              auto x =
                  c.template param<tensor<typename std::remove_cvref_t<decltype(c)>::value_type,
                                          typename std::remove_cvref_t<decltype(c)>::mesh_type,
                                          "btm", layout<split<'b', "dp">, split<'m', "tp">>>>(
                      {5, 6, 5}, 32, 2.0);
              return c.finish(ad::log_softmax<'t'>(x), x);
            }),
      op("causal_softmax, q split", transcendental,
         [](auto& c) {
           auto x = c.scores();
           return c.finish(ad::causal_softmax<'q', 'k'>(x), x);
         }),
      op("causal_mask then softmax", transcendental,
         [](auto& c) {
           auto x = c.scores();
           return c.finish(ad::softmax<'k'>(ad::causal_mask<'q', 'k'>(x)), x);
         }),
      op("causal_softmax along q, k split", transcendental,
         [](auto& c) {
           auto x = c.scores_split_k();
           return c.finish(ad::causal_softmax<'q', 'k', 'q'>(x), x);
         }),
      op("causal_softmax, strided rows", transcendental,
         [](auto& c) {
           auto x = c.scores_kq();
           return c.finish(ad::causal_softmax<'q', 'k'>(x), x);
         }),
      op("layer_norm<m>", {16, 16},
         [](auto& c) {
           auto x = c.x();
           auto g = c.gamma_split_m();
           auto b = c.gamma_split_m();
           return c.finish(ad::layer_norm<'m'>(x, g, b), x, g, b);
         }),
      op("layer_norm<t>, strided rows", {16, 16},
         [](auto& c) {
           auto x = c.x_split_m();
           auto g = c.vector_t();
           auto b = c.vector_t();
           return c.finish(ad::layer_norm<'t'>(x, g, b), x, g, b);
         }),
      op("rms_norm<m>", {16, 16},
         [](auto& c) {
           auto x = c.x();
           auto g = c.gamma_split_m();
           return c.finish(ad::rms_norm<'m'>(x, g), x, g);
         }),
      op("sums over many rows (two passes)", long_sums,
         [](auto& c) {
           auto x = c.x_many_rows();
           auto b = c.vector_m6();
           auto g = c.vector_m6();
           auto be = c.vector_m6();
           return c.finish(
               ad::reduce_sum<"bt">(ad::layer_norm<'m'>(ad::broadcast_add(x, b), g, be)), x, b, g,
               be);
         }),
      // Lookups and losses.
      op("embedding", exact,
         [](auto& c) {
           auto t = c.table();
           return c.finish(ad::embedding<"btm">(c.ids_bt(), t), t);
         }),
      op("embedding, table split on m", exact,
         [](auto& c) {
           auto t = c.table_split_m();
           return c.finish(ad::embedding<"btm">(c.ids_bt_split_t(), t), t);
         }),
      op("cross_entropy", transcendental,
         [](auto& c) {
           auto l = c.logits();
           return c.finish(ad::cross_entropy<'v'>(l, c.targets()), l);
         }),
      op("cross_entropy, strided rows", transcendental,
         [](auto& c) {
           auto l = c.logits_bvt();
           return c.finish(ad::cross_entropy<'v'>(l, c.targets()), l);
         }),
      // Shape ops.
      op("narrow", exact,
         [](auto& c) {
           auto x = c.x_split_t();
           return c.finish(ad::narrow<'t'>(x, 1, 4), x);
         }),
      op("concat", exact,
         [](auto& c) {
           auto a = c.x();
           auto b = c.x();
           return c.finish(ad::concat<'m'>(a, b), a, b);
         }),
      op("index_select", exact,
         [](auto& c) {
           auto x = c.x_split_t();
           return c.finish(ad::index_select<'t'>(x, c.ids_r()), x);
         }),
      op("merge_dims, split_dim", exact,
         [](auto& c) {
           auto x = c.x_split_t();
           return c.finish(ad::split_dim<"btm">(ad::merge_dims<"bk">(x), 6), x);
         }),
      // The same ops along the other dims of "btm" (first, last; another dim split).
      op("narrow along b (split) and m", exact,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::narrow<'m'>(ad::narrow<'b'>(x, 1, 3), 1, 2), x);
         }),
      op("concat along b (split)", exact,
         [](auto& c) {
           auto a = c.x();
           auto b = c.x();
           return c.finish(ad::concat<'b'>(a, b), a, b);
         }),
      op("index_select along t, m split", exact,
         [](auto& c) {
           auto x = c.x_split_m();
           return c.finish(ad::index_select<'t'>(x, c.ids_r()), x);
         }),
      op<2>("narrow, concat, index_select along t split over dp and tp, 2-D", exact,
            [](auto& c) {
              auto x =
                  c.template param<tensor<typename std::remove_cvref_t<decltype(c)>::value_type,
                                          typename std::remove_cvref_t<decltype(c)>::mesh_type,
                                          "btm", layout<split<'t', "dp", "tp">>>>({3, 7, 4}, 32);
              auto y = ad::concat<'t'>(ad::narrow<'t'>(x, 1, 5), x);
              return c.finish(ad::index_select<'t'>(y, c.ids_r()), x);
            }),
      op<2>("narrow, merge_dims, split_dim with m split and tp partial, 2-D", exact,
            [](auto& c) {
              auto x =
                  c.template param<tensor<typename std::remove_cvref_t<decltype(c)>::value_type,
                                          typename std::remove_cvref_t<decltype(c)>::mesh_type,
                                          "btm", layout<split<'m', "dp">, partial<"tp">>>>(
                      {3, 4, 6}, 33);
              auto y = ad::merge_dims<"bk">(ad::narrow<'m'>(x, 1, 4));
              return c.finish(ad::split_dim<"btm">(y, 4), x);
            }),
      op("rope", transcendental,
         [](auto& c) {
           auto x = c.x();
           return c.finish(ad::rope<'t', 'm'>(x), x);
         }),
      op("rope, positions split", transcendental,
         [](auto& c) {
           auto x = c.x_split_t();
           return c.finish(ad::rope<'t', 'm'>(x, {.base = 100.0, .offset = 3}), x);
         }),
      // Einsum.
      op("einsum btm,mh->bth", {16, 16},
         [](auto& c) {
           auto x = c.x();
           auto w = c.weight_mh();
           return c.finish(ad::einsum<"btm,mh->bth">(x, w), x, w);
         }),
      op("einsum btm->bm", exact,
         [](auto& c) {
           auto x = c.x_split_t();
           return c.finish(ad::einsum<"btm->bm">(x), x);
         }),
      // MoE: gating, the index path, GShard's einsum path, the layer's pieces.
      op("top-2 gating, random routing", exact,
         [](auto& c) { return gating_case(c, {.top_k = 2, .capacity_factor = 1.0, .seed = 7}); }),
      op("top-2 gating, tight capacity", exact,
         [](auto& c) {
           return gating_case(c, {.top_k = 2, .capacity_factor = 0.5, .random_routing = false});
         }),
      op("top-1 gating", exact,
         [](auto& c) { return gating_case(c, {.top_k = 1, .capacity_factor = 1.0, .seed = 3}); }),
      op("gating without one-hot, eval", exact,
         [](auto& c) {
           return gating_case(
               c, {.top_k = 2, .eval_capacity_factor = 0.75, .training = false, .one_hot = false});
         }),
      op("dispatch_by_index", exact,
         [](auto& c) {
           auto x = moe_tokens_x(c);
           const auto [ei, si] = hand_routes(c);
           return c.finish(moe::dispatch_by_index(x, ei, si, moe_experts, moe_capacity), x);
         }),
      op("combine_by_index", exact,
         [](auto& c) { return combine_case<layout<split<'g', "dp">>>(c); }),
      op<2>("combine_by_index, y split on m", exact,
            [](auto& c) { return combine_case<layout<split<'g', "dp">, split<'m', "tp">>>(c); }),
      op("GShard's einsum dispatch and combine", {16, 16},
         [](auto& c) {
           auto x = moe_tokens_x(c);
           auto l = gate_logits(c);
           auto r = moe::gating(l, {.top_k = 2, .seed = 9});
           auto d = ad::einsum<"gsec,gsm->egcm">(c.tape().constant(r.dispatch), x);
           return c.finish(ad::einsum<"gsec,egcm->gsm">(r.combine, d), x, l);
         }),
      op("MoE layer pieces (all-to-all, experts)", {64, 16},
         [](auto& c) { return moe_pipeline_case(c); }),
      op<2>("moe_layer under ZeRO 3 (float)", {64, 16}, [](auto& c) { return moe_layer_case(c); }),
      op("top-3 gating, routing bias, tight capacity", exact,
         [](auto& c) {
           static const std::vector<double> bias{0.1, -0.1, 0, 0.05};
           moe::gating_options o{.top_k = 3, .capacity_factor = 0.5};
           o.routing_bias = bias;
           return gating_case(c, o);
         }),
      op("dropless experts (counts, rows, per-expert GEMMs)", {64, 16},
         [](auto& c) { return dropless_case(c); }),
  };
}

// Faults: the device's message must be the host's.
inline auto all_errors() {
  return std::tuple{
      error("embedding, an id out of range", "embedding: id",
            [](auto& c) {
              using C = std::remove_cvref_t<decltype(c)>;
              auto t = c.table();
              std::vector<std::int32_t> ids{0, 1, 6, 7, 2, 3};
              using i_t = tensor<std::int32_t, typename C::mesh_type, "bt">;
              (void)ad::embedding<"btm">(
                  i_t::from_global(c.mesh(), {2, 3}, std::span<const std::int32_t>(ids)), t);
            }),
      error("cross_entropy, a target out of range", "cross_entropy: target",
            [](auto& c) {
              using C = std::remove_cvref_t<decltype(c)>;
              auto l = c.logits();
              std::vector<std::int32_t> v(15, 1);
              v[11] = -2;
              using i_t = tensor<std::int32_t, typename C::mesh_type, "bt">;
              (void)ad::cross_entropy<'v'>(
                  l, i_t::from_global(c.mesh(), {5, 3}, std::span<const std::int32_t>(v)));
            }),
      error("dispatch_by_index, a slot at the capacity",
            "token (g=5, s=4) choice 1 goes to expert 0, slot 5",
            [](auto& c) {
              using C = std::remove_cvref_t<decltype(c)>;
              using I =
                  tensor<std::int32_t, typename C::mesh_type, "gsk", layout<split<'g', "dp">>>;
              auto [ei, si] = hand_routes(c);
              auto e = to_global(ei);
              auto s = to_global(si);
              const std::size_t at = (5 * moe_tokens + 4) * moe_choices + 1;
              e[at] = 0;
              s[at] = static_cast<std::int32_t>(moe_capacity);
              const auto ext = ei.extents();
              (void)moe::dispatch_by_index(
                  moe_tokens_x(c), I::from_global(c.mesh(), ext, std::span<const std::int32_t>(e)),
                  I::from_global(c.mesh(), ext, std::span<const std::int32_t>(s)), moe_experts,
                  moe_capacity);
            }),
  };
}

}  // namespace zest::testing::conformance
