// llama.hpp — a Llama-style decoder built from zest's public parts only: RMSNorm, a SwiGLU
// feed-forward layer, rotary position embeddings (RoPE) and grouped-query attention, with
// no biases anywhere and the output head tied to the token embedding or not. train_gpt
// trains it with --arch llama (examples/train_gpt_llama.hpp); tests/train checks it against
// plain loops and N ranks against one.
//
//   using policy = zest::training_policy<zest::mesh<"dp">, zest::zero_stage<3>>;
//   zest::zero_engine<policy> engine(mesh, {.seed = 1});
//   llama_example::llama<policy> model(engine, {.vocab = 96, .context = 64, .width = 128,
//                                               .heads = 4, .kv_heads = 2});
//   auto loss = model.loss(t, inputs, targets, step);   // inputs, targets: "bt", split(b:dp)
//
// One block, x "btm" (b batch, t time, m width):
//
//   h = x + W_o attn(rope(W_q n), rope(W_k n), W_v n),  n = rms_norm(x) g_1
//   y = h + W_down (silu(W_gate n') * W_up n'),          n' = rms_norm(h) g_2
//
// Grouped-query attention with k key/value heads, each shared by g = heads / k query heads
// (query head k * g + j reads kv head k, as Llama's repeat_kv does), head dim d:
//
//   q = n W_q   "btm,mkgd->bkgtd"    k = n W_k   "btm,mkd->bktd"  (then t -> s)
//   v = n W_v   "btm,mkd->bktd"      (then t -> s, d -> e)
//   out = softmax(q k^T / sqrt(d), causal) v   "bkgtd,bksd,bkse->bkgte"
//   W_o         "bkgte,kgem->btm"
//
// The weights are zest::linear layers without a bias dim; ZeRO stores, gathers and reduces
// them like any parameter. On a mesh with an axis "tp" the model is tensor-parallel as
// zest::gpt is (zest/nn/tensor_parallel.hpp): the key/value heads k (and their query heads)
// and SwiGLU's hidden dim split over tp, W_o and W_down reduced into the stream's layout, the
// embedding, the head and the loss split over the vocabulary; ids split(t:tp) make the
// stream sequence-parallel. On a mesh with "sp" the attention is Ulysses' (ids split(t:sp)). Parameter groups (one collective each under ZeRO-3): the token
// embedding, each block, and the head (final norm and lm_head). With a tied head the table
// is also the output projection: embedding, final norm and head are one group, in scope for
// the whole forward (under ZeRO-3 it stays gathered beside the block computing, as a tied
// weight must in FSDP's root unit too).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "zest/autodiff/attention.hpp"
#include "zest/autodiff/checkpoint.hpp"
#include "zest/autodiff/elementwise.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/relabel.hpp"
#include "zest/autodiff/rope.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/core/error.hpp"
#include "zest/core/random.hpp"
#include "zest/io/safetensors.hpp"
#include "zest/nn/embedding.hpp"
#include "zest/nn/linear.hpp"
#include "zest/nn/tensor_parallel.hpp"
#include "zest/tensor/tensor.hpp"
#include "zest/zero/engine.hpp"
#include "zest/zero/parameter.hpp"
#include "zest/zero/planner.hpp"

