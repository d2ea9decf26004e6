// zest/nn/block.hpp — a pre-LN transformer block: x + attn(ln1(x)), then + ffn(ln2(x)).
//
// The block is one parameter group of the engine: under ZeRO-3 its parameters arrive in
// one all-gather and leave in one reduce-scatter. The feed-forward sub-layer is an MLP, or,
// with block_options::moe on a mesh that has an "ep" axis, a GShard mixture of experts
// (zest/moe/moe_layer.hpp) whose experts are split over "ep". On a mesh with "tp", attention
// and MLP are Megatron's tensor-parallel layers (zest/nn/tensor_parallel.hpp), and x's layout
// (sequence-parallel or not) is kept from input to output.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "zest/autodiff/checkpoint.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/core/source_site.hpp"
#include "zest/moe/moe_layer.hpp"
#include "zest/nn/attention.hpp"
#include "zest/nn/layer_norm.hpp"
#include "zest/nn/mlp.hpp"
#include "zest/nn/tensor_parallel.hpp"
#include "zest/zero/engine.hpp"

namespace zest {

struct block_options {
  std::size_t width = 128;
  std::size_t heads = 4;
  std::size_t hidden = 512;
  double dropout = 0;
  double residual_std = 0.02;
  // Mixture of experts instead of the MLP (needs a mesh axis named "ep").
  bool moe = false;
  std::size_t experts = 4;
  moe::gating_options gating{};
};

namespace detail {
struct no_expert_layer {};
}  // namespace detail

template <training_policy_type P>
class transformer_block {
 public:
  transformer_block(zero_engine<P>& engine, const std::string& name, const block_options& o)
      : engine_(&engine),
        group_(engine.begin_group(name)),
        ln1_(engine, name + ".ln_1", o.width),
        attn_(engine, name + ".attn", o.width, o.heads, o.residual_std),
        ln2_(engine, name + ".ln_2", o.width),
        dropout_(o.dropout) {
    if (o.moe) {
      if constexpr (P::has_expert_axis) {
        moe_.emplace(engine, name + ".moe", o.width, o.hidden, o.experts, o.gating, true, true,
                     o.residual_std);
      } else {
        throw shape_error(
            detail::message("zest transformer_block '", name,
                            "': a mixture of experts needs a mesh axis named \"ep\""));
      }
    } else {
      mlp_.emplace(engine, name + ".mlp", o.width, o.hidden, o.residual_std);
    }
    engine.end_group();
  }
  transformer_block(const transformer_block&) = delete;
  transformer_block& operator=(const transformer_block&) = delete;

  // `seed` varies per step and block: dropout masks are functions of it.
  template <sharded_tensor X>
  autodiff::variable<X> operator()(autodiff::tape& t, const autodiff::variable<X>& x,
                                   std::uint64_t seed,
                                   source_site at = source_site::current()) const {
    const user_call user(at);
    auto in_scope = engine_->use(t, group_);
    // Under recomputation::full the body is recomputed in backward, after the group's gather.
    auto body = [this, seed](const autodiff::variable<X>& x) {
      auto a = attn_(ln1_(x));
      if (dropout_ > 0) a = autodiff::dropout(a, dropout_, splitmix64(seed));
      auto h = x + a;
      auto f = feed_forward(ln2_(h), seed);
      if (dropout_ > 0) f = autodiff::dropout(f, dropout_, splitmix64(seed + 1));
      return autodiff::variable<X>(h + f);
    };
    return autodiff::checkpoint_if(engine_->recompute() == recomputation::full, body, x);
  }

  std::size_t group() const { return group_; }
  bool is_moe() const {
    if constexpr (P::has_expert_axis) {
      return moe_.has_value();
    } else {
      return false;
    }
  }
  // The expert layer (is_moe() only): its aux loss and statistics of the last forward.
  const auto& expert_layer() const requires P::has_expert_axis { return *moe_; }
  auto& expert_layer() requires P::has_expert_axis { return *moe_; }

 private:
  using mesh_t = typename P::mesh_type;
  using expert_layer_t =
      std::conditional_t<P::has_expert_axis, moe::moe_layer<P>, detail::no_expert_layer>;

  template <sharded_tensor X>
  autodiff::variable<X> feed_forward(const autodiff::variable<X>& x, std::uint64_t seed) const {
    if constexpr (P::has_expert_axis) {
      // The experts see whole sequences on "tp" and "sp" (each of their ranks the same); the
      // result goes back into x's layout (a slice where the stream is split on the sequence:
      // no collective).
      if (moe_) {
        return autodiff::redistribute<layout_like<X>>(
            (*moe_)(autodiff::redistribute<sequence_whole<P, X>>(x), splitmix64(seed + 2)));
      }
    }
    return (*mlp_)(x);
  }

  zero_engine<P>* engine_;
  std::size_t group_;
  layer_norm_layer<P> ln1_;
  causal_self_attention<P> attn_;
  layer_norm_layer<P> ln2_;
  std::optional<mlp<P>> mlp_;
  std::optional<expert_layer_t> moe_;
  double dropout_;
};

}  // namespace zest
