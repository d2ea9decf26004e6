// zest/core/random.hpp — counter-based random numbers: pure functions of their inputs.
//
// A random choice made for (seed, global index) is the same on every rank that computes it,
// whatever the number of ranks or the layout: the data pipeline draws its windows this way
// (zest/data/batches.hpp), dropout its masks (zest/autodiff/ops.hpp).
#pragma once

#include <cstdint>

namespace zest {

// Steele, Lea & Flood's splitmix64 finaliser: a bijection of 64-bit words that mixes well.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace zest
