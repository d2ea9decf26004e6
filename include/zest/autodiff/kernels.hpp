// zest/autodiff/kernels.hpp — the loop bodies of autodiff on every backend but the host one.
//
//   B::for_each(y.local_count(), kernels::gelu_forward<T>{x, y});     // y[i] = gelu(x[i])
//   B::for_each(rows, kernels::softmax_rows<T, false>{x, y, walk, window});  // one row per call
//
// The host backend runs tape.hpp's and ops.hpp's own loops (Eigen array expressions where
// they are vectorised); every other backend runs these function objects through
// Backend::for_each and Backend::sum (zest/backend/backend.hpp), as CUDA kernels on the GPU.
// Each is a small trivially copyable struct of raw pointers, sizes and scalars whose call
// operator is ZEST_HOST_DEVICE: no exceptions, no allocation, dmath instead of std::exp.
//
// Determinism: no atomics. A sum that the host accumulates element by element (a bias's or
// layer norm's parameter gradient, an embedding table's rows) is one call per output element
// that loops over its inputs in the host's order, so the emulated backend reproduces the
// host's sums where the host's loop is not vectorised.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zest/config.hpp"
#include "zest/core/device_math.hpp"
#include "zest/core/random.hpp"

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

// ---------------------------------------------------------------------------------------
// Walks of a local shard.

// A shard as [outer][n][inner] around one dim: row r = o * inner + k (the host's numbering,
// ops.hpp's for_each_row) starts at o * n * inner + k; its elements are `inner` apart.
struct row_walk {
  std::size_t n = 1, inner = 1;
  ZEST_HOST_DEVICE std::size_t first(std::size_t row) const {
    return (row / inner) * n * inner + row % inner;
  }
  // The row of element i, and i's position j < n in it.
  ZEST_HOST_DEVICE std::size_t row_of(std::size_t i) const {
    return (i / (n * inner)) * inner + i % inner;
  }
  ZEST_HOST_DEVICE std::size_t position_of(std::size_t i) const { return (i / inner) % n; }
};

// The entries [lo, hi) of a row that a causal mask keeps (all of them when not masked): a
// prefix along K (global k <= global q), a suffix along Q (global q >= global k). The other
// dim's local index in row r is ((outer ? r / inner : r % inner) / div) % extent.
struct causal_window {
  bool masked = false, along_k = true, in_outer = true;
  std::size_t inner = 1, div = 1, extent = 1;
  std::size_t other_offset = 0, own_offset = 0, n = 0;
  ZEST_HOST_DEVICE void kept(std::size_t row, std::size_t& lo, std::size_t& hi) const {
    lo = 0;
    hi = n;
    if (!masked) return;
    const std::size_t other = ((in_outer ? row / inner : row % inner) / div) % extent;
    const long long g = static_cast<long long>(other_offset + other);
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
};
// big[i] = small[small(i)].
template <class T>
struct broadcast_expand {
  const T* small;
  T* big;
  broadcast_map map;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const { big[i] = small[map.small_of(i)]; }
};
// small[s] = the sum of big (times weight, when set) over the big elements of s, in order.
// With chunk < absent_count, one call per (chunk c, small s) sums the c-th run of `chunk`
// terms into partial[c * smalls + s] instead (add_chunks then adds the chunks in order):
// a GPU then has chunks x smalls calls to run, not smalls, for a bias over many rows.
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
// Elementwise nonlinear.

// GPT-2's gelu: 0.5 x (1 + tanh(c (x + a x^3))), c = sqrt(2 / pi), a = 0.044715.
template <class T>
struct gelu_forward {
  const T* x;
  T* y;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const T c = T(0.7978845608028654), a = T(0.044715), v = x[i];
    y[i] = T(0.5) * v * (T(1) + dmath::tanh(c * (v + a * (v * v * v))));
  }
};
template <class T>
struct gelu_backward {
  const T* x;
  const T* dz;
  T* dx;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const T c = T(0.7978845608028654), a = T(0.044715), v = x[i];
    const T t = dmath::tanh(c * (v + a * (v * v * v)));
    dx[i] = dz[i] *
            (T(0.5) * (T(1) + t) + T(0.5) * c * v * (T(1) - t * t) * (T(1) + T(3) * a * (v * v)));
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
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const bool keep = (splitmix64(key ^ index(i)) >> 11) >= threshold;
    out[i] = in[i] * (keep ? scale : T(0));
  }
};

// ---------------------------------------------------------------------------------------
// Along one dim: one call per row.

