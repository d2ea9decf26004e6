// zest/autodiff/kernels.hpp — the loop bodies of autodiff, one definition for every backend.
//
//   for_each_kernel<B>(y.local_count(), kernels::unary_forward<T, gelu_fn>{x, y, {}});
//   for_each_kernel<B>(rows, kernels::layer_norm_rows<T>{x, g, b, y, mean, rstd, walk, eps});
//
// Each is a small trivially copyable struct of raw pointers, sizes and scalars whose call
// operator is ZEST_HOST_DEVICE: no exceptions, no allocation, dmath instead of std::exp. Every
// backend runs the call operator (Backend::for_each, Backend::sum; CUDA kernels on the GPU,
// plain loops on the emulated backend). Where the host needs it for speed a kernel also has a
// host-vectorised member, `host(n)` or `host_sum(n)`, that does the same loop over host memory
// with Eigen array expressions (vectorised exp and tanh included): the host backend calls it
// (zest::for_each_kernel, zest/backend/backend.hpp). A host member computes what the call
// operator computes, in the order of operations the host always had.
//
// Determinism: no atomics. A sum that the host accumulates element by element (a bias's or
// layer norm's parameter gradient, an embedding table's rows) is one call per output element
// that loops over its inputs in the host's order, so the emulated backend reproduces the
// host's sums where the host's loop is not vectorised.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <Eigen/Core>

#include "zest/config.hpp"
#include "zest/core/device_math.hpp"
#include "zest/core/random.hpp"
#include "zest/layout/shard.hpp"

namespace zest::autodiff {

// One row of a local shard, as a row-wise op's function object sees it: n elements `stride`
// apart (autodiff::rowwise, zest/autodiff/op.hpp).
template <class T>
struct row {
  T* data;
  std::size_t n, stride;
  ZEST_HOST_DEVICE T& operator[](std::size_t j) const { return data[j * stride]; }
  ZEST_HOST_DEVICE std::size_t size() const { return n; }
};

}  // namespace zest::autodiff

namespace zest::autodiff::kernels {

// ---------------------------------------------------------------------------------------
// Elementwise (tape.hpp): the operations, and the loops that apply them.

template <class T>
struct plus {
  ZEST_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};
template <class T>
struct minus {
  ZEST_HOST_DEVICE T operator()(T a, T b) const { return a - b; }
};
template <class T>
struct times {
  ZEST_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};
template <class T>
struct negate {
  ZEST_HOST_DEVICE T operator()(T a) const { return -a; }
};
template <class T>
struct scale_by {
  T c;
  ZEST_HOST_DEVICE T operator()(T a) const { return c * a; }
};

// out[i] = op(a[i], b[i]).
template <class T, class Op>
struct combine {
  const T* a;
  const T* b;
  T* out;
  Op op;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const { out[i] = op(a[i], b[i]); }
};
// out[i] = op(a[i]).
template <class T, class Op>
struct transform {
  const T* a;
  T* out;
  Op op;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const { out[i] = op(a[i]); }
};
// out[i] += in[i]: a gradient's uses summed.
template <class T>
struct add_into {
  T* out;
  const T* in;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const { out[i] += in[i]; }
};
// p[i], for Backend::sum.
template <class T>
struct element {
  const T* p;
  ZEST_HOST_DEVICE T operator()(std::size_t i) const { return p[i]; }
};
// 1 where a[i] and b[i] differ in some bit (a NaN equals only a NaN of the same bits), else 0:
// for Backend::sum, the count of elements that differ (checkpoint.hpp's determinism check).
template <class T>
struct bits_differ {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8,
                "zest autodiff: bits_differ compares elements of 2, 4 or 8 bytes");
  using bits_type =
      std::conditional_t<sizeof(T) == 2, std::uint16_t,
                         std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
  const T* a;
  const T* b;
  ZEST_HOST_DEVICE double operator()(std::size_t i) const {
    return std::bit_cast<bits_type>(a[i]) == std::bit_cast<bits_type>(b[i]) ? 0.0 : 1.0;
  }
};

// ---------------------------------------------------------------------------------------
// Walks of a local shard.

