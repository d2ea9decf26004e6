// zest/nn/gpt.hpp — a GPT-style decoder, composed from zest's generic layers.
//
//   using policy = zest::training_policy<zest::mesh<"dp">, zest::zero_stage<3>>;
//   zest::zero_engine<policy> engine(mesh, {.seed = 1});
//   zest::gpt<policy> model(engine, {.vocab = 96, .context = 64, .width = 128, .layers = 4});
//   zest::autodiff::tape t;
//   auto loss = model.loss(t, inputs, targets, step);   // inputs, targets: "bt", split(b:dp)
//
// Parameter groups (one collective each under ZeRO-3): the embeddings, each block, and the
// head (final layer norm and the untied output projection). Dims: b batch, t time, m width,
// v vocabulary, n heads, d head dim, h hidden.
//
// On a mesh with an axis "tp" the model is Megatron's (zest/nn/tensor_parallel.hpp): heads,
// the MLP's hidden dim, the token embedding and the head split over tp, the loss computed on
// vocabulary shards. The residual stream takes the ids' layout: ids split(b:dp) give tensor
// parallelism, ids split(b:dp) split(t:tp) sequence parallelism too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/core/error.hpp"
#include "zest/core/random.hpp"
#include "zest/core/source_site.hpp"
#include "zest/nn/block.hpp"
#include "zest/nn/embedding.hpp"
#include "zest/nn/layer_norm.hpp"
#include "zest/nn/linear.hpp"
#include "zest/nn/tensor_parallel.hpp"
#include "zest/zero/engine.hpp"
#include "zest/zero/planner.hpp"

namespace zest {

struct gpt_options {
  std::size_t vocab = 96;
  std::size_t context = 64;
  std::size_t width = 128;
  std::size_t layers = 4;
  std::size_t heads = 4;
  std::size_t mlp_ratio = 4;
  double dropout = 0;
  // GShard mixture of experts in every `moe_every`-th block (blocks moe_every-1, 2*moe_every-1,
  // ...), experts split over the mesh axis "ep"; the loss adds aux_weight times the mean aux
  // loss of those layers and z_loss_weight times their mean router z-loss.
  bool moe = false;
  std::size_t experts = 4;
  std::size_t moe_every = 2;
  moe::gating_options gating{};
  double aux_weight = 0.01;
  double z_loss_weight = 0;
};

// The parameter list of gpt<P> as the ZeRO planner sees it (zest/zero/planner.hpp), from the
// options alone, in the order the model registers it: with tp = ep = 1, gpt<P>::shape()'s
// list. With tp or ep > 1, the blocks rank 0 holds (the largest where a split is uneven): on
// tp, the heads, the MLP's hidden width and the vocabulary, split as the layers split them
// (zest/nn/tensor_parallel.hpp), the norms, the position table, the row-parallel biases, the
// router and the experts whole; on ep, the experts. What a rank plans before it builds.
inline model_shape gpt_shape(const gpt_options& o, std::size_t tp = 1, std::size_t ep = 1,
                             std::string name = "gpt") {
  if (tp == 0 || ep == 0 || o.heads == 0 || o.width % o.heads != 0) {
    throw shape_error(detail::message("zest: gpt_shape: tp ", tp, ", ep ", ep, ", ", o.heads,
                                      " heads of width ", o.width,
                                      ": tp and ep must be at least 1, and the heads must "
                                      "divide the width"));
  }
  const auto share = [](std::size_t n, std::size_t parts) { return (n + parts - 1) / parts; };
  const std::size_t w = o.width, d = w / o.heads, heads = share(o.heads, tp);
  const std::size_t hidden = o.mlp_ratio * w, vocab = share(o.vocab, tp);
  model_shape m{std::move(name), {}};
  std::string group = "embed";  // the model's groups: the embeddings, each block, the head
  const auto add = [&](std::string n, std::vector<std::size_t> e) {
    m.parameters.push_back({std::move(n), std::move(e), group});
  };
  add("wte", {vocab, w});
  add("wpe", {o.context, w});
  for (std::size_t l = 0; l < o.layers; ++l) {
    const std::string p = detail::message("h", l);
    group = p;
    add(p + ".ln_1.weight", {w});
    add(p + ".ln_1.bias", {w});
    for (const char* qkv : {".attn.q", ".attn.k", ".attn.v"}) {
      add(p + qkv + ".weight", {w, heads, d});
      add(p + qkv + ".bias", {heads, d});
    }
    add(p + ".attn.proj.weight", {heads, d, w});
    add(p + ".attn.proj.bias", {w});
    add(p + ".ln_2.weight", {w});
    add(p + ".ln_2.bias", {w});
    if (o.moe && o.moe_every > 0 && l % o.moe_every == o.moe_every - 1) {
      const std::size_t experts = share(o.experts, ep);
      add(p + ".moe.gate.weight", {w, o.experts});
      add(p + ".moe.experts.fc.weight", {experts, w, hidden});
      add(p + ".moe.experts.proj.weight", {experts, hidden, w});
      add(p + ".moe.experts.fc.bias", {experts, hidden});
      add(p + ".moe.experts.proj.bias", {experts, w});
    } else {
      add(p + ".mlp.fc.weight", {w, share(hidden, tp)});
      add(p + ".mlp.fc.bias", {share(hidden, tp)});
      add(p + ".mlp.proj.weight", {share(hidden, tp), w});
      add(p + ".mlp.proj.bias", {w});
    }
  }
  group = "head";
  add("ln_f.weight", {w});
  add("ln_f.bias", {w});
  add("lm_head.weight", {w, vocab});
  return m;
}

template <training_policy_type P>
class gpt {
  using mesh_t = typename P::mesh_type;