namespace llama_example {

struct llama_options {
  std::size_t vocab = 96;
  std::size_t context = 64;
  std::size_t width = 128;
  std::size_t layers = 4;
  std::size_t heads = 4;
  std::size_t kv_heads = 2;  // divides heads; heads: multi-head attention, 1: multi-query
  std::size_t hidden = 0;    // SwiGLU's hidden width; 0: default_hidden(width)
  bool tied_head = false;
  double rope_base = 10000.0;
  double norm_eps = 1e-5;
  double dropout = 0;
};

// Llama's SwiGLU width: 2/3 of the 4 x width a GELU MLP has (the same parameter count with
// three matrices instead of two), rounded up to a multiple of 32. Width 128 -> 352.
inline std::size_t default_hidden(std::size_t width) {
  const std::size_t h = (8 * width + 2) / 3;
  return (h + 31) / 32 * 32;
}

// A message from its parts, as an ostream writes them.
template <class... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// The options with their defaults resolved, or a zest::shape_error naming the one at fault.
inline llama_options checked(llama_options o) {
  if (o.hidden == 0) o.hidden = default_hidden(o.width);
  if (o.heads == 0 || o.width % o.heads != 0)
    throw zest::shape_error(
        message("llama: width ", o.width, " is not a multiple of the number of heads ", o.heads));
  if (o.kv_heads == 0 || o.heads % o.kv_heads != 0)
    throw zest::shape_error(
        message("llama: ", o.kv_heads, " key/value heads do not divide ", o.heads, " heads"));
  if ((o.width / o.heads) % 2 != 0)
    throw zest::shape_error(message("llama: the head dim ", o.width / o.heads,
                                    " (width / heads) is odd; RoPE rotates pairs of dims"));
  if (!(o.rope_base > 0) || !std::isfinite(o.rope_base))
    throw zest::shape_error(message("llama: the RoPE base ", o.rope_base, " is not positive"));
  return o;
}

// The parameter list of the model as the ZeRO planner sees it (zest/zero/planner.hpp), from
// the options alone: what train_gpt plans before it builds anything. The names and extents
// are those the model registers (llama<P>::shape() returns the same list). With tp > 1, the
// blocks of one rank of tp (rank 0, the largest where a split is uneven): the kv heads, the
// SwiGLU's hidden width and the vocabulary split, the norms whole.
inline zest::model_shape llama_shape(const llama_options& options, std::size_t tp = 1,
                                     std::string name = "llama") {
  const llama_options o = checked(options);
  if (tp == 0) throw zest::shape_error("llama: llama_shape: tp must be at least 1");
  const auto share = [&](std::size_t n) { return (n + tp - 1) / tp; };
  const std::size_t w = o.width, d = o.width / o.heads, k = share(o.kv_heads),
                    g = o.heads / o.kv_heads;
  zest::model_shape m{std::move(name), {}};
  std::string group = o.tied_head ? "embed_head" : "embed";  // as the model's groups
  const auto add = [&](std::string n, std::vector<std::size_t> e) {
    m.parameters.push_back({std::move(n), std::move(e), group});
  };
  const std::size_t hidden = share(o.hidden), vocab = share(o.vocab);
  add("wte", {vocab, w});
  if (o.tied_head) add("norm_f.weight", {w});
  for (std::size_t l = 0; l < o.layers; ++l) {
    std::string p = "h";  // appended: g++ 12 warns falsely (-Wrestrict) on "h" + ...
    p += std::to_string(l);
    group = p;
    add(p + ".attn_norm.weight", {w});
    add(p + ".attn.q.weight", {w, k, g, d});
    add(p + ".attn.k.weight", {w, k, d});
    add(p + ".attn.v.weight", {w, k, d});
    add(p + ".attn.o.weight", {k, g, d, w});
    add(p + ".mlp_norm.weight", {w});
    add(p + ".mlp.gate.weight", {w, hidden});
    add(p + ".mlp.up.weight", {w, hidden});
    add(p + ".mlp.down.weight", {hidden, w});
  }
  if (!o.tied_head) {
    group = "head";
    add("norm_f.weight", {w});
    add("lm_head.weight", {w, vocab});
  }
  return m;
}

// Where the model's parameters lie in a Hugging Face Llama file (LlamaForCausalLM's names,
// PyTorch's nn.Linear [out, in] weights: each zest matrix transposed), and its config.json.
// q_proj's rows are the query heads in order, head k * g + j being zest's (k, j); RoPE is
// the same rotate-half convention on both sides, so no rows move. A tied model's file has no
// lm_head.weight; an untied model reads a tied file's embedding in its place.
inline zest::io::weight_map hf_llama_weights(const llama_options& options) {
  const llama_options o = checked(options);
  const std::size_t w = o.width, heads = o.heads, k = o.kv_heads, g = heads / k, d = w / heads,
                    hidden = o.hidden;
  namespace io = zest::io;
  io::weight_map m;
  m.convention = "Hugging Face Llama (LlamaForCausalLM)";
  m.optional_prefix = "model.";
  m.ignored_suffixes = {"rotary_emb.inv_freq"};  // older files' RoPE buffers
  auto embed = io::whole_tensor("model.embed_tokens.weight", "wte", {o.vocab, w});
  if (!o.tied_head) embed.parts.push_back({"lm_head.weight", 0, {1, w}, true});
  m.tensors.push_back(std::move(embed));
  for (std::size_t l = 0; l < o.layers; ++l) {
    const std::string z = message("h", l, "."), f = message("model.layers.", l, ".");
    m.tensors.push_back(
        io::whole_tensor(f + "input_layernorm.weight", z + "attn_norm.weight", {w}));
    // zest "m k g d" -> rows (k g + j) d + e, columns m.
    io::weight_tensor q{f + "self_attn.q_proj.weight", {heads * d, w}, {}};
    q.parts.push_back({z + "attn.q.weight", 0, {1, g * d * w, d * w, w}, false});
    m.tensors.push_back(std::move(q));
    for (const char* kv : {"k", "v"}) {
      io::weight_tensor t{f + "self_attn." + kv + "_proj.weight", {k * d, w}, {}};
      t.parts.push_back({z + "attn." + kv + ".weight", 0, {1, d * w, w}, false});
      m.tensors.push_back(std::move(t));
    }
    // zest "k g d m" -> rows m, columns (k g + j) d + e.
    io::weight_tensor out{f + "self_attn.o_proj.weight", {w, heads * d}, {}};
    out.parts.push_back({z + "attn.o.weight", 0, {g * d, d, 1, heads * d}, false});
    m.tensors.push_back(std::move(out));
    m.tensors.push_back(
        io::whole_tensor(f + "post_attention_layernorm.weight", z + "mlp_norm.weight", {w}));
    m.tensors.push_back(
        io::transposed_tensor(f + "mlp.gate_proj.weight", z + "mlp.gate.weight", w, hidden));
    m.tensors.push_back(
        io::transposed_tensor(f + "mlp.up_proj.weight", z + "mlp.up.weight", w, hidden));
    m.tensors.push_back(
        io::transposed_tensor(f + "mlp.down_proj.weight", z + "mlp.down.weight", hidden, w));
  }
  m.tensors.push_back(io::whole_tensor("model.norm.weight", "norm_f.weight", {w}));
  if (!o.tied_head) {
    m.tensors.push_back(io::transposed_tensor("lm_head.weight", "lm_head.weight", w, o.vocab));
  }
  zest::json::value c = zest::json::object{};
  c["architectures"] = zest::json::array{zest::json::value("LlamaForCausalLM")};
  c["model_type"] = "llama";
  c["vocab_size"] = static_cast<std::int64_t>(o.vocab);
  c["hidden_size"] = static_cast<std::int64_t>(w);
  c["intermediate_size"] = static_cast<std::int64_t>(hidden);
  c["num_hidden_layers"] = static_cast<std::int64_t>(o.layers);
  c["num_attention_heads"] = static_cast<std::int64_t>(heads);
  c["num_key_value_heads"] = static_cast<std::int64_t>(k);
  c["head_dim"] = static_cast<std::int64_t>(d);
  c["max_position_embeddings"] = static_cast<std::int64_t>(o.context);
  c["rms_norm_eps"] = o.norm_eps;
  c["rope_theta"] = o.rope_base;
  c["hidden_act"] = "silu";
  c["tie_word_embeddings"] = o.tied_head;
  c["attention_bias"] = false;
  c["mlp_bias"] = false;
  c["attention_dropout"] = 0.0;
  m.config = std::move(c);
  return m;
}

// RMS normalisation over the model dim with a gain (no bias, no weight decay).
template <zest::training_policy_type P>
class rms_norm_layer {
 public:
  rms_norm_layer(zest::zero_engine<P>& engine, const std::string& name, std::size_t width,
                 double eps)
      : gain_(engine, name + ".weight", {width}, zest::init::constant{1.0}, /*decay=*/false),
        eps_(eps) {}

