// zest/nn/gpt_weights.hpp — where zest::gpt's parameters lie in a Hugging Face GPT-2 file.
//
//   zest::io::export_safetensors(model, "out/");   // GPT2LMHeadModel.from_pretrained("out")
//   zest::io::import_safetensors(model, "gpt2.safetensors");
//
// zest/train/weights.hpp finds the map through weight_map_of(model). Apart from
// zest/nn/gpt.hpp, so that a program that trains a GPT compiles no JSON: zest/io.hpp
// includes it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "zest/core/error.hpp"
#include "zest/core/json.hpp"
#include "zest/io/safetensors.hpp"
#include "zest/nn/gpt.hpp"

namespace zest {

// Where gpt's parameters lie in a Hugging Face GPT-2 file (GPT2LMHeadModel's names, with
// its Conv1D layers' [in, out] weights: zest's own order), and the model's config.json:
// c_attn holds q, k and v side by side, [width, 3 width], the heads' blocks in order; the
// output head, untied in zest, is lm_head.weight [vocab, width] (a file with a tied head has
// none: its table is read in its place). Models with experts have no GPT-2 names.
inline io::weight_map hf_gpt2_weights(const gpt_options& o) {
  if (o.moe) {
    throw shape_error(
        "zest: hf_gpt2_weights: a GPT with experts (--moe) has no Hugging Face GPT-2 names; "
        "export it with zest's own names (io::own_weight_map)");
  }
  if (o.heads == 0 || o.width % o.heads != 0) {
    throw shape_error(detail::message("zest: hf_gpt2_weights: ", o.heads,
                                      " heads do not divide the width ", o.width));
  }
  const std::size_t w = o.width, heads = o.heads, d = w / heads, hidden = o.mlp_ratio * w;
  io::weight_map m;
  m.convention = "Hugging Face GPT-2 (GPT2LMHeadModel)";
  m.optional_prefix = "transformer.";
  m.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};  // older files' mask buffers
  auto wte = io::whole_tensor("transformer.wte.weight", "wte", {o.vocab, w});
  wte.parts.push_back({"lm_head.weight", 0, {1, w}, true});  // a tied file's head
  m.tensors.push_back(std::move(wte));
  m.tensors.push_back(io::whole_tensor("transformer.wpe.weight", "wpe", {o.context, w}));
  for (std::size_t l = 0; l < o.layers; ++l) {
    const std::string z = detail::message("h", l, "."),
                      f = detail::message("transformer.h.", l, ".");
    for (const char* norm : {"ln_1", "ln_2"}) {
      for (const char* p : {".weight", ".bias"}) {
        m.tensors.push_back(io::whole_tensor(f + norm + p, z + norm + p, {w}));
      }
    }
    io::weight_tensor qkv{f + "attn.c_attn.weight", {w, 3 * w}, {}};
    io::weight_tensor qkv_bias{f + "attn.c_attn.bias", {3 * w}, {}};
    std::size_t at = 0;
    for (const char* part : {"attn.q", "attn.k", "attn.v"}) {
      qkv.parts.push_back({z + part + ".weight", at, {3 * w, d, 1}, false});
      qkv_bias.parts.push_back({z + part + ".bias", at, {d, 1}, false});
      at += w;
    }
    m.tensors.push_back(std::move(qkv));
    m.tensors.push_back(std::move(qkv_bias));
    io::weight_tensor proj{f + "attn.c_proj.weight", {w, w}, {}};
    proj.parts.push_back({z + "attn.proj.weight", 0, {d * w, w, 1}, false});
    m.tensors.push_back(std::move(proj));
    m.tensors.push_back(io::whole_tensor(f + "attn.c_proj.bias", z + "attn.proj.bias", {w}));
    m.tensors.push_back(io::whole_tensor(f + "mlp.c_fc.weight", z + "mlp.fc.weight", {w, hidden}));
    m.tensors.push_back(io::whole_tensor(f + "mlp.c_fc.bias", z + "mlp.fc.bias", {hidden}));
    m.tensors.push_back(
        io::whole_tensor(f + "mlp.c_proj.weight", z + "mlp.proj.weight", {hidden, w}));
    m.tensors.push_back(io::whole_tensor(f + "mlp.c_proj.bias", z + "mlp.proj.bias", {w}));
  }
  m.tensors.push_back(io::whole_tensor("transformer.ln_f.weight", "ln_f.weight", {w}));
  m.tensors.push_back(io::whole_tensor("transformer.ln_f.bias", "ln_f.bias", {w}));
  m.tensors.push_back(io::transposed_tensor("lm_head.weight", "lm_head.weight", w, o.vocab));
  json::value c = json::object{};
  c["architectures"] = json::array{json::value("GPT2LMHeadModel")};
  c["model_type"] = "gpt2";
  c["vocab_size"] = static_cast<std::int64_t>(o.vocab);
  c["n_positions"] = static_cast<std::int64_t>(o.context);
  c["n_embd"] = static_cast<std::int64_t>(w);
  c["n_layer"] = static_cast<std::int64_t>(o.layers);
  c["n_head"] = static_cast<std::int64_t>(heads);
  c["n_inner"] = static_cast<std::int64_t>(hidden);
  c["activation_function"] = "gelu_new";  // GELU's tanh form, as zest's
  c["layer_norm_epsilon"] = 1e-5;
  c["resid_pdrop"] = o.dropout;
  c["embd_pdrop"] = 0.0;
  c["attn_pdrop"] = 0.0;
  c["tie_word_embeddings"] = false;
  c["bos_token_id"] = json::value();  // the byte-level corpora have no special tokens
  c["eos_token_id"] = json::value();
  m.config = std::move(c);
  return m;
}

// The map of a model: what io::export_safetensors(model, path) writes and
// io::import_safetensors(model, path) reads.
template <training_policy_type P>
io::weight_map weight_map_of(const gpt<P>& model) {
  return hf_gpt2_weights(model.options());
}

}  // namespace zest
