// zest/nn/block.hpp — a pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(x)).
//
// The block is one parameter group of the engine: under ZeRO-3 its parameters arrive in
// one all-gather and leave in one reduce-scatter. FeedForward is the second sub-layer
// (mlp by default; the MoE issue swaps in an expert layer).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "zest/autodiff/ops.hpp"
#include "zest/nn/attention.hpp"
#include "zest/nn/layer_norm.hpp"
#include "zest/nn/mlp.hpp"
#include "zest/zero/engine.hpp"

namespace zest {

struct block_options {
  std::size_t width = 128;
  std::size_t heads = 4;
  std::size_t hidden = 512;
  double dropout = 0;
  double residual_std = 0.02;
};

template <training_policy_type P>
class transformer_block {
 public:
  transformer_block(zero_engine<P>& engine, const std::string& name, const block_options& o)
      : engine_(&engine),
        group_(engine.begin_group(name)),
        ln1_(engine, name + ".ln_1", o.width),
        attn_(engine, name + ".attn", o.width, o.heads, o.residual_std),
        ln2_(engine, name + ".ln_2", o.width),
        mlp_(engine, name + ".mlp", o.width, o.hidden, o.residual_std),
        dropout_(o.dropout) {
    engine.end_group();
  }
  transformer_block(const transformer_block&) = delete;
  transformer_block& operator=(const transformer_block&) = delete;

  // `seed` varies per step and block: dropout masks are functions of it.
  template <sharded_tensor X>
  autodiff::variable<X> operator()(autodiff::tape& t, const autodiff::variable<X>& x,
                                   std::uint64_t seed) const {
    auto in_scope = engine_->use(t, group_);
    auto a = attn_(ln1_(x));
    if (dropout_ > 0) a = autodiff::dropout(a, dropout_, splitmix64(seed));
    auto h = x + a;
    auto f = mlp_(ln2_(h));
    if (dropout_ > 0) f = autodiff::dropout(f, dropout_, splitmix64(seed + 1));
    return h + f;
  }

  std::size_t group() const { return group_; }

 private:
  zero_engine<P>* engine_;
  std::size_t group_;
  layer_norm_layer<P> ln1_;
  causal_self_attention<P> attn_;
  layer_norm_layer<P> ln2_;
  mlp<P> mlp_;
  double dropout_;
};

}  // namespace zest