 public:
  gpt(zero_engine<P>& engine, const gpt_options& o)
      : engine_(&engine),
        options_(o),
        embed_group_(engine.begin_group("embed")),
        wte_(engine, "wte", o.vocab, o.width),
        wpe_(engine, "wpe", o.context, o.width, 0.01) {
    engine.end_group();
    block_options b;
    b.width = o.width;
    b.heads = o.heads;
    b.hidden = o.mlp_ratio * o.width;
    b.dropout = o.dropout;
    b.residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(o.layers));
    b.experts = o.experts;
    b.gating = o.gating;
    for (std::size_t l = 0; l < o.layers; ++l) {
      b.moe = o.moe && o.moe_every > 0 && l % o.moe_every == o.moe_every - 1;
      const std::string name = detail::message("h", l);
      blocks_.push_back(std::make_unique<transformer_block<P>>(engine, name, b));
    }
    head_group_ = engine.begin_group("head");
    ln_f_.emplace(engine, "ln_f", o.width);
    lm_head_.emplace(engine, "lm_head", std::array<std::size_t, 2>{o.width, o.vocab});
    engine.end_group();
  }
  gpt(const gpt&) = delete;
  gpt& operator=(const gpt&) = delete;

  const gpt_options& options() const { return options_; }
  zero_engine<P>& engine() const { return *engine_; }

