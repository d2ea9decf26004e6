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
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/core/random.hpp"
#include "zest/nn/block.hpp"
#include "zest/nn/embedding.hpp"
#include "zest/nn/layer_norm.hpp"
#include "zest/nn/linear.hpp"
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
};

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
    for (std::size_t l = 0; l < o.layers; ++l) {
      blocks_.push_back(std::make_unique<transformer_block<P>>(engine, "h" + std::to_string(l), b));
    }
    head_group_ = engine.begin_group("head");
    ln_f_.emplace(engine, "ln_f", o.width);
    lm_head_.emplace(engine, "lm_head", std::array<std::size_t, 2>{o.width, o.vocab});
    engine.end_group();
  }
  gpt(const gpt&) = delete;
  gpt& operator=(const gpt&) = delete;

  const gpt_options& options() const { return options_; }

  // Logits "btv" for token ids "bt" (t <= context).
  template <sharded_tensor Ids>
  auto logits(autodiff::tape& t, const Ids& ids, std::uint64_t seed = 0) const {
    const std::size_t time = ids.extent('t');
    if (time == 0 || time > options_.context) {
      throw shape_error(detail::message("zest gpt: sequence length ", time,
                                        " must be between 1 and the context ", options_.context));
    }
    auto x = [&] {
      auto in_scope = engine_->use(t, embed_group_);
      using pos_t = basic_tensor<std::int32_t, mesh_t, "t", replicated_layout(mesh_t::axis_count)>;
      const auto positions =
          pos_t::generate(ids.mesh(), {time}, [](const auto& i) { return static_cast<std::int32_t>(i[0]); });
      auto tok = wte_.template lookup<"btm">(ids);
      auto pos = wpe_.template lookup<"tm">(positions);
      return autodiff::broadcast_add(tok, pos);
    }();
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      x = (*blocks_[l])(t, x, splitmix64(seed ^ (0x100 + l)));
    }
    auto in_scope = engine_->use(t, head_group_);
    return (*lm_head_)((*ln_f_)(x));
  }

  // Mean cross-entropy of predicting `targets` from `inputs`: a scalar, partial over the
  // data axis (each rank's share of the mean).
  template <sharded_tensor Ids, sharded_tensor Targets>
  auto loss(autodiff::tape& t, const Ids& inputs, const Targets& targets, std::uint64_t seed = 0) const {
    return autodiff::cross_entropy<'v'>(logits(t, inputs, seed), targets);
  }

  // The parameter list as the planner sees it (zest/zero/planner.hpp).
  model_shape shape(std::string name = "gpt") const {
    model_shape m{std::move(name), {}};
    for (const auto* p : engine_->parameters()) {
      m.parameters.push_back({p->name(), p->global_extents()});
    }
    return m;
  }

 private:
  zero_engine<P>* engine_;
  gpt_options options_;
  std::size_t embed_group_;
  embedding_layer<P> wte_, wpe_;
  std::vector<std::unique_ptr<transformer_block<P>>> blocks_;
  std::size_t head_group_ = 0;
  std::optional<layer_norm_layer<P>> ln_f_;
  std::optional<linear<P, "btm,mv->btv", "mv">> lm_head_;
};

}  // namespace zest