  template <zest::sharded_tensor X>
  auto operator()(const zest::autodiff::variable<X>& x) const {
    return zest::autodiff::rms_norm<'m'>(x, gain_.value(), eps_);
  }

 private:
  zest::parameter<P, "m"> gain_;
  double eps_;
};

// Grouped-query causal self-attention with rotary positions (see the top of the file).
template <zest::training_policy_type P>
class grouped_query_attention {
 public:
  grouped_query_attention(zest::zero_engine<P>& engine, const std::string& name,
                          const llama_options& o, double residual_std)
      : engine_(&engine),
        rope_{.base = o.rope_base},
        q_(engine, name + ".q", {o.width, o.kv_heads, o.heads / o.kv_heads, o.width / o.heads}),
        k_(engine, name + ".k", {o.width, o.kv_heads, o.width / o.heads}),
        v_(engine, name + ".v", {o.width, o.kv_heads, o.width / o.heads}),
        o_(engine, name + ".o", {o.kv_heads, o.heads / o.kv_heads, o.width / o.heads, o.width}, {},
           residual_std) {}

  // x "btm"; the result has x's layout.
  template <zest::sharded_tensor X>
  auto operator()(const zest::autodiff::variable<X>& x) const {
    namespace ad = zest::autodiff;
    const auto whole = zest::whole_on_tp<P>(x);
    // Ulysses (a mesh with "sp"): from the sequence split to a kv-heads split, and back.
    auto q = zest::across_sp<P, 't', 'k'>(ad::rope<'t', 'd'>(q_(whole), rope_));
    auto k =
        ad::relabel<"bksd">(zest::across_sp<P, 't', 'k'>(ad::rope<'t', 'd'>(k_(whole), rope_)));
    auto v = ad::relabel<"bkse">(zest::across_sp<P, 't', 'k'>(v_(whole)));
    // Recomputed in backward under recomputation::selective (the scores and probabilities).
    auto core = [](const auto& q, const auto& k, const auto& v) {
      return ad::scaled_dot_product_attention<"bkgtd,bksd,bkse->bkgte">(q, k, v);
    };
    return o_.template into<zest::layout_like<X>>(zest::across_sp<P, 'k', 't'>(
        ad::checkpoint_if(engine_->recompute() == zest::recomputation::selective, core, q, k, v)));
  }