  // Logits "btv" for token ids "bt" (t <= context).
  template <sharded_tensor Ids>
  auto logits(autodiff::tape& t, const Ids& ids, std::uint64_t seed = 0,
              source_site at = source_site::current()) const {
    const user_call user(at);
    const std::size_t time = ids.extent('t');
    if (time == 0 || time > options_.context) {
      throw shape_error(detail::message("zest gpt: sequence length ", time,
                                        " must be between 1 and the context ", options_.context));
    }
    auto x = [&] {
      auto in_scope = engine_->use(t, embed_group_);
      using pos_t = basic_tensor<std::int32_t, mesh_t, "t", replicated_layout(mesh_t::axis_count)>;
      const auto positions = pos_t::generate(
          ids.mesh(), {time}, [](const auto& i) { return static_cast<std::int32_t>(i[0]); });
      // The table is split over the vocabulary on tp: every tp rank looks up all the ids, and
      // the pending rows are reduced into the stream's layout, the ids' own.
      auto tok = autodiff::redistribute<layout_like<Ids>>(
          wte_.template lookup<"btm">(zest::redistribute<tp_region_input<P, Ids>>(ids)));
      auto pos = wpe_.template lookup<"tm">(positions);
      return autodiff::broadcast_add(tok, pos);
    }();
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      x = (*blocks_[l])(t, x, splitmix64(seed ^ (0x100 + l)));
    }
    auto in_scope = engine_->use(t, head_group_);
    return (*lm_head_)(whole_on_tp<P>((*ln_f_)(x)));  // logits split(v:tp)
  }

  // Mean cross-entropy of predicting `targets` from `inputs` (plus the weighted auxiliary
  // losses of the expert layers): a scalar, partial over the axes that split the batch.
  template <sharded_tensor Ids, sharded_tensor Targets>
  auto loss(autodiff::tape& t, const Ids& inputs, const Targets& targets, std::uint64_t seed = 0,
            source_site at = source_site::current()) const {
    const user_call user(at);
    auto nll = autodiff::cross_entropy<'v'>(logits(t, inputs, seed), targets);
    if constexpr (P::has_expert_axis) {
      // In the expert layers' scalar layout, pending on every axis (where the loss is
      // replicated, over tp, a local step: one rank keeps it), so that their losses add.
      using scalar_layout = layout_like<typename moe::moe_layer<P>::scalar_variable>;
      auto total = autodiff::redistribute<scalar_layout>(nll);
      if (options_.moe) {
        last_nll_ = engine_->scalar_value(nll.value());
        const double layers = static_cast<double>(moe_layer_count());
        for (const auto& b : blocks_) {
          if (!b->is_moe()) continue;
          const auto& layer = b->expert_layer();
          if (options_.aux_weight != 0) {
            total = total + autodiff::scale(layer.aux_loss(),
                                            static_cast<float>(options_.aux_weight / layers));
          }
          if (options_.z_loss_weight != 0) {
            total = total + autodiff::scale(layer.z_loss(),
                                            static_cast<float>(options_.z_loss_weight / layers));
          }
        }
      }
      return total;
    } else {
      return nll;
    }
  }

  std::size_t moe_layer_count() const {
    std::size_t n = 0;
    for (const auto& b : blocks_) n += b->is_moe() ? 1 : 0;
    return n;
  }

  // What the expert layers did in the last forward, summed over all ranks (collective).
  struct moe_report {
    double nll = 0;       // the cross-entropy alone
    double aux_loss = 0;  // mean over the expert layers
    double z_loss = 0;
    double dropped_fraction = 0;                   // of all assignments, over all layers
    std::vector<std::int64_t> tokens_per_expert;   // top-1, summed over layers
    std::vector<std::int64_t> load_per_expert;     // routed choices (all k), summed over layers
    std::vector<std::int64_t> dropped_per_expert;  // of those, over capacity
  };
  moe_report last_moe_report() const {
    moe_report r;
    if constexpr (P::has_expert_axis) {
      r.nll = last_nll_;
      const double layers = static_cast<double>(std::max<std::size_t>(moe_layer_count(), 1));
      // Per expert, then dropped, assignments, aux and z: one reduction for all. The aux and
      // z scalars are pending sums on every axis, so each rank adds its part.
      const std::size_t E = options_.experts;
      std::vector<double> counts(3 * E + 4, 0.0);
      for (const auto& b : blocks_) {
        if (!b->is_moe()) continue;
        const auto& layer = b->expert_layer();
        counts[E + 2] += static_cast<double>(layer.aux_loss().value().local_to_host()[0]) / layers;
        counts[E + 3] += static_cast<double>(layer.z_loss().value().local_to_host()[0]) / layers;
        const auto& s = layer.stats();
        for (std::size_t e = 0; e < E; ++e)
          counts[e] += static_cast<double>(s.tokens_per_expert[e]);
        counts[E] += static_cast<double>(s.dropped);
        counts[E + 1] += static_cast<double>(s.assignments);
        for (std::size_t e = 0; e < E; ++e) {
          counts[E + 4 + e] += static_cast<double>(s.routed_per_expert[e]);
          counts[2 * E + 4 + e] += static_cast<double>(s.dropped_per_expert[e]);
        }
      }
      // The batch is split over every axis but tp and sp (each token on one rank of the
      // others, and on every rank of those): a plain sum, the counts divided by those axes'
      // sizes (the aux and z scalars are summands already: one rank of them holds each).
      engine_->mesh().world().all_reduce(std::span<double>(counts), reduce_op::sum);
      double copies = 1;
      for (const std::size_t a : {P::tensor_axis, P::sequence_axis}) {
        if (a < mesh_t::axis_count) copies *= static_cast<double>(engine_->mesh().size(a));
      }
      for (std::size_t i = 0; i < counts.size(); ++i) {
        if (i != E + 2 && i != E + 3) counts[i] /= copies;
      }
      r.tokens_per_expert.resize(E);
      r.load_per_expert.resize(E);
      r.dropped_per_expert.resize(E);
      for (std::size_t e = 0; e < E; ++e) {
        r.tokens_per_expert[e] = std::llround(counts[e]);
        r.load_per_expert[e] = std::llround(counts[E + 4 + e]);
        r.dropped_per_expert[e] = std::llround(counts[2 * E + 4 + e]);
      }
      r.dropped_fraction = counts[E + 1] > 0 ? counts[E] / counts[E + 1] : 0;
      r.aux_loss = counts[E + 2];
      r.z_loss = counts[E + 3];
    }
    return r;
  }

  // Balancing without an auxiliary loss (gating.bias_update_rate > 0): after each step, every
  // expert layer's routing bias moves towards its mean load (moe_layer::update_routing_bias,
  // a collective). The biases are state: routing_biases() to save, set_routing_biases() to
  // restore (one list per expert layer, in block order).
  void update_routing_bias(source_site at = source_site::current()) {
    const user_call user(at);
    if constexpr (P::has_expert_axis) {
      for (auto& b : blocks_)
        if (b->is_moe()) b->expert_layer().update_routing_bias();
    }
  }
  std::vector<std::vector<double>> routing_biases() const {
    std::vector<std::vector<double>> out;
    if constexpr (P::has_expert_axis) {
      for (const auto& b : blocks_)
        if (b->is_moe()) out.push_back(b->expert_layer().routing_bias());
    }
    return out;
  }
  void set_routing_biases(const std::vector<std::vector<double>>& biases) {
    if (biases.size() != moe_layer_count()) {
      throw shape_error(detail::message("zest gpt: set_routing_biases: ", biases.size(),
                                        " lists for ", moe_layer_count(), " expert layers"));
    }
    if constexpr (P::has_expert_axis) {
      std::size_t i = 0;
      for (auto& b : blocks_)
        if (b->is_moe()) b->expert_layer().set_routing_bias(biases[i++]);
    }
  }

  // The parameter list as the planner sees it (zest/zero/planner.hpp); gpt_shape gives the
  // same from the options alone.
  model_shape shape(std::string name = "gpt") const { return shape_of(*engine_, std::move(name)); }

 private:
  zero_engine<P>* engine_;
  gpt_options options_;
  std::size_t embed_group_;
  embedding_layer<P, split_over_tp<P, 'v'>> wte_;
  embedding_layer<P> wpe_;
  std::vector<std::unique_ptr<transformer_block<P>>> blocks_;
  std::size_t head_group_ = 0;
  std::optional<layer_norm_layer<P>> ln_f_;
  std::optional<linear<P, "btm,mv->btv", "mv", "", split_over_tp<P, 'v'>>> lm_head_;
  mutable double last_nll_ = 0;
};

}  // namespace zest
