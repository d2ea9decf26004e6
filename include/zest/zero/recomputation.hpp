// zest/zero/recomputation.hpp — which activations a training step recomputes in backward
// instead of keeping them from forward: the engine's option (zero_options::recompute), read by
// the layers, and the planner's (parallel_layout::recompute, zest/zero/transformer_plan.hpp).
//
//   none       every block keeps what its backward reads
//   selective  the attention core (scores, softmax, probabilities: a s^2 b per layer) is
//              recomputed; the rest is kept (Korthikanti et al.'s selective recomputation)
//   full       each block keeps its input only and runs its forward again in backward
//
// The mechanism is zest::autodiff::checkpoint (zest/autodiff/checkpoint.hpp).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace zest {

enum class recomputation : std::uint8_t { none, selective, full };

constexpr std::string_view name_of(recomputation r) {
  switch (r) {
    case recomputation::none: return "none";
    case recomputation::selective: return "selective";
    case recomputation::full: return "full";
  }
  return "?";
}

// "none", "selective" or "full"; anything else throws std::invalid_argument naming the word.
inline recomputation parse_recomputation(std::string_view word) {
  for (recomputation r : {recomputation::none, recomputation::selective, recomputation::full}) {
    if (word == name_of(r)) return r;
  }
  throw std::invalid_argument("zest: recomputation '" + std::string(word) +
                              "': expected none, selective or full");
}

}  // namespace zest
