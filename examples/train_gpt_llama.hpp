// train_gpt_llama.hpp — train_gpt's --arch llama: the decoder of examples/llama.hpp, with the
// options train_gpt's flags give it. train_gpt_llama_<precision>.cpp compile its runs, one
// precision each; train_gpt.cpp reads llama_options_of for its checks and memory estimate.
#pragma once

#include "llama.hpp"
#include "train_gpt.hpp"

namespace train_gpt_example {

inline llama_example::llama_options llama_options_of(const flags& f, std::size_t vocab) {
  llama_example::llama_options o;
  o.vocab = vocab;
  o.context = f.context;
  o.width = f.width;
  o.layers = f.layers;
  o.heads = f.heads;
  o.kv_heads = f.kv_heads == 0 ? f.heads : f.kv_heads;
  o.hidden = f.hidden;
  o.tied_head = f.tie_head;
  o.rope_base = f.rope_base;
  o.dropout = f.dropout;
  return o;
}

struct llama_arch {
  template <class P>
  using model = llama_example::llama<P>;
  static constexpr bool has_experts = false;
  static llama_example::llama_options options(const flags& f, std::size_t vocab) {
    return llama_options_of(f, vocab);
  }
};

}  // namespace train_gpt_example
