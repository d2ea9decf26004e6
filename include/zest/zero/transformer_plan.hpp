// zest/zero/transformer_plan.hpp — per-GPU memory of a transformer (GPT or Llama-style, dense
// or with expert layers) under a dp x tp x ep layout: model states with a ZeRO stage over dp,
// activations with sequence parallelism and activation recomputation.
//
//   zest::transformer_config c = zest::gpt_transformer("Turing-NLG", 78, 4256, 28, 50257, 1024);
//   zest::parallel_layout p{.dp = 64, .tp = 4, .zero_stage = 1, .micro_batch = 8};
//   auto m = zest::plan_transformer(c, p);
//   m.states.memory.total()    // parameters, gradients, optimizer of this GPU (bytes)
//   m.activations.total()      // what forward keeps for backward, one micro-batch
//
// Model states are not a formula here. Each weight has a layout over mesh<"dp","tp","ep">
// (Megatron's split: qkv and the first MLP matrix split on their output dim over "tp", the
// attention projection and the second MLP matrix on their input dim, the token table on the
// vocabulary, experts on their expert dim over "ep" and their hidden dim over "tp"; norms,
// the row-parallel biases, the position table and the router replicated). dim_range gives the
// block this GPU holds; plan_zero (zest/zero/planner.hpp) prices that list of blocks under
// the ZeRO stage over "dp", with its byte model and its collectives.
//
// Activations are counted per tensor that backward reads, as Korthikanti et al. ("Reducing
// Activation Recomputation in Large Transformer Models") count them, in bytes per layer with
// e the activation element size, m the dropout mask's (1 byte, 0 without dropout), f the MLP
// hidden width, g/a the share of key/value heads:
//   norm region (replicated over tp; split over tp with sequence parallelism):
//     norm 1 input, qkv input, attention dropout mask, norm 2 input, MLP input, MLP dropout
//     mask: (4e + 2m) s b h
//   tensor-parallel region (split over tp):
//     q, k, v (k and v times g/a), projection input: e s b h (2 + 2g/a)
//     MLP: GELU input and output 2e s b f; SwiGLU gate, up and their product 3e s b f
//   attention scores (split over tp): softmax output, dropout mask and output: (2e + m) a s^2 b
// With e = 2, m = 1, f = 4h, g = a this is the paper's s b h (34 + 5 a s / h) per layer: its
// 10 + 24/t + 5as/(ht) form with tensor parallelism, /t with sequence parallelism too, and
// 34 s b h / t when selective recomputation drops the scores (recomputed in backward). Full
// recomputation keeps each layer's input only (e s b h, /t with sequence parallelism: the
// paper's 2 s b h L) and rebuilds one layer at a time in backward: that layer's activations
// are counted once as the working set. Expert layers replace the MLP terms with the router's
// fp32 probabilities (4 s b E bytes), the dispatched and combined tokens (2 e k c s b h, c
// the capacity factor) and the experts' hidden activations (as the MLP's, times k c). Outside
// the layers: the embedding's dropout mask, the final norm's and the head's inputs
// ((2e + m) s b h, norm region) and the logits in fp32 for the cross entropy (4 s b V, split
// over tp on the vocabulary).
//
// Against zest's own training (bench/README.md, "Activation recomputation"): the modes'
// ratios agree with the measured peaks (selective / none and full / none within 3 %), the
// bytes do not: zest's tape keeps every operation's output and, at the peak, the activations'
// gradients, about 4x these figures in every mode. This counts what an implementation with
// fused kernels keeps, as the paper does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/placement.hpp"
#include "zest/layout/shard.hpp"
#include "zest/mesh/mesh_shape.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/recomputation.hpp"