// The entries [lo, hi) of a row of n (the rows around the mask's own dim: shard_rows,
// zest/layout/shard.hpp) that a causal mask keeps (all of them when not masked): a prefix
// along K (global k <= global q), a suffix along Q (global q >= global k). `other` is the
// other dim's local index in the row.
struct causal_window {
  bool masked = false, along_k = true;
  row_coordinate other;
  std::size_t other_offset = 0, own_offset = 0, n = 0;
  ZEST_HOST_DEVICE void kept(std::size_t row, std::size_t& lo, std::size_t& hi) const {
    lo = 0;
    hi = n;
    if (!masked) return;
    const long long g = static_cast<long long>(other_offset + other.at(row));
    const long long own = static_cast<long long>(own_offset);
    const long long last = static_cast<long long>(n);
    if (along_k) {
      hi = clamped(g + 1 - own, last);
    } else {
      lo = clamped(g - own, last);
    }
  }
  ZEST_HOST_DEVICE static std::size_t clamped(long long v, long long top) {
    return static_cast<std::size_t>(v < 0 ? 0 : (v > top ? top : v));
  }
};

// A big shard against a small one whose dims are some of the big one's (ops.hpp's
// broadcast_walk): the big shard's dims merged into groups, each all in the small one
// (small_stride > 0) or all not (small_stride 0); big_stride is the group's row-major stride
// in the big shard.
struct broadcast_map {
  std::size_t groups = 0;
  std::size_t extent[max_dims] = {}, small_stride[max_dims] = {}, big_stride[max_dims] = {};
  std::size_t absent_count = 1;  // big elements per small element
  ZEST_HOST_DEVICE std::size_t small_of(std::size_t big) const {
    std::size_t s = 0;
    for (std::size_t g = groups; g-- > 0;) {
      s += (big % extent[g]) * small_stride[g];
      big /= extent[g];
    }
    return s;
  }
  // The first big element of small element s, and the m-th (m < absent_count), in the big
  // shard's order.
  ZEST_HOST_DEVICE std::size_t big_base(std::size_t s) const {
    std::size_t b = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      if (small_stride[g] != 0) b += (s / small_stride[g]) % extent[g] * big_stride[g];
    }
    return b;
  }
  ZEST_HOST_DEVICE std::size_t big_offset(std::size_t m) const {
    std::size_t b = 0;
    for (std::size_t g = groups; g-- > 0;) {
      if (small_stride[g] != 0) continue;
      b += (m % extent[g]) * big_stride[g];
      m /= extent[g];
    }
    return b;
  }
};

// The global row-major flat index of element i of a local shard.
struct global_index {
  std::size_t rank = 0;
  std::size_t local[max_dims] = {}, offset[max_dims] = {}, stride[max_dims] = {};
  ZEST_HOST_DEVICE std::uint64_t operator()(std::size_t i) const {
    std::uint64_t g = 0;
    for (std::size_t k = rank; k-- > 0;) {
      g += (offset[k] + i % local[k]) * stride[k];
      i /= local[k];
    }
    return g;
  }
};

// ---------------------------------------------------------------------------------------
// Host-vectorised loops: what the host members below run. A contiguous run of n elements is
// an Eigen array map (vectorised whatever the optimisation flags, exp and tanh included; the
// compiler's vector width: -mavx2 -mfma or -march=native make exp and tanh about four times
// faster than plain x86-64). Host code only: never called from a call operator.

namespace host_loops {

template <class T>
using array_map = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using const_array_map = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
array_map<T> as_array(T* p, std::size_t n) {
  return array_map<T>(p, static_cast<Eigen::Index>(n));
}
template <class T>
const_array_map<T> as_array(const T* p, std::size_t n) {
  return const_array_map<T>(p, static_cast<Eigen::Index>(n));
}
template <class T>
constexpr T minus_infinity = -std::numeric_limits<T>::infinity();

// y = exp(x - m) over n > 0 contiguous entries, exactly 0 where x is -infinity (Eigen's
// vectorised exp returns a tiny denormal there, which would slow the steps that follow;
// rows without -infinity skip the fix-up).
template <class T>
void exp_shifted(const T* x, T* y, std::size_t n, T m) {
  const auto xs = as_array(x, n);
  as_array(y, n) = (xs - m).exp();
  if (xs.minCoeff() == minus_infinity<T>) {
    for (std::size_t j = 0; j < n; ++j) y[j] = x[j] == minus_infinity<T> ? T(0) : y[j];
  }
}
// The log of the sum of exp over n > 0 contiguous entries, the max subtracted first.
template <class T>
T log_sum_exp(const T* x, std::size_t n) {
  const auto xs = as_array(x, n);
  const T m = xs.maxCoeff();
  return m + std::log((xs - m).exp().sum());  // -infinity adds a negligible tiny term
}

// A broadcast walk (see broadcast_map): the big shard as `rows` runs of `run` contiguous
// elements along its last group; f(big_first, small_first, step) per run, element j of the run
// at big_first + j and small_first + j * step (step a compile-time 1 or 0).
template <class F>
void for_each_run(const broadcast_map& m, F&& f) {
  if (m.groups == 0) return;
  const std::size_t last = m.groups - 1, run = m.extent[last];
  std::size_t rows = 1;
  for (std::size_t g = 0; g < last; ++g) rows *= m.extent[g];
  const auto walk = [&](auto step) {
    std::size_t index[max_dims] = {};
    std::size_t small = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      f(r * run, small, step);
      for (std::size_t g = last; g-- > 0;) {
        small += m.small_stride[g];
        if (++index[g] < m.extent[g]) break;
        small -= m.small_stride[g] * m.extent[g];
        index[g] = 0;
      }
    }
  };
  if (m.small_stride[last] != 0) {
    walk(std::integral_constant<std::size_t, 1>{});
  } else {
    walk(std::integral_constant<std::size_t, 0>{});
  }
}