 private:
  const zest::zero_engine<P>* engine_;
  using kv_heads_split = zest::split_over_tp<P, 'k'>;
  zest::autodiff::rope_options rope_;
  zest::linear<P, "btm,mkgd->bkgtd", "mkgd", "", kv_heads_split> q_;
  zest::linear<P, "btm,mkd->bktd", "mkd", "", kv_heads_split> k_, v_;
  zest::linear<P, "bkgte,kgem->btm", "kgem", "", kv_heads_split> o_;
};

// SwiGLU: W_down (silu(x W_gate) * (x W_up)).
template <zest::training_policy_type P>
class swiglu {
 public:
  swiglu(zest::zero_engine<P>& engine, const std::string& name, std::size_t width,
         std::size_t hidden, double residual_std)
      : gate_(engine, name + ".gate", {width, hidden}),
        up_(engine, name + ".up", {width, hidden}),
        down_(engine, name + ".down", {hidden, width}, {}, residual_std) {}

  // x "btm"; the result has x's layout.
  template <zest::sharded_tensor X>
  auto operator()(const zest::autodiff::variable<X>& x) const {
    const auto whole = zest::whole_on_tp<P>(x);
    return down_.template into<zest::layout_like<X>>(zest::autodiff::silu(gate_(whole)) *
                                                     up_(whole));
  }

 private:
  using hidden_split = zest::split_over_tp<P, 'h'>;
  zest::linear<P, "btm,mh->bth", "mh", "", hidden_split> gate_, up_;
  zest::linear<P, "bth,hm->btm", "hm", "", hidden_split> down_;
};

// A pre-norm block, one parameter group: x + attn(norm(x)), then + mlp(norm(h)).
template <zest::training_policy_type P>
class llama_block {
 public:
  llama_block(zest::zero_engine<P>& engine, const std::string& name, const llama_options& o)
      : engine_(&engine),
        group_(engine.begin_group(name)),
        attn_norm_(engine, name + ".attn_norm", o.width, o.norm_eps),
        attn_(engine, name + ".attn", o, residual_std(o)),
        mlp_norm_(engine, name + ".mlp_norm", o.width, o.norm_eps),
        mlp_(engine, name + ".mlp", o.width, o.hidden, residual_std(o)),
        dropout_(o.dropout) {
    engine.end_group();
  }

  template <zest::sharded_tensor X>
  zest::autodiff::variable<X> operator()(zest::autodiff::tape& t,
                                         const zest::autodiff::variable<X>& x,
                                         std::uint64_t seed) const {
    auto in_scope = engine_->use(t, group_);
    // Under recomputation::full the body is recomputed in backward, after the group's gather.
    auto body = [this, seed](const zest::autodiff::variable<X>& x) {
      auto a = attn_(attn_norm_(x));
      if (dropout_ > 0) a = zest::autodiff::dropout(a, dropout_, zest::splitmix64(seed));
      auto h = x + a;
      auto f = mlp_(mlp_norm_(h));
      if (dropout_ > 0) f = zest::autodiff::dropout(f, dropout_, zest::splitmix64(seed + 1));
      return zest::autodiff::variable<X>(h + f);
    };
    return zest::autodiff::checkpoint_if(engine_->recompute() == zest::recomputation::full, body,
                                         x);
  }

 private:
  // The output projections' init, scaled by 1/sqrt(2 layers) as GPT-2's.
  static double residual_std(const llama_options& o) {
    return 0.02 / std::sqrt(2.0 * static_cast<double>(o.layers));
  }