// Softmax (Log = false) or log-softmax of each row over its window; masked entries get 0
// (or -infinity).
template <class T, bool Log>
struct softmax_rows {
  const T* x;
  T* y;
  row_walk walk;
  causal_window window;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner, n = walk.n;
    std::size_t lo = 0, hi = n;
    window.kept(row, lo, hi);
    const T fill = Log ? -dmath::infinity<T>() : T(0);
    for (std::size_t j = 0; j < lo; ++j) y[f + j * s] = fill;
    for (std::size_t j = hi; j < n; ++j) y[f + j * s] = fill;
    if (lo >= hi) return;
    T m = -dmath::infinity<T>();
    for (std::size_t j = lo; j < hi; ++j) m = dmath::max(m, x[f + j * s]);
    T sum = 0;
    if (Log) {
      for (std::size_t j = lo; j < hi; ++j) sum += dmath::exp(x[f + j * s] - m);
      const T lse = m + dmath::log(sum);
      for (std::size_t j = lo; j < hi; ++j) y[f + j * s] = x[f + j * s] - lse;
    } else {
      for (std::size_t j = lo; j < hi; ++j) {
        const T e = dmath::exp(x[f + j * s] - m);
        y[f + j * s] = e;
        sum += e;
      }
      const T r = T(1) / sum;
      for (std::size_t j = lo; j < hi; ++j) y[f + j * s] *= r;
    }
  }
};
// From y = softmax: dx = y (dz - sum(dz y)); from y = log-softmax: dx = dz - exp(y) sum(dz).
template <class T, bool Log>
struct softmax_backward_rows {
  const T* y;
  const T* dz;
  T* dx;
  row_walk walk;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner, n = walk.n;
    T total = 0;
    for (std::size_t j = 0; j < n; ++j) total += Log ? dz[f + j * s] : dz[f + j * s] * y[f + j * s];
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t i = f + j * s;
      dx[i] = Log ? dz[i] - dmath::exp(y[i]) * total : y[i] * (dz[i] - total);
    }
  }
};
// out = in inside each row's causal window, `fill` outside.
template <class T>
struct causal_mask_rows {
  const T* in;
  T* out;
  row_walk walk;
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
  row_walk walk;
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
  row_walk walk;
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
};
// dgamma[j] = sum over rows of dz xhat, dbeta[j] = sum of dz: one call per (chunk of
// `chunk` rows c, column j), rows in order, into dgamma[c * n + j] and dbeta[c * n + j]
// (add_chunks adds the chunks when there are several).
template <class T>
struct layer_norm_parameter_grads {
  const T* x;
  const T* dz;
  const T* mean;
  const T* rstd;
  T* dgamma;
  T* dbeta;
  row_walk walk;
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
};

// ---------------------------------------------------------------------------------------
// Lookups and the loss.

// y[p][j] = table[ids[p]][j], `width` features per row (ids already checked).
template <class T>
struct embedding_gather {
  const T* table;
  const std::int32_t* ids;
  T* y;
  std::size_t width;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t p = i / width, j = i % width;
    y[i] = table[static_cast<std::size_t>(ids[p]) * width + j];
  }
};
// grad[r][j] = the sum of dz[p][j] over the positions p whose id is r, in order: one call
// per table element. The positions of row r are order[first[r]] .. order[first[r + 1] - 1]
// (the ids sorted by row, stably, on the host where they were checked).
template <class T>
struct embedding_scatter {
  const T* dz;
  const std::uint32_t* first;
  const std::uint32_t* order;
  T* grad;
  std::size_t width;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t r = i / width, j = i % width;
    T total = 0;
    for (std::uint32_t k = first[r]; k < first[r + 1]; ++k)
      total += dz[static_cast<std::size_t>(order[k]) * width + j];
    grad[i] = total;
  }
};

// lse[row] = log(sum(exp(x))) over the row, the max subtracted first.
template <class T>
struct log_sum_exp_rows {
  const T* x;
  T* lse;
  row_walk walk;
  ZEST_HOST_DEVICE void operator()(std::size_t row) const {
    const std::size_t f = walk.first(row), s = walk.inner, n = walk.n;
    T m = -dmath::infinity<T>();
    for (std::size_t j = 0; j < n; ++j) m = dmath::max(m, x[f + j * s]);
    T sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += dmath::exp(x[f + j * s] - m);
    lse[row] = m + dmath::log(sum);
  }
};
// A row's loss, lse - x[target], for Backend::sum.
template <class T>
struct cross_entropy_terms {
  const T* x;
  const T* lse;
  const std::int32_t* targets;
  row_walk walk;
  ZEST_HOST_DEVICE double operator()(std::size_t row) const {
    const std::size_t t = static_cast<std::size_t>(targets[row]);
    return static_cast<double>(lse[row] - x[walk.first(row) + t * walk.inner]);
  }
};
// dx = (exp(x - lse) - onehot(target)) * scale, one call per element.
template <class T>
struct cross_entropy_backward {
  const T* x;
  const T* lse;
  const std::int32_t* targets;
  T* dx;
  row_walk walk;
  T scale;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t row = walk.row_of(i);
    const T d = dmath::exp(x[i] - lse[row]) * scale;
    dx[i] = walk.position_of(i) == static_cast<std::size_t>(targets[row]) ? d - scale : d;
  }
};

}  // namespace zest::autodiff::kernels