// Strided rows (a walk along a dim that is not the last) through the kernel's call operator:
// true when it ran them, false for contiguous rows, which the caller vectorises.
template <class Kernel, class Walk>
bool strided_rows(const Kernel& k, const Walk& walk, std::size_t rows) {
  if (walk.inner == 1) return false;
  for (std::size_t r = 0; r < rows; ++r) k(r);
  return true;
}

}  // namespace host_loops

// ---------------------------------------------------------------------------------------
// Broadcasting and reductions.

// z[i] = x[i] (+ or *) y[small(i)].
template <class T, bool Multiply>
struct broadcast_combine {
  const T* x;
  const T* y;
  T* z;
  broadcast_map map;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const T b = y[map.small_of(i)];
    z[i] = Multiply ? x[i] * b : x[i] + b;
  }
  void host(std::size_t) const {
    using host_loops::as_array;
    const std::size_t n = map.extent[map.groups > 0 ? map.groups - 1 : 0];
    host_loops::for_each_run(map, [&](std::size_t b, std::size_t s, auto step) {
      const auto xs = as_array(x + b, n);
      auto zs = as_array(z + b, n);
      if constexpr (decltype(step)::value == 0) {
        if constexpr (Multiply) {
          zs = xs * y[s];
        } else {
          zs = xs + y[s];
        }
      } else if constexpr (Multiply) {
        zs = xs * as_array(y + s, n);
      } else {
        zs = xs + as_array(y + s, n);
      }
    });
  }
};
// big[i] = small[small(i)].
template <class T>
struct broadcast_expand {
  const T* small;
  T* big;
  broadcast_map map;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const { big[i] = small[map.small_of(i)]; }
  void host(std::size_t) const {
    using host_loops::as_array;
    const std::size_t n = map.extent[map.groups > 0 ? map.groups - 1 : 0];
    host_loops::for_each_run(map, [&](std::size_t b, std::size_t s, auto step) {
      if constexpr (decltype(step)::value == 0) {
        as_array(big + b, n).setConstant(small[s]);
      } else {
        as_array(big + b, n) = as_array(small + s, n);
      }
    });
  }
};
// small[s] = the sum of big (times weight, when set) over the big elements of s, in order.
// With chunk < absent_count, one call per (chunk c, small s) sums the c-th run of `chunk`
// terms into partial[c * smalls + s] instead (add_chunks then adds the chunks in order):
// a GPU then has chunks x smalls calls to run, not smalls, for a bias over many rows. The
// host member (one pass, chunk >= absent_count: zest::sum_chunk_of) adds whole runs.
template <class T>
struct broadcast_sum {
  const T* big;
  const T* weight;
  T* small;
  broadcast_map map;
  std::size_t chunk = static_cast<std::size_t>(-1), smalls = 0;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t s = chunk < map.absent_count ? i % smalls : i;
    const std::size_t c = chunk < map.absent_count ? i / smalls : 0;
    const std::size_t base = map.big_base(s);
    const std::size_t first = c * (chunk < map.absent_count ? chunk : 0);
    const std::size_t last = dmath::min(map.absent_count, first + chunk);
    T total = 0;
    for (std::size_t m = first; m < last; ++m) {
      const std::size_t b = base + map.big_offset(m);
      total += weight ? big[b] * weight[b] : big[b];
    }
    small[i] = total;
  }
  void host(std::size_t n_small) const {
    if (chunk < map.absent_count) {  // partial sums: the plain loop
      for (std::size_t i = 0; i < n_small; ++i) (*this)(i);
      return;
    }
    using host_loops::as_array;
    std::fill_n(small, n_small, T(0));
    const std::size_t n = map.extent[map.groups > 0 ? map.groups - 1 : 0];
    host_loops::for_each_run(map, [&](std::size_t b, std::size_t s, auto step) {
      const auto bs = as_array(big + b, n);
      if constexpr (decltype(step)::value == 0) {
        small[s] += weight ? (bs * as_array(weight + b, n)).sum() : bs.sum();
      } else if (weight) {
        as_array(small + s, n) += bs * as_array(weight + b, n);
      } else {
        as_array(small + s, n) += bs;
      }
    });
  }
};
// out[s] = the sum over c < chunks of partial[c * smalls + s], in order of c.
template <class T>
struct add_chunks {
  const T* partial;
  T* out;
  std::size_t smalls, chunks;
  ZEST_HOST_DEVICE void operator()(std::size_t s) const {
    T total = 0;
    for (std::size_t c = 0; c < chunks; ++c) total += partial[c * smalls + s];
    out[s] = total;
  }
};
// Terms per chunk of the two-pass sums above (a sum over fewer terms takes one pass).
inline constexpr std::size_t sum_chunk = 256;