namespace zest {

// ---------------------------------------------------------------------------------------
// The model.

struct transformer_config {
  std::string name = "transformer";
  std::size_t layers = 12;
  std::size_t hidden = 768;
  std::size_t heads = 12;
  std::size_t kv_heads = 0;    // 0: as many as heads; fewer: grouped-query attention
  std::size_t ffn_hidden = 0;  // 0: 4 x hidden
  std::size_t vocab = 50257;
  std::size_t sequence = 1024;
  bool gated_mlp = false;      // SwiGLU: gate and up [h, f], down [f, h] (Llama)
  bool biases = true;          // linear biases and the norms' shift (GPT); Llama has neither
  bool position_table = true;  // a learned position embedding [s, h] (GPT); rotary has none
  bool tied_output = true;     // the head multiplies by the token table
  bool dropout = true;         // masks kept for backward
  bool fused_qkv = true;       // one qkv weight (and bias); false: q, k, v apart (zest::gpt)
  // Experts: layers moe_every - 1, 2 moe_every - 1, ... have E experts, top_k of them per token.
  std::size_t experts = 0;
  std::size_t top_k = 2;
  std::size_t moe_every = 2;
  double capacity_factor = 1.0;
  bool dropless = false;  // every expert takes all its tokens (no capacity)
  // Experts split over tp on their hidden dim (Megatron); false: whole on each tp rank, which
  // all see the whole sequence (zest::gpt's moe_layer).
  bool experts_split_over_tp = true;
  std::size_t expert_hidden = 0;  // 0: ffn_hidden

