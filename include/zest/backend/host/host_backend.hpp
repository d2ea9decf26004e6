// zest/backend/host/host_backend.hpp — shards in host memory, Eigen/BLAS kernels.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "zest/backend/backend.hpp"
#include "zest/backend/host/contract.hpp"
#include "zest/core/memory.hpp"

namespace zest {

// Host storage: counted by zest::memory, 64-byte aligned, sized without zero-filling.
template <class T>
using host_vector = std::vector<T, memory::tracking_allocator<T>>;

struct host_backend {
  static constexpr std::string_view name = "host";
  // Function objects' host-vectorised members run here (zest/backend/backend.hpp).
  static constexpr bool runs_host_loops = true;
  // Host code reads and writes the buffers in place (host_staging views them, no copy).
  static constexpr bool host_addressable = true;
  template <class T>
  using buffer = host_vector<T>;

  // The data seen as [outer][D][inner]: `len` slices starting at src_off in a source with
  // D = src_d go to dst_off.. in a destination with D = dst_d.
  template <class T>
  static void copy_slices(const T* src, std::size_t outer, std::size_t src_d, std::size_t src_off,
                          T* dst, std::size_t dst_d, std::size_t dst_off, std::size_t len,
                          std::size_t inner) {
    const std::size_t run = len * inner;
    if (run == 0) return;
    for (std::size_t o = 0; o < outer; ++o) {
      std::copy_n(src + (o * src_d + src_off) * inner, run, dst + (o * dst_d + dst_off) * inner);
    }
  }
  template <class T>
  static void fill(T* p, std::size_t n, T value) {
    std::fill_n(p, n, value);
  }
  template <class T>
  static void contract(std::span<const host::operand_view<T>> operands, std::string_view out_labels,
                       T* out, std::span<const std::size_t> out_extents) {
    host::contract<T>(operands, out_labels, out, out_extents);
  }
  template <class F>
  static void for_each(std::size_t n, const F& f) {
    for (std::size_t i = 0; i < n; ++i) f(i);
  }
  // The sum of f(i) over i < n in double, in a fixed order: sixteen lanes, lane j adding the
  // f(i) with i % 16 == j in increasing i, then lanes 0 to 15 added in turn. The inner loop
  // has a fixed trip count and no dependence between lanes, so it vectorises, and the result
  // does not depend on the compiler. Up to 16 terms it is the plain sum in index order.
  template <class F>
  static double sum(std::size_t n, const F& f) {
    constexpr std::size_t lanes = 16;
    std::array<double, lanes> acc{};
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      for (std::size_t j = 0; j < lanes; ++j) acc[j] += static_cast<double>(f(i + j));
    }
    for (std::size_t j = 0; i < n; ++i, ++j) acc[j] += static_cast<double>(f(i));
    double total = 0;
    for (const double a : acc) total += a;
    return total;
  }
  static memory::counters& counters() { return memory::host_counters(); }
  static void synchronize() {}

  template <class T>
  static buffer<T> from_host(std::span<const T> values) {
    return buffer<T>(values.begin(), values.end());
  }
  template <class T>
  static void to_host(std::span<const T> values, T* out) {
    std::copy(values.begin(), values.end(), out);
  }
};

static_assert(backend<host_backend>);

}  // namespace zest