// ---------------------------------------------------------------------------------------
// Elementwise, given an operation: autodiff::unary and autodiff::binary (op.hpp).
//
// Fn has value(x) and derivative(x, y) (dy/dx at x, y = value(x)), both ZEST_HOST_DEVICE;
// optionally host_value(x, y, n) and host_backward(x, y, dz, dx, n) over n contiguous host
// elements (dx = dz * derivative), which the host backend calls instead.

template <class T, class Fn>
struct unary_forward {
  const T* x;
  T* y;
  Fn fn;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const { y[i] = static_cast<T>(fn.value(x[i])); }
  void host(std::size_t n) const requires requires(const Fn& f, const T* a, T* b) {
    f.host_value(a, b, std::size_t{});
  }
  { fn.host_value(x, y, n); }
};
template <class T, class Fn>
struct unary_backward {
  const T* x;
  const T* y;
  const T* dz;
  T* dx;
  Fn fn;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    dx[i] = dz[i] * static_cast<T>(fn.derivative(x[i], y[i]));
  }
  void host(std::size_t n) const requires requires(const Fn& f, const T* a, T* b) {
    f.host_backward(a, a, a, b, std::size_t{});
  }
  { fn.host_backward(x, y, dz, dx, n); }
};
// Fn has value(a, b), derivative_first(a, b, z) and derivative_second(a, b, z).
template <class T, class Fn>
struct binary_forward {
  const T* a;
  const T* b;
  T* z;
  Fn fn;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    z[i] = static_cast<T>(fn.value(a[i], b[i]));
  }
};
// da = dz * dz/da (Second = false) or db = dz * dz/db.
template <class T, class Fn, bool Second>
struct binary_backward {
  const T* a;
  const T* b;
  const T* z;
  const T* dz;
  T* d;
  Fn fn;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    if constexpr (Second) {
      d[i] = dz[i] * static_cast<T>(fn.derivative_second(a[i], b[i], z[i]));
    } else {
      d[i] = dz[i] * static_cast<T>(fn.derivative_first(a[i], b[i], z[i]));
    }
  }
};
// out[i] = c[i] != 0 ? a[i] : b[i] (a or b null: 0 there).
template <class T, class C>
struct select {
  const C* c;
  const T* a;
  const T* b;
  T* out;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    out[i] = c[i] != C(0) ? (a ? a[i] : T(0)) : (b ? b[i] : T(0));
  }
};

// ---------------------------------------------------------------------------------------
// Elementwise nonlinear.

// GPT-2's gelu: 0.5 x (1 + tanh(c (x + a x^3))), c = sqrt(2 / pi), a = 0.044715.
struct gelu_fn {
  template <class T>
  ZEST_HOST_DEVICE T value(T v) const {
    const T c = T(0.7978845608028654), a = T(0.044715);
    return T(0.5) * v * (T(1) + dmath::tanh(c * (v + a * (v * v * v))));
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T v, T) const {
    const T c = T(0.7978845608028654), a = T(0.044715);
    const T t = dmath::tanh(c * (v + a * (v * v * v)));
    return T(0.5) * (T(1) + t) + T(0.5) * c * v * (T(1) - t * t) * (T(1) + T(3) * a * (v * v));
  }
  template <class T>
  void host_value(const T* x, T* y, std::size_t n) const {
    constexpr T c = T(0.7978845608028654), a = T(0.044715);
    const auto xs = host_loops::as_array(x, n);
    host_loops::as_array(y, n) = T(0.5) * xs * (T(1) + (c * (xs + a * xs.cube())).tanh());
  }
  template <class T>
  void host_backward(const T* x, const T*, const T* dz, T* dx, std::size_t n) const {
    constexpr T c = T(0.7978845608028654), a = T(0.044715);
    // Two passes per block of 4 KiB, the second while the first's tanh(u) is still in L1:
    // x, dz and dx cross the memory bus once each instead of twice. Blocks are whole numbers
    // of SIMD packets, so each element is computed as by one pass over all n.
    constexpr std::size_t block = 1024;
    for (std::size_t i = 0; i < n; i += block) {
      const std::size_t m = std::min(block, n - i);
      const auto xs = host_loops::as_array(x + i, m);
      auto t = host_loops::as_array(dx + i, m);
      t = (c * (xs + a * xs.cube())).tanh();  // dx holds tanh(u) for the second pass
      t = host_loops::as_array(dz + i, m) *
          (T(0.5) * (T(1) + t) +
           T(0.5) * c * xs * (T(1) - t.square()) * (T(1) + T(3) * a * xs.square()));
    }
  }
};