  constexpr std::size_t kv() const { return kv_heads == 0 ? heads : kv_heads; }
  constexpr std::size_t ffn() const { return ffn_hidden == 0 ? 4 * hidden : ffn_hidden; }
  constexpr std::size_t expert_ffn() const { return expert_hidden == 0 ? ffn() : expert_hidden; }
  constexpr std::size_t head_dim() const { return heads == 0 ? 0 : hidden / heads; }
  constexpr std::size_t qkv_width() const { return hidden + 2 * kv() * head_dim(); }
  constexpr bool is_moe(std::size_t layer) const {
    return experts > 0 && moe_every > 0 && (layer + 1) % moe_every == 0;
  }
  constexpr std::size_t moe_layers() const {
    return experts > 0 && moe_every > 0 ? layers / moe_every : 0;
  }
};

// GPT-2/Megatron style: LayerNorm with shift, biases, learned positions, GELU, tied head.
inline transformer_config gpt_transformer(std::string name, std::size_t layers, std::size_t hidden,
                                          std::size_t heads, std::size_t vocab,
                                          std::size_t sequence) {
  transformer_config c;
  c.name = std::move(name);
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.vocab = vocab;
  c.sequence = sequence;
  return c;
}

// Llama style: RMSNorm, no biases, rotary positions, SwiGLU, untied head, no dropout.
inline transformer_config llama_transformer(std::string name, std::size_t layers,
                                            std::size_t hidden, std::size_t heads,
                                            std::size_t kv_heads, std::size_t ffn_hidden,
                                            std::size_t vocab, std::size_t sequence) {
  transformer_config c = gpt_transformer(std::move(name), layers, hidden, heads, vocab, sequence);
  c.kv_heads = kv_heads;
  c.ffn_hidden = ffn_hidden;
  c.gated_mlp = true;
  c.biases = false;
  c.position_table = false;
  c.tied_output = false;
  c.dropout = false;
  return c;
}

// ---------------------------------------------------------------------------------------
// The layout.

// recomputation (none, selective, full) and name_of: zest/zero/recomputation.hpp.

// world = dp x tp x ep GPUs. Tokens are split over dp and ep (each of those ranks has its own
// sequences), tensor-parallel ranks share theirs; ZeRO partitions over dp, as zero_stage does;
// weights replicated over ep (all but the experts) have their gradients summed over ep.
struct parallel_layout {
  int dp = 1;           // ranks ZeRO partitions over
  int dp_replicas = 1;  // hybrid sharding: replica groups of those dp ranks (dp_rep)
  int tp = 1;
  int ep = 1;
  int sp = 1;  // Ulysses: the sequence split over sp ranks, exchanged for heads in attention
  int zero_stage = 0;
  bool sequence_parallel = false;
  recomputation recompute = recomputation::none;
  std::size_t micro_batch = 1;   // sequences per micro-batch on each rank of dp x ep
  std::size_t accumulation = 1;  // micro-batches per optimizer step
  constexpr int world() const { return dp_replicas * dp * tp * ep * sp; }
};

// The mesh the planner places the weights on: rank (0, 0, 0) holds the largest blocks. It is
// the planner's own model of a machine, sized by parallel_layout (dp, tp, ep), not a mesh of
// the user's: what a training program's axes are called and which role each plays is its
// policy's (zest/zero/training_policy.hpp, axis_roles).
using transformer_plan_mesh = mesh_shape<"dp", "tp", "ep">;

// Throws shape_error naming what does not fit.
inline void check_transformer(const transformer_config& c, const parallel_layout& p) {
  auto fail = [](auto&&... parts) {
    throw shape_error(detail::message("zest: plan_transformer: ", parts...));
  };
  if (c.layers == 0 || c.hidden == 0 || c.heads == 0 || c.vocab == 0 || c.sequence == 0)
    fail("layers, hidden, heads, vocab and sequence must be positive");
  if (c.hidden % c.heads != 0) fail("hidden ", c.hidden, " is not a multiple of heads ", c.heads);
  if (c.kv() > c.heads || c.heads % c.kv() != 0)
    fail("kv heads ", c.kv(), " do not divide heads ", c.heads);
  if (p.dp < 1 || p.dp_replicas < 1 || p.tp < 1 || p.ep < 1 || p.sp < 1)
    fail("dp, dp_replicas, tp, ep and sp must be at least 1");
  if (p.zero_stage < 0 || p.zero_stage > 3) fail("ZeRO has stages 0-3, not ", p.zero_stage);
  if (p.micro_batch == 0 || p.accumulation == 0)
    fail("micro-batch and accumulation must be at least 1");
  if (c.heads % static_cast<std::size_t>(p.tp) != 0 || c.kv() % static_cast<std::size_t>(p.tp) != 0)
    fail("tp ", p.tp, " does not divide the heads (", c.heads, ", kv heads ", c.kv(),
         "): Megatron splits attention by heads");
  if (p.sp > 1 && (c.heads % static_cast<std::size_t>(p.sp * p.tp) != 0 ||
                   c.sequence % static_cast<std::size_t>(p.sp * p.tp) != 0))
    fail("sp ", p.sp, " x tp ", p.tp, " does not divide the heads (", c.heads,
         ") and the sequence (", c.sequence, "): Ulysses exchanges the one for the other");
  if (p.sequence_parallel && p.tp < 2)
    fail("sequence parallelism splits over the tensor-parallel ranks: it needs tp >= 2");
  if (c.experts > 0) {
    if (c.top_k == 0 || c.top_k > c.experts)
      fail("top-k ", c.top_k, " must be between 1 and the experts (", c.experts, ")");
    if (c.moe_every == 0 || c.moe_layers() == 0)
      fail("no expert layer: every ", c.moe_every, "-th of ", c.layers, " layers");
    if (!(c.capacity_factor > 0)) fail("the capacity factor must be positive");
    if (c.experts % static_cast<std::size_t>(p.ep) != 0)
      fail("ep ", p.ep, " does not divide the experts (", c.experts, ")");
  } else if (p.ep > 1) {
    fail("ep ", p.ep, " needs expert layers (experts > 0)");
  }
}

// ---------------------------------------------------------------------------------------
// The weights, as blocks of the layouts above.

// What a weight is, for the reductions its gradient needs besides ZeRO's over dp.
enum class weight_kind : std::uint8_t {
  tensor_split,       // split over tp: its gradient is complete on its block
  tensor_replicated,  // replicated over tp: partial over tp with sequence parallelism
  expert              // split over ep: not summed over ep
};

struct placed_weight {
  parameter_shape global;
  parameter_shape local;  // this GPU's block over tp and ep (dp is ZeRO's)
  weight_kind kind = weight_kind::tensor_split;
  bool matmul = false;              // multiplied with every token (the head's table too)
  bool replicated_over_tp = false;  // whole on every tp rank: its gradient is partial over tp
  int tp_dim = -1;                  // the dim split over tp (-1: none)
  int ep_dim = -1;                  // the dim split over ep (-1: none)
};

namespace detail {

template <fixed_string Dims, class Layout>
inline constexpr layout_value weight_layout = layout_value_of<transformer_plan_mesh, Dims, Layout>;

inline parameter_shape local_block(const parameter_shape& global, layout_value v,
                                   std::string_view dims, const transformer_plan_mesh& mesh) {
  parameter_shape local{global.name, global.extents, global.group};
  for (std::size_t i = 0; i < dims.size() && i < global.extents.size(); ++i)
    local.extents[i] = dim_range(v, dims[i], global.extents[i], mesh.sizes(), mesh.coords()).size;
  return local;
}

}  // namespace detail

// The weights of `c` with this GPU's block of each, for the rank at `mesh`'s coordinates.
inline std::vector<placed_weight> place_weights(const transformer_config& c,
                                                const transformer_plan_mesh& mesh) {
  using detail::weight_layout;
  constexpr layout_value vector_replicated = weight_layout<"n", layout<>>;
  constexpr layout_value vector_split = weight_layout<"n", layout<split<'n', "tp">>>;
  constexpr layout_value matrix_replicated = weight_layout<"mn", layout<>>;
  constexpr layout_value column_parallel = weight_layout<"mn", layout<split<'n', "tp">>>;
  constexpr layout_value row_parallel = weight_layout<"mn", layout<split<'m', "tp">>>;
  constexpr layout_value vocab_parallel = weight_layout<"vm", layout<split<'v', "tp">>>;
  constexpr layout_value head_parallel = weight_layout<"mv", layout<split<'v', "tp">>>;
  constexpr layout_value expert_column =
      weight_layout<"emn", layout<split<'e', "ep">, split<'n', "tp">>>;
  constexpr layout_value expert_row =
      weight_layout<"emn", layout<split<'e', "ep">, split<'m', "tp">>>;
  constexpr layout_value expert_vector_split =
      weight_layout<"en", layout<split<'e', "ep">, split<'n', "tp">>>;
  constexpr layout_value expert_vector = weight_layout<"en", layout<split<'e', "ep">>>;
  constexpr layout_value expert_matrix = weight_layout<"emn", layout<split<'e', "ep">>>;
  constexpr layout_value heads_parallel = weight_layout<"mnd", layout<split<'n', "tp">>>;
  constexpr layout_value heads_vector = weight_layout<"nd", layout<split<'n', "tp">>>;
  constexpr layout_value heads_row = weight_layout<"ndm", layout<split<'n', "tp">>>;
  const bool experts_tp = c.experts_split_over_tp;

  std::vector<placed_weight> out;
  std::string group = "embed";  // as zest::gpt groups them: the embeddings, each layer, the head
  auto add = [&](std::string name, std::vector<std::size_t> extents, layout_value v,
                 std::string_view dims, weight_kind kind, bool matmul = false) {
    parameter_shape g{std::move(name), std::move(extents), group};
    parameter_shape l = detail::local_block(g, v, dims, mesh);
    const auto split_dim = [&](std::size_t axis) {
      return v.is_split(axis) ? static_cast<int>(dims.find(v.axes[axis].dim)) : -1;
    };
    const int tp_dim = split_dim(1), ep_dim = split_dim(2);  // transformer_plan_mesh's axes
    out.push_back({std::move(g), std::move(l), kind, matmul, tp_dim < 0, tp_dim, ep_dim});
  };
  using enum weight_kind;
  const std::size_t h = c.hidden, f = c.ffn(), fe = c.expert_ffn(), e = c.experts;
  const std::size_t up = c.gated_mlp ? 2 * f : f;
  const std::size_t expert_up = c.gated_mlp ? 2 * fe : fe;
  auto norm = [&](const std::string& p) {
    add(p + ".weight", {h}, vector_replicated, "n", tensor_replicated);
    if (c.biases) add(p + ".bias", {h}, vector_replicated, "n", tensor_replicated);
  };
  add("wte", {c.vocab, h}, vocab_parallel, "vm", tensor_split, c.tied_output);
  if (c.position_table) add("wpe", {c.sequence, h}, matrix_replicated, "mn", tensor_replicated);
  for (std::size_t l = 0; l < c.layers; ++l) {
    std::string p = "h";
    p += std::to_string(l);
    group = p;
    p += '.';
    norm(p + "norm_1");
    if (c.fused_qkv) {
      add(p + "attn.qkv.weight", {h, c.qkv_width()}, column_parallel, "mn", tensor_split, true);
      if (c.biases) add(p + "attn.qkv.bias", {c.qkv_width()}, vector_split, "n", tensor_split);
      add(p + "attn.proj.weight", {h, h}, row_parallel, "mn", tensor_split, true);
    } else {
      // zest::gpt's: q, k, v [m, heads, d] split over tp on the heads, the projection
      // [heads, d, m]; each bias [heads, d].
      const std::size_t d = c.head_dim();
      for (const auto& [part, heads] : {std::pair<const char*, std::size_t>{"attn.q", c.heads},
                                        {"attn.k", c.kv()},
                                        {"attn.v", c.kv()}}) {
        add(p + part + ".weight", {h, heads, d}, heads_parallel, "mnd", tensor_split, true);
        if (c.biases) add(p + part + ".bias", {heads, d}, heads_vector, "nd", tensor_split);
      }
      add(p + "attn.proj.weight", {c.heads, d, h}, heads_row, "ndm", tensor_split, true);
    }
    if (c.biases) add(p + "attn.proj.bias", {h}, vector_replicated, "n", tensor_replicated);
    norm(p + "norm_2");
    if (c.is_moe(l)) {
      add(p + "moe.router", {h, e}, matrix_replicated, "mn", tensor_replicated);
      add(p + "moe.fc.weight", {e, h, expert_up}, experts_tp ? expert_column : expert_matrix, "emn",
          expert, true);
      if (c.biases)
        add(p + "moe.fc.bias", {e, expert_up}, experts_tp ? expert_vector_split : expert_vector,
            "en", expert);
      add(p + "moe.proj.weight", {e, fe, h}, experts_tp ? expert_row : expert_matrix, "emn", expert,
          true);
      if (c.biases) add(p + "moe.proj.bias", {e, h}, expert_vector, "en", expert);
    } else {
      add(p + "mlp.fc.weight", {h, up}, column_parallel, "mn", tensor_split, true);
      if (c.biases) add(p + "mlp.fc.bias", {up}, vector_split, "n", tensor_split);
      add(p + "mlp.proj.weight", {f, h}, row_parallel, "mn", tensor_split, true);
      if (c.biases) add(p + "mlp.proj.bias", {h}, vector_replicated, "n", tensor_replicated);
    }
  }
  group = "head";
  norm("norm_f");
  if (!c.tied_output) add("lm_head", {h, c.vocab}, head_parallel, "mv", tensor_split, true);
  return out;
}

// ---------------------------------------------------------------------------------------
// Activations.

struct activation_bytes {
  double layers = 0;   // kept for backward by all layers (checkpoints under full recompute)
  double working = 0;  // full recomputation: one layer rebuilt in backward
  double outside = 0;  // embedding, final norm, head input, fp32 logits
  constexpr double total() const { return layers + working + outside; }
};

// One layer's activations on one GPU before recomputation, by region, in bytes.
struct layer_activations {
  double norm_region = 0;    // already divided by tp under sequence parallelism
  double tensor_region = 0;  // divided by tp
  double scores = 0;         // divided by tp
  constexpr double total() const { return norm_region + tensor_region + scores; }
};

inline layer_activations layer_activation_bytes(const transformer_config& c,
                                                const parallel_layout& p, bool moe,
                                                double element_bytes) {
  const double e = element_bytes, m = c.dropout ? 1.0 : 0.0;
  const double t = p.tp, sp = p.sequence_parallel ? t : 1.0;
  const double sb = static_cast<double>(c.sequence) * static_cast<double>(p.micro_batch);
  const double h = static_cast<double>(c.hidden);
  const double kv_share = static_cast<double>(c.kv()) / static_cast<double>(c.heads);
  const double gated = c.gated_mlp ? 3.0 : 2.0;
  layer_activations a;
  // norm 1 input, qkv input, attention dropout mask, norm 2 input, MLP dropout mask
  double norm = (3 * e + 2 * m) * sb * h;
  double tensor = e * sb * h * (2 + 2 * kv_share);
  if (moe) {
    const double kc = static_cast<double>(c.top_k) * c.capacity_factor;
    norm += e * sb * h;                               // router input
    norm += 4 * sb * static_cast<double>(c.experts);  // router probabilities, fp32
    norm += 2 * e * kc * sb * h;                      // dispatched, combined tokens
    tensor += gated * e * kc * sb * static_cast<double>(c.expert_ffn());
  } else {
    norm += e * sb * h;  // MLP input
    tensor += gated * e * sb * static_cast<double>(c.ffn());
  }
  a.norm_region = norm / sp;
  a.tensor_region = tensor / t;
  const double s = static_cast<double>(c.sequence);
  a.scores = (c.dropout ? 2 * e + m : e) * static_cast<double>(c.heads) * s * sb / t;
  return a;
}

inline activation_bytes transformer_activation_bytes(const transformer_config& c,
                                                     const parallel_layout& p,
                                                     double element_bytes) {
  activation_bytes out;
  const double t = p.tp, sp = p.sequence_parallel ? t : 1.0;
  const double sb = static_cast<double>(c.sequence) * static_cast<double>(p.micro_batch);
  const double h = static_cast<double>(c.hidden);
  double largest = 0;
  for (std::size_t l = 0; l < c.layers; ++l) {
    const layer_activations a = layer_activation_bytes(c, p, c.is_moe(l), element_bytes);
    largest = std::max(largest, a.total());
    switch (p.recompute) {
      case recomputation::none: out.layers += a.total(); break;
      case recomputation::selective: out.layers += a.norm_region + a.tensor_region; break;
      case recomputation::full: out.layers += element_bytes * sb * h / sp; break;
    }
  }
  if (p.recompute == recomputation::full) out.working = largest;
  const double m = c.dropout ? 1.0 : 0.0;
  out.outside = (2 * element_bytes + m) * sb * h / sp + 4 * sb * static_cast<double>(c.vocab) / t;
  return out;
}

// ---------------------------------------------------------------------------------------
// The plan.

struct transformer_memory {
  std::string model;
  std::string mesh;                    // "mesh<dp=64, tp=4, ep=1>"
  std::uint64_t parameter_count = 0;   // the whole model
  std::uint64_t local_parameters = 0;  // this GPU's blocks over tp and ep, before ZeRO
  std::uint64_t local_expert_parameters = 0;
  std::uint64_t active_matmul_parameters = 0;  // per token: dense matrices, top_k experts each
  std::uint64_t active_expert_matmul_parameters = 0;  // the experts' part of it
  std::uint64_t tensor_replicated_parameters = 0;     // of local_parameters
  zero_plan states;                                   // ZeRO over dp on this GPU's blocks
  activation_bytes activations;                       // one micro-batch
  double total() const { return static_cast<double>(states.memory.total()) + activations.total(); }
};

inline transformer_memory plan_transformer(
    const transformer_config& c, const parallel_layout& p,
    const training_precision& precision = mixed_precision_adam) {
  check_transformer(c, p);
  const transformer_plan_mesh mesh({p.dp, p.tp, p.ep});
  transformer_memory out;
  out.model = c.name;
  out.mesh = mesh.describe();
  model_shape local{c.name + " (this GPU's blocks)", {}};
  double active = 0, active_expert = 0;
  for (placed_weight& w : place_weights(c, mesh)) {
    out.parameter_count += w.global.elements();
    out.local_parameters += w.local.elements();
    if (w.kind == weight_kind::expert) out.local_expert_parameters += w.local.elements();
    if (w.kind == weight_kind::tensor_replicated)
      out.tensor_replicated_parameters += w.local.elements();
    if (w.matmul) {
      const double n = static_cast<double>(w.global.elements());
      if (w.kind == weight_kind::expert) {
        const double k = n / static_cast<double>(c.experts) * static_cast<double>(c.top_k);
        active += k;
        active_expert += k;
      } else {
        active += n;
      }
    }
    local.parameters.push_back(std::move(w.local));
  }
  out.active_matmul_parameters = static_cast<std::uint64_t>(active);
  out.active_expert_matmul_parameters = static_cast<std::uint64_t>(active_expert);
  // ZeRO over dp; with replica groups, hybrid sharding (replicated over dp_rep).
  out.states =
      p.dp_replicas == 1
          ? plan_zero(p.zero_stage, local, mesh_shape<"dp">({p.dp}), precision)
          : plan_zero<"dp", split_first_dim, "dp_rep">(
                p.zero_stage, local, mesh_shape<"dp_rep", "dp">({p.dp_replicas, p.dp}), precision);
  out.activations =
      transformer_activation_bytes(c, p, static_cast<double>(precision.parameter_bytes));
  return out;
}

}  // namespace zest
