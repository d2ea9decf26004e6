// zest/zero/init.hpp — the initial values of a parameter.
//
//   zest::parameter<policy, "mh"> w(engine, "fc.weight", {m, h}, zest::init::normal(0.02));
//   zest::parameter<policy, "h"> b(engine, "fc.bias", {h}, zest::init::constant{0});
//
// An initializer is a function of (seed, global row-major index): every rank count and
// layout gives a tensor the same values.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numbers>
#include <span>
#include <type_traits>
#include <utility>

#include "zest/backend/host/host_backend.hpp"
#include "zest/config.hpp"
#include "zest/core/random.hpp"

namespace zest {

namespace init {
// N(0, std) from (seed, global flat index): Box-Muller on two counter-based uniforms.
struct normal {
  double stddev = 0.02;
  double operator()(std::uint64_t seed, std::uint64_t index) const {
    const std::uint64_t a = splitmix64(seed ^ splitmix64(2 * index));
    const std::uint64_t b = splitmix64(seed ^ splitmix64(2 * index + 1));
    const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
    return stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
};
struct constant {
  double value = 0;
  double operator()(std::uint64_t, std::uint64_t) const { return value; }
};
}  // namespace init
using initializer = std::function<double(std::uint64_t seed, std::uint64_t index)>;

namespace detail {

// The initial values of a tensor's local block: init(seed, global row-major index) at each
// element, converted through float to T. A function of the element type only (the dims'
// count, extents and offsets are arguments), so that it is compiled once per precision,
// not once per parameter type (bench/README.md, "Compile time and memory").
template <class T>
host_vector<T> initial_values(std::size_t rank, const std::size_t* global,
                              const std::size_t* offsets, const std::size_t* local,
                              std::uint64_t seed, const initializer& init) {
  std::size_t count = 1;
  for (std::size_t k = 0; k < rank; ++k) count *= local[k];
  host_vector<T> values(count);
  std::array<std::size_t, max_dims> index{};
  for (std::size_t flat = 0; flat < count; ++flat) {
    std::size_t rest = flat;
    for (std::size_t i = rank; i-- > 0;) {
      index[i] = offsets[i] + rest % local[i];
      rest /= local[i];
    }
    std::uint64_t at = 0;
    for (std::size_t k = 0; k < rank; ++k) at = at * global[k] + index[k];
    values[flat] = static_cast<T>(static_cast<float>(init(seed, at)));
  }
  return values;
}
}  // namespace detail

}  // namespace zest