// out[i] = in[i] * scale where the draw for global index g(i) is at or above the threshold
// (ops.hpp's dropout_mask), 0 elsewhere.
template <class T>
struct dropout_apply {
  const T* in;
  T* out;
  global_index index;
  std::uint64_t key, threshold;
  T scale;
  ZEST_HOST_DEVICE bool keep(std::uint64_t g) const {
    return (splitmix64(key ^ g) >> 11) >= threshold;
  }
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    out[i] = in[i] * (keep(index(i)) ? scale : T(0));
  }
  // Runs along the last dim: one global index per run, the rest consecutive.
  void host(std::size_t n) const {
    const std::size_t run = index.rank == 0 ? 1 : index.local[index.rank - 1];
    if (run == 0) return;
    for (std::size_t l = 0; l < n; l += run) {
      const std::uint64_t g = index(l);
      for (std::size_t j = 0; j < run; ++j) out[l + j] = in[l + j] * (keep(g + j) ? scale : T(0));
    }
  }
};

// ---------------------------------------------------------------------------------------
// Along one dim: one call per row. The host members run contiguous rows (inner == 1) as Eigen
// array expressions and strided rows through the call operator.

// Softmax (Log = false) or log-softmax of a row (autodiff::rowwise's function object; the
// causal softmax runs it on each row's window, the masked entries 0 or -infinity).
// Backward: from y = softmax, dx = y (dz - sum(dz y)); from y = log-softmax,
// dx = dz - exp(y) sum(dz).
template <bool Log>
struct softmax_fn {
  template <class T>
  static ZEST_HOST_DEVICE T masked_value() {
    return Log ? -dmath::infinity<T>() : T(0);
  }
  template <class T>
  ZEST_HOST_DEVICE void forward(row<const T> x, row<T> y) const {
    const std::size_t n = x.size();
    T m = -dmath::infinity<T>();
    for (std::size_t j = 0; j < n; ++j) m = dmath::max(m, x[j]);
    T sum = 0;
    if (Log) {
      for (std::size_t j = 0; j < n; ++j) sum += dmath::exp(x[j] - m);
      const T lse = m + dmath::log(sum);
      for (std::size_t j = 0; j < n; ++j) y[j] = x[j] - lse;
    } else {
      for (std::size_t j = 0; j < n; ++j) {
        const T e = dmath::exp(x[j] - m);
        y[j] = e;
        sum += e;
      }
      const T r = T(1) / sum;
      for (std::size_t j = 0; j < n; ++j) y[j] *= r;
    }
  }
  template <class T>
  ZEST_HOST_DEVICE void backward(row<const T>, row<const T> y, row<const T> dz, row<T> dx) const {
    const std::size_t n = y.size();
    T total = 0;
    for (std::size_t j = 0; j < n; ++j) total += Log ? dz[j] : dz[j] * y[j];
    for (std::size_t j = 0; j < n; ++j) {
      dx[j] = Log ? dz[j] - dmath::exp(y[j]) * total : y[j] * (dz[j] - total);
    }
  }
  template <class T>
  void host_forward(const T* x, T* y, std::size_t n) const {
    using host_loops::as_array;
    if constexpr (Log) {
      as_array(y, n) = as_array(x, n) - host_loops::log_sum_exp(x, n);
    } else {
      host_loops::exp_shifted(x, y, n, as_array(x, n).maxCoeff());
      auto ys = as_array(y, n);
      ys *= T(1) / ys.sum();
    }
  }
  template <class T>
  void host_backward(const T*, const T* y, const T* dz, T* dx, std::size_t n) const {
    using host_loops::as_array;
    const auto ys = as_array(y, n);
    const auto dzs = as_array(dz, n);
    if constexpr (Log) {
      const T total = dzs.sum();
      host_loops::exp_shifted(y, dx, n, T(0));
      as_array(dx, n) = dzs - as_array(dx, n) * total;
    } else {
      const T dot = (dzs * ys).sum();
      as_array(dx, n) = ys * (dzs - dot);
    }
  }
};
// Softmax of each row over the entries it keeps: those inside the row's causal window (all of
// them when the window is not masked) whose mask element, mask[map.small_of(i)] for entry i
// of the shard, is nonzero. The other entries get 0, and a row that keeps no entry (or only
// entries of -infinity) is all zeros, not NaN. The backward is softmax_fn<false>'s: y is 0
// where an entry was dropped, so its gradient is 0 there.
template <class T, class C>
struct masked_softmax_rows {
  const T* x;
  const C* mask;
  T* y;
  shard_rows walk;
  causal_window window;
  broadcast_map map;
  ZEST_HOST_DEVICE bool keeps(std::size_t i, std::size_t j, std::size_t lo, std::size_t hi) const {
    return j >= lo && j < hi && mask[map.small_of(i)] != C(0);
  }
  ZEST_HOST_DEVICE void operator()(std::size_t r) const {
    const std::size_t f = walk.first(r), s = walk.inner, n = walk.n;
    std::size_t lo = 0, hi = n;
    window.kept(r, lo, hi);
    T m = -dmath::infinity<T>();
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t i = f + j * s;
      if (keeps(i, j, lo, hi)) m = dmath::max(m, x[i]);
    }
    if (!(m > -dmath::infinity<T>())) {
      for (std::size_t j = 0; j < n; ++j) y[f + j * s] = T(0);
      return;
    }
    T sum = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t i = f + j * s;
      const T e = keeps(i, j, lo, hi) ? dmath::exp(x[i] - m) : T(0);
      y[i] = e;
      sum += e;
    }
    const T inverse = T(1) / sum;
    for (std::size_t j = 0; j < n; ++j) y[f + j * s] *= inverse;
  }
};

