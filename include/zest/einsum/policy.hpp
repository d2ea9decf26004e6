// zest/einsum/policy.hpp — who moves when two operands' layouts conflict on a mesh axis.
//
// A conflict is one mesh axis splitting different dims in two operands, say activations
// x "bsm" split(b:dp) and a ZeRO-3 weight w "mh" split(m:dp) in "bsm,mh->bsh". One of them
// must give the axis up. A policy ranks the operands: an operand earlier in the ranking keeps
// its splits, a later one is brought to match (all-gather or all-to-all; a replicated dim is
// just sliced, which costs nothing).
//
//   gather_weights (default, ZeRO)  the spec's first operand keeps its layout: by convention
//                                   activations come first, weights last, so weights are
//                                   gathered on use.
//   keep_weights (Megatron)         the last operand keeps its layout; activations move.
//   no_communication<P>             ranks like P, and an einsum that needs any collective
//                                   before its local contraction does not compile.
//
// A policy is any type with `static constexpr std::array<std::uint8_t, max_operands>
// ranking(std::size_t operand_count)` and `static constexpr bool allows_communication`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "zest/config.hpp"

namespace zest {

struct gather_weights {
  static constexpr bool allows_communication = true;
  static constexpr std::array<std::uint8_t, max_operands> ranking(std::size_t n) {
    std::array<std::uint8_t, max_operands> r{};
    for (std::size_t i = 0; i < n; ++i) r[i] = static_cast<std::uint8_t>(i);
    return r;
  }
};

struct keep_weights {
  static constexpr bool allows_communication = true;
  static constexpr std::array<std::uint8_t, max_operands> ranking(std::size_t n) {
    std::array<std::uint8_t, max_operands> r{};
    for (std::size_t i = 0; i < n; ++i) r[i] = static_cast<std::uint8_t>(n - 1 - i);
    return r;
  }
};

template <class Policy = gather_weights>
struct no_communication {
  static constexpr bool allows_communication = false;
  static constexpr auto ranking(std::size_t n) { return Policy::ranking(n); }
};

template <class P>
concept einsum_policy = requires(std::size_t n) {
  { P::ranking(n) } -> std::convertible_to<std::array<std::uint8_t, max_operands>>;
  { P::allows_communication } -> std::convertible_to<bool>;
};

}  // namespace zest
