// zest/nn/attention.hpp — multi-head causal self-attention.
//
//   q, k, v = x W_q + b_q, ...          "btm,mnd->btnd"   (n heads of d dims)
//   scores  = q k^T / sqrt(d)           "btnd,bsnd->bnts" (keys relabelled t -> s)
//   p       = causal softmax over s     (s > t masked)
//   out     = p v, then W_o + b_o       "bnts,bsnd->btnd", "btnd,ndm->btm"
//
// q, k, v and the context keep the projections' order "btnd" (heads inside tokens): every
// projection, forward and backward, is then one plain GEMM over all tokens, and the per-head
// products of the core read and write their heads in place (a leading dimension of n d),
// where "bntd" made each projection permute its output, its input gradient and its weight
// gradient's operand.
//
// With activations split over the batch and weights used replicated (ZeRO), every einsum is
// local; the layout rules would insert the collectives of any other placement. On a mesh with
// "tp" the heads are split over it (zest/nn/tensor_parallel.hpp): W_q, W_k, W_v and their
// biases column-parallel, W_o row-parallel, the output reduced into x's layout before W_o's
// bias is added. On a mesh with "sp", Ulysses: q, k and v go from the sequence split to a
// heads split over sp for the attention core, its output back (across_sp). EinsumPolicy is
// the projections' (zest/nn/linear.hpp): no_communication<> guards them.
#pragma once

#include <cmath>
#include <string>

#include "zest/autodiff/checkpoint.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/relabel.hpp"
#include "zest/core/source_site.hpp"
#include "zest/nn/linear.hpp"
#include "zest/nn/tensor_parallel.hpp"
#include "zest/zero/parameter.hpp"

namespace zest {

template <training_policy_type P, einsum_policy EinsumPolicy = gather_weights>
class causal_self_attention {
 public:
  // `residual_std`: the output projection's init (GPT-2 scales it by 1/sqrt(2 layers)).
  causal_self_attention(zero_engine<P>& engine, const std::string& name, std::size_t width,
                        std::size_t heads, double residual_std = 0.02)
      : engine_(&engine),
        heads_(heads),
        head_dim_(check_heads(width, heads)),
        q_(engine, name + ".q", {width, heads, head_dim_}, {heads, head_dim_}),
        k_(engine, name + ".k", {width, heads, head_dim_}, {heads, head_dim_}),
        v_(engine, name + ".v", {width, heads, head_dim_}, {heads, head_dim_}),
        o_(engine, name + ".proj", {heads, head_dim_, width}, {width}, residual_std) {}

  // x "btm"; the result has x's layout.
  template <sharded_tensor X>
  auto operator()(const autodiff::variable<X>& x, source_site at = source_site::current()) const {
    const user_call user(at);
    using T = typename X::value_type;
    const auto whole = whole_on_tp<P>(x);
    // Ulysses (a mesh with "sp"): from the sequence split to a heads split, and back.
    auto q = autodiff::scale(across_sp<P, 't', 'n'>(q_(whole)),
                             static_cast<T>(1.0 / std::sqrt(static_cast<double>(head_dim_))));
    auto k = relabel<"bsnd">(across_sp<P, 't', 'n'>(k_(whole)));
    auto v = relabel<"bsnd">(across_sp<P, 't', 'n'>(v_(whole)));
    // The core, recomputed in backward under recomputation::selective (its b n t s tensors
    // are the largest activations and the cheapest to rebuild).
    auto core = [](const auto& q, const auto& k, const auto& v) {
      auto scores = autodiff::einsum<"btnd,bsnd->bnts">(q, k);
      auto p = autodiff::causal_softmax<'t', 's'>(scores);
      return autodiff::einsum<"bnts,bsnd->btnd">(p, v);
    };
    auto ctx = across_sp<P, 'n', 't'>(
        autodiff::checkpoint_if(engine_->recompute() == recomputation::selective, core, q, k, v));
    return o_.template into<layout_like<X>>(ctx);
  }

  std::size_t heads() const { return heads_; }

 private:
  static std::size_t check_heads(std::size_t width, std::size_t heads) {
    if (heads == 0 || width % heads != 0) {
      throw shape_error(detail::message("zest causal_self_attention: width ", width,
                                        " is not a multiple of the number of heads ", heads));
    }
    return width / heads;
  }

  const zero_engine<P>* engine_;
  std::size_t heads_, head_dim_;
  using heads_split = split_over_tp<P, 'n'>;
  linear<P, "btm,mnd->btnd", "mnd", "nd", heads_split, heads_split, EinsumPolicy> q_, k_, v_;
  linear<P, "btnd,ndm->btm", "ndm", "m", heads_split, layout<>, EinsumPolicy> o_;
};

}  // namespace zest