// out = in inside each row's causal window, `fill` outside.
template <class T>
struct causal_mask_rows {
  const T* in;
  T* out;
  shard_rows walk;
  causal_window window;
  T fill;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner;
    std::size_t lo = 0, hi = walk.n;
    window.kept(row, lo, hi);
    for (std::size_t j = 0; j < walk.n; ++j) out[f + j * s] = j < hi ? in[f + j * s] : fill;
  }
};

// y = (x - mean) * rstd * gamma + beta; keeps each row's mean and rstd = 1/sqrt(var + eps).
template <class T>
struct layer_norm_rows {
  const T* x;
  const T* gamma;
  const T* beta;
  T* y;
  T* mean;
  T* rstd;
  shard_rows walk;
  T eps;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner, n = walk.n;
    const T inv_n = T(1) / static_cast<T>(n > 0 ? n : 1);
    T sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += x[f + j * s];
    const T mu = sum * inv_n;
    T var = 0;
    for (std::size_t j = 0; j < n; ++j) var += (x[f + j * s] - mu) * (x[f + j * s] - mu);
    const T r = T(1) / dmath::sqrt(var * inv_n + eps);
    for (std::size_t j = 0; j < n; ++j) y[f + j * s] = (x[f + j * s] - mu) * r * gamma[j] + beta[j];
    mean[row] = mu;
    rstd[row] = r;
  }
  void host(std::size_t rows) const {
    if (host_loops::strided_rows(*this, walk, rows)) return;
    using host_loops::as_array;
    const std::size_t n = walk.n;
    const T inv_n = T(1) / static_cast<T>(std::max<std::size_t>(n, 1));
    for (std::size_t row = 0; row < rows; ++row) {
      const auto xs = as_array(x + row * n, n);
      const T mu = xs.sum() * inv_n;
      const T r = T(1) / std::sqrt((xs - mu).square().sum() * inv_n + eps);
      as_array(y + row * n, n) = (xs - mu) * r * as_array(gamma, n) + as_array(beta, n);
      mean[row] = mu;
      rstd[row] = r;
    }
  }
};
// dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), xhat = (x - mean) rstd, dxhat =
// dz gamma.
template <class T>
struct layer_norm_backward_rows {
  const T* x;
  const T* dz;
  const T* gamma;
  const T* mean;
  const T* rstd;
  T* dx;
  shard_rows walk;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner, n = walk.n;
    const T inv_n = T(1) / static_cast<T>(n > 0 ? n : 1);
    const T mu = mean[row], r = rstd[row];
    T mean_d = 0, mean_dx = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const T xhat = (x[f + j * s] - mu) * r;
      const T dxhat = dz[f + j * s] * gamma[j];
      mean_d += dxhat;
      mean_dx += dxhat * xhat;
    }
    mean_d *= inv_n;
    mean_dx *= inv_n;
    for (std::size_t j = 0; j < n; ++j) {
      const T xhat = (x[f + j * s] - mu) * r;
      dx[f + j * s] = r * (dz[f + j * s] * gamma[j] - mean_d - xhat * mean_dx);
    }
  }
  void host(std::size_t rows) const {
    if (host_loops::strided_rows(*this, walk, rows)) return;
    using host_loops::as_array;
    const std::size_t n = walk.n;
    const T inv_n = T(1) / static_cast<T>(std::max<std::size_t>(n, 1));
    for (std::size_t row = 0; row < rows; ++row) {
      const T mu = mean[row], r = rstd[row];
      const auto xhat = (as_array(x + row * n, n) - mu) * r;
      const auto dxhat = as_array(dz + row * n, n) * as_array(gamma, n);
      const T mean_d = dxhat.sum() * inv_n;
      const T mean_dx = (dxhat * xhat).sum() * inv_n;
      as_array(dx + row * n, n) = r * (dxhat - mean_d - xhat * mean_dx);
    }
  }
};
// dgamma[j] = sum over rows of dz xhat, dbeta[j] = sum of dz: one call per (chunk of
// `chunk` rows c, column j), rows in order, into dgamma[c * n + j] and dbeta[c * n + j]
// (add_chunks adds the chunks when there are several). The host member (one chunk) adds
// whole rows.
template <class T>
struct layer_norm_parameter_grads {
  const T* x;
  const T* dz;
  const T* mean;
  const T* rstd;
  T* dgamma;
  T* dbeta;
  shard_rows walk;
  std::size_t rows, n, chunk;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t c = i / n, j = i % n;
    const std::size_t last = dmath::min(rows, (c + 1) * chunk);
    T g = 0, b = 0;
    for (std::size_t row = c * chunk; row < last; ++row) {
      const std::size_t k = walk.first(row) + j * walk.inner;
      g += dz[k] * ((x[k] - mean[row]) * rstd[row]);
      b += dz[k];
    }
    dgamma[i] = g;
    dbeta[i] = b;
  }
  void host(std::size_t count) const {
    if (walk.inner != 1 || chunk < rows) {
      for (std::size_t i = 0; i < count; ++i) (*this)(i);
      return;
    }
    using host_loops::as_array;
    std::fill_n(dgamma, n, T(0));
    std::fill_n(dbeta, n, T(0));
    for (std::size_t row = 0; row < rows; ++row) {
      const auto dzs = as_array(dz + row * n, n);
      as_array(dgamma, n) += dzs * ((as_array(x + row * n, n) - mean[row]) * rstd[row]);
      as_array(dbeta, n) += dzs;
    }
  }
};