  zest::zero_engine<P>* engine_;
  std::size_t group_;  // before the sub-layers: members are made in declaration order
  rms_norm_layer<P> attn_norm_;
  grouped_query_attention<P> attn_;
  rms_norm_layer<P> mlp_norm_;
  swiglu<P> mlp_;
  double dropout_;
};

template <zest::training_policy_type P>
class llama {
  using mesh_t = typename P::mesh_type;
  using scope_t = typename zest::zero_engine<P>::scope;

 public:
  llama(zest::zero_engine<P>& engine, const llama_options& options)
      : engine_(&engine),
        options_(checked(options)),
        embed_group_(engine.begin_group(options_.tied_head ? "embed_head" : "embed")),
        wte_(engine, "wte", options_.vocab, options_.width) {
    const llama_options& o = options_;
    if (o.tied_head) norm_f_.emplace(engine, "norm_f", o.width, o.norm_eps);
    engine.end_group();
    for (std::size_t l = 0; l < o.layers; ++l) {
      std::string name = "h";  // appended: g++ 12 warns falsely (-Wrestrict) on "h" + ...
      name += std::to_string(l);
      blocks_.push_back(std::make_unique<llama_block<P>>(engine, name, o));
    }
    if (!o.tied_head) {
      head_group_ = engine.begin_group("head");
      norm_f_.emplace(engine, "norm_f", o.width, o.norm_eps);
      lm_head_.emplace(engine, "lm_head", std::array<std::size_t, 2>{o.width, o.vocab});
      engine.end_group();
    }
  }
  llama(const llama&) = delete;
  llama& operator=(const llama&) = delete;

  // The options with their defaults resolved (hidden).
  const llama_options& options() const { return options_; }
  zest::zero_engine<P>& engine() const { return *engine_; }

  // Logits "btv" for token ids "bt" (t <= context).
  template <zest::sharded_tensor Ids>
  auto logits(zest::autodiff::tape& t, const Ids& ids, std::uint64_t seed = 0) const {
    const std::size_t time = ids.extent('t');
    if (time == 0 || time > options_.context) {
      throw zest::shape_error(message("llama: sequence length ", time,
                                      " must be between 1 and the context ", options_.context));
    }
    // Tied: the table's group is in scope from the lookup to the head.
    std::optional<scope_t> embed_scope;
    embed_scope.emplace(*engine_, t, embed_group_);
    // The table is split over the vocabulary on tp: every tp rank looks up all the ids, and
    // the pending rows are reduced into the stream's layout, the ids' own.
    auto x = zest::autodiff::redistribute<zest::layout_like<Ids>>(
        wte_.template lookup<"btm">(zest::redistribute<zest::tp_region_input<P, Ids>>(ids)));
    if (!options_.tied_head) embed_scope.reset();
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      x = (*blocks_[l])(t, x, zest::splitmix64(seed ^ (0x100 + l)));
    }
    if (options_.tied_head) {  // logits split(v:tp)
      return zest::autodiff::einsum<"btm,vm->btv">(zest::whole_on_tp<P>((*norm_f_)(x)),
                                                   wte_.table().value());
    }
    auto head_scope = engine_->use(t, head_group_);
    return (*lm_head_)(zest::whole_on_tp<P>((*norm_f_)(x)));  // logits split(v:tp)
  }

  // Mean cross-entropy of predicting `targets` from `inputs`: a scalar, partial over the
  // axes that split the batch.
  template <zest::sharded_tensor Ids, zest::sharded_tensor Targets>
  auto loss(zest::autodiff::tape& t, const Ids& inputs, const Targets& targets,
            std::uint64_t seed = 0) const {
    return zest::autodiff::cross_entropy<'v'>(logits(t, inputs, seed), targets);
  }

  // The parameter list as the planner sees it, read from the engine.
  zest::model_shape shape(std::string name = "llama") const {
    return zest::shape_of(*engine_, std::move(name));
  }

 private:
  zest::zero_engine<P>* engine_;
  llama_options options_;
  std::size_t embed_group_;
  zest::embedding_layer<P, zest::split_over_tp<P, 'v'>> wte_;
  std::vector<std::unique_ptr<llama_block<P>>> blocks_;
  std::size_t head_group_ = 0;
  std::optional<rms_norm_layer<P>> norm_f_;
  std::optional<zest::linear<P, "btm,mv->btv", "mv", "", zest::split_over_tp<P, 'v'>>> lm_head_;
};

// The model's map (hf_llama_weights): what zest::io::export_safetensors(model, path) writes
// and import_safetensors reads.
template <zest::training_policy_type P>
zest::io::weight_map weight_map_of(const llama<P>& model) {
  return hf_llama_weights(model.options());
}

}  // namespace llama_example