// ---------------------------------------------------------------------------------------
// Lookups and the loss.

// y[p][j] = table[ids[p]][j], `width` features per row (ids already checked). The table holds
// rows [first_row, first_row + rows) of the whole (all of them unless its rows are split); an
// id outside that block gives a row of zeros.
template <class T>
struct embedding_gather {
  const T* table;
  const std::int32_t* ids;
  T* y;
  std::size_t width;
  std::size_t first_row = 0, rows = 0;
  ZEST_HOST_DEVICE const T* row(std::size_t p) const {
    const auto id = static_cast<std::size_t>(ids[p]);
    return id >= first_row && id - first_row < rows ? table + (id - first_row) * width : nullptr;
  }
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t p = i / width, j = i % width;
    const T* r = row(p);
    y[i] = r != nullptr ? r[j] : T{};
  }
  void host(std::size_t n) const {
    if (width == 0) return;
    for (std::size_t p = 0; p < n / width; ++p) {
      const T* r = row(p);
      if (r != nullptr) {
        std::copy_n(r, width, y + p * width);
      } else {
        std::fill_n(y + p * width, width, T{});
      }
    }
  }
};
// grad[r][j] = the sum of dz[p][j] over the positions p whose id is r, in order: one call
// per table element. The positions of row r are order[first[r]] .. order[first[r + 1] - 1]
// (the ids sorted by row, stably, on the host where they were checked).
template <class T>
struct embedding_scatter {
  const T* dz;
  const std::size_t* first;
  const std::size_t* order;
  T* grad;
  std::size_t width;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t r = i / width, j = i % width;
    T total = 0;
    for (std::size_t k = first[r]; k < first[r + 1]; ++k) total += dz[order[k] * width + j];
    grad[i] = total;
  }
  void host(std::size_t n) const {
    if (width == 0) return;
    using host_loops::as_array;
    for (std::size_t r = 0; r < n / width; ++r) {
      auto row = as_array(grad + r * width, width);
      row.setZero();
      for (std::size_t k = first[r]; k < first[r + 1]; ++k)
        row += as_array(dz + order[k] * width, width);
    }
  }
};

// lse[row] = log(sum(exp(x))) over the row, the max subtracted first.
template <class T>
struct log_sum_exp_rows {
  const T* x;
  T* lse;
  shard_rows walk;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner, n = walk.n;
    T m = -dmath::infinity<T>();
    for (std::size_t j = 0; j < n; ++j) m = dmath::max(m, x[f + j * s]);
    T sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += dmath::exp(x[f + j * s] - m);
    lse[row] = m + dmath::log(sum);
  }
  void host(std::size_t rows) const {
    if (host_loops::strided_rows(*this, walk, rows)) return;
    for (std::size_t row = 0; row < rows; ++row)
      lse[row] = host_loops::log_sum_exp(x + row * walk.n, walk.n);
  }
};
// The pieces of a log-sum-exp whose row is split over ranks (cross_entropy with V split):
// this rank's row maxima, then, with the maxima of the whole rows, its sums of exp(x - max),
// and, with both summed over the ranks, lse = max + log(sum) in place of the sum.
template <class T>
struct row_max {
  const T* x;
  T* out;
  shard_rows walk;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner;
    T m = -dmath::infinity<T>();
    for (std::size_t j = 0; j < walk.n; ++j) m = dmath::max(m, x[f + j * s]);
    out[row] = m;
  }
};
template <class T>
struct sum_exp_rows {
  const T* x;
  const T* max;
  T* out;
  shard_rows walk;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner;
    T sum = 0;
    for (std::size_t j = 0; j < walk.n; ++j) sum += dmath::exp(x[f + j * s] - max[row]);
    out[row] = sum;
  }
};
template <class T>
struct max_plus_log {
  const T* max;
  T* sum;  // in: the sum of exponentials; out: lse
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    sum[row] = max[row] + dmath::log(sum[row]);
  }
};
// out[row] = x[target] where this rank holds the target's class (classes [first_class,
// first_class + walk.n)), else 0.
template <class T>
struct target_logit {
  const T* x;
  const std::int32_t* targets;
  T* out;
  shard_rows walk;
  std::size_t first_class;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const auto t = static_cast<std::size_t>(targets[row]);
    out[row] = t >= first_class && t - first_class < walk.n
                   ? x[walk.first(row) + (t - first_class) * walk.inner]
                   : T{};
  }
};
// a[i] - b[i], for Backend::sum.
template <class T>
struct difference {
  const T* a;
  const T* b;
  ZEST_HOST_DEVICE T operator()(std::size_t i) const { return a[i] - b[i]; }
};
// A row's loss, lse - x[target], for Backend::sum.
template <class T>
struct cross_entropy_terms {
  const T* x;
  const T* lse;
  const std::int32_t* targets;
  shard_rows walk;
  ZEST_HOST_DEVICE double operator()(std::size_t row) const {
    const std::size_t t = static_cast<std::size_t>(targets[row]);
    return static_cast<double>(lse[row] - x[walk.first(row) + t * walk.inner]);
  }
};
// dx = (exp(x - lse) - onehot(target)) * scale, one call per element; the host member a row
// at a time. This rank's rows hold classes [first_class, first_class + walk.n).
template <class T>
struct cross_entropy_backward {
  const T* x;
  const T* lse;
  const std::int32_t* targets;
  T* dx;
  shard_rows walk;
  T scale;
  std::size_t first_class = 0;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t row = walk.row_of(i);
    const T d = dmath::exp(x[i] - lse[row]) * scale;
    dx[i] =
        first_class + walk.position_of(i) == static_cast<std::size_t>(targets[row]) ? d - scale : d;
  }
  void host(std::size_t count) const {
    if (walk.inner != 1 || walk.n == 0) {
      for (std::size_t i = 0; i < count; ++i) (*this)(i);
      return;
    }
    using host_loops::as_array;
    const std::size_t n = walk.n;
    for (std::size_t row = 0; row < count / n; ++row) {
      as_array(dx + row * n, n) = (as_array(x + row * n, n) - lse[row]).exp() * scale;
      const auto t = static_cast<std::size_t>(targets[row]);
      if (t >= first_class && t - first_class < n) dx[row * n + (t - first_class)] -= scale;
    }
  }
};

}  // namespace zest::autodiff::kernels
