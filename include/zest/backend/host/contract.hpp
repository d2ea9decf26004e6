// zest/backend/host/contract.hpp — the host backend's local einsum over one or two dense
// row-major operands (the per-rank step of every distributed einsum).
//
//   std::size_t xe[] = {8, 512, 512}, we[] = {256, 512}, oe[] = {8, 256, 512};
//   zest::host::operand_view<float> ops[] = {{x, "bsm", xe}, {w, "hm", we}};
//   zest::host::contract<float>(ops, "bhs", out, oe);  // out[b][h][s] = sum_m x[b][s][m] w[h][m]
//
// Semantics are numpy.einsum with an explicit output. Labels of two operands play roles:
//   batch      in both operands and the output   (b in "bij,bjk->bik")
//   free       in one operand and the output     (i, k)
//   contracted in both operands, not the output  (j)
//   summed     in one operand only, not output   (summed out of that operand first)
//
// How it is fast: a contraction is a strided batched GEMM whenever each of the groups
// M (free dims of one operand), N (free dims of the other, innermost in the output) and
// K (contracted) is contiguous in every tensor that holds it. Transposes are then BLAS
// flags, leading dimensions absorb gaps, and every other output dim becomes a batch loop
// whose stride is 0 in the operand that lacks it. "bsm,hm->bhs" is thus 8 GEMMs
// (h x m) * (s x m)^T with w shared, and nothing is copied. Only when a group is not
// contiguous is a tensor permuted; a small cost model picks which ones (if any).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "zest/backend/host/gemm.hpp"
#include "zest/backend/host/permute.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/error.hpp"

namespace zest::host {

template <class T>
struct operand_view {
  const T* data;
  std::string_view labels;
  std::span<const std::size_t> extents;
};

namespace detail {

inline constexpr std::size_t no_dim = static_cast<std::size_t>(-1);

// Scratch buffers kept per thread and reused across calls: a fresh large allocation costs a
// page fault per 4 KiB, about as much as the permute that fills it. Slots are fixed uses
// within one contract call, so buffers that are live together never alias.
enum scratch_slot : std::size_t {
  reduced_x,
  reduced_y,
  permuted_x,
  permuted_y,
  permuted_z,
  bf16_x,
  bf16_y,
  bf16_z,
  slot_count
};
template <class T>
struct scratch_cache {
  std::array<std::unique_ptr<T[]>, slot_count> data;
  std::array<std::size_t, slot_count> size{};
};
template <class T>
scratch_cache<T>& thread_scratch() {
  thread_local scratch_cache<T> cache;
  return cache;
}
// An uninitialised buffer of at least n elements.
template <class T>
T* scratch(scratch_slot slot, std::size_t n) {
  auto& cache = thread_scratch<T>();
  if (cache.size[slot] < n) {
    cache.data[slot].reset();
    cache.data[slot] = std::make_unique_for_overwrite<T[]>(n);
    cache.size[slot] = n;
  }
  return cache.data[slot].get();
}

// A tensor as the planner sees it: its dims outermost first, with extent-1 dims dropped
// (they never move an offset, and dropping them lets more groups count as contiguous).
struct tensor_layout {
  std::size_t rank = 0;
  std::array<char, max_dims> label{};
  std::array<std::size_t, max_dims> extent{};
  std::array<std::size_t, max_dims> stride{};

  [[nodiscard]] std::size_t find(char l) const {
    for (std::size_t d = 0; d < rank; ++d) {
      if (label[d] == l) return d;
    }
    return no_dim;
  }
  [[nodiscard]] bool has(char l) const { return find(l) != no_dim; }
  [[nodiscard]] std::size_t stride_of(char l) const {
    const auto d = find(l);
    return d == no_dim ? 0 : stride[d];
  }
  [[nodiscard]] std::size_t size() const {
    std::size_t n = 1;
    for (std::size_t d = 0; d < rank; ++d) n *= extent[d];
    return n;
  }
  [[nodiscard]] std::string_view labels() const { return {label.data(), rank}; }
};

// The layout of a dense tensor: labels "ijk", extents (2,1,4) -> dims i:(2,4), k:(4,1).
inline tensor_layout dense_layout(std::string_view labels, std::span<const std::size_t> extents) {
  tensor_layout t;
  const auto strides = dense_strides(extents);
  for (std::size_t d = 0; d < labels.size(); ++d) {
    if (extents[d] == 1) continue;
    t.label[t.rank] = labels[d];
    t.extent[t.rank] = extents[d];
    t.stride[t.rank] = strides[d];
    ++t.rank;
  }
  return t;
}

// A dense tensor whose dims are `labels` in that order, extents taken from `of`.
inline tensor_layout dense_layout_like(std::string_view labels, const tensor_layout& of) {
  tensor_layout t;
  t.rank = labels.size();
  std::size_t s = 1;
  for (std::size_t d = t.rank; d-- > 0;) {
    t.label[d] = labels[d];
    t.extent[d] = of.extent[of.find(labels[d])];
    t.stride[d] = s;
    s *= t.extent[d];
  }
  return t;
}

// Copies (or adds) a tensor into another layout of the same dims, writing sequentially.
template <bool Add, class T>
void relayout(const tensor_layout& from, const T* src, const tensor_layout& to, T* dst) {
  strided_walk w;
  for (std::size_t d = 0; d < to.rank; ++d)
    w.push(to.extent[d], from.stride_of(to.label[d]), to.stride[d]);
  copy_strided<Add>(w, src, dst);
}

// Sums `from` over its dims missing in `to` and adds the result into dst.
template <class T>
void reduce_into(const tensor_layout& from, const T* src, const tensor_layout& to, T* dst) {
  strided_walk w;
  for (std::size_t d = 0; d < from.rank; ++d)
    w.push(from.extent[d], from.stride[d], to.stride_of(from.label[d]));
  reduce_strided(w, src, dst);
}

// Output dims that the GEMMs do not cover, looped over; strides into gemm A, B and C.
struct loop_nest {
  std::size_t rank = 0;
  std::array<std::size_t, max_dims> extent{};
  std::array<std::size_t, max_dims> a{}, b{}, c{};

  void push(std::size_t e, std::size_t sa, std::size_t sb, std::size_t sc) {
    if (rank > 0 && a[rank - 1] == sa * e && b[rank - 1] == sb * e && c[rank - 1] == sc * e) {
      // Contiguous with the previous loop in all three tensors: one longer loop.
      extent[rank - 1] *= e;
      a[rank - 1] = sa;
      b[rank - 1] = sb;
      c[rank - 1] = sc;
      return;
    }
    extent[rank] = e;
    a[rank] = sa;
    b[rank] = sb;
    c[rank] = sc;
    ++rank;
  }
  [[nodiscard]] std::size_t count() const {
    std::size_t n = 1;
    for (std::size_t d = 0; d < rank; ++d) n *= extent[d];
    return n;
  }
};

// One strided batched GEMM (per index of the outer loops) computing the contraction.
struct gemm_plan {
  bool valid = false;
  bool swap = false;  // gemm's A is the second operand (the first one gives N)
  bool trans_a = false, trans_b = false;
  std::size_t m = 1, n = 1, k = 1, lda = 1, ldb = 1, ldc = 1;
  loop_nest loops;
  double cost = std::numeric_limits<double>::infinity();
};

// Rough time in ns, only to rank plans: GEMMs lose efficiency on thin shapes (a GEMV is
// memory-bound) and pay a per-call overhead; a permute pays about a nanosecond per element.
inline double gemm_cost(std::size_t m, std::size_t n, std::size_t k, std::size_t calls) {
  const double dm = double(m), dn = double(n), dk = double(k);
  const double efficiency = (dm / (dm + 4)) * (dn / (dn + 4)) * (dk / (dk + 8));
  const double overhead = m * n * k <= small_gemm_volume ? 20.0 : 300.0;
  return double(calls) * (2 * dm * dn * dk / (16 * efficiency) + overhead);
}
inline constexpr double permute_cost_per_element = 1.0;

// How a matrix op(X) with rows (extent r, stride sr) and cols (extent c, stride sc) is
// passed to a row-major GEMM: cols unit-stride -> as is, ld = sr; rows unit-stride ->
// transposed, ld = sc. Extent-1 groups have no stride and fit either way.
struct orientation {
  bool ok = false, trans = false;
  std::size_t ld = 1;
};
inline orientation orient(std::size_t r, std::size_t sr, std::size_t c, std::size_t sc) {
  if (c == 1 || sc == 1) return {true, false, r == 1 ? c : sr};
  if (r == 1 || sr == 1) return {true, true, sc};
  return {};
}

// Finds the cheapest direct GEMM plan on these layouts, or one with valid == false.
// Every dim of x and y is in the output or in both operands (summed dims are gone).
inline gemm_plan plan_direct(const tensor_layout& x, const tensor_layout& y,
                             const tensor_layout& z) {
  gemm_plan best;
  const std::size_t z_size = z.size();
  for (const bool swap : {false, true}) {
    const tensor_layout& p = swap ? y : x;  // gives M, gemm's A
    const tensor_layout& q = swap ? x : y;  // gives N, gemm's B
    // K: contracted dims in p's order, which must be a contiguous chain in p and in q.
    std::size_t k = 1, skp = 0, skq = 0;
    bool first = true, k_ok = true;
    for (std::size_t d = 0; d < p.rank && k_ok; ++d) {
      const char l = p.label[d];
      if (!q.has(l) || z.has(l)) continue;
      const std::size_t e = p.extent[d], sp = p.stride[d], sq = q.stride_of(l);
      if (!first) k_ok = skp == sp * e && skq == sq * e;
      first = false;
      k *= e;
      skp = sp;
      skq = sq;
    }
    if (!k_ok) return best;  // the same test fails with the roles swapped
    // N: the longest run of q-only dims at the inside of the output, contiguous in q.
    std::size_t n_begin = z.rank;
    while (n_begin > 0) {
      const char l = z.label[n_begin - 1];
      if (!q.has(l) || p.has(l)) break;
      if (n_begin < z.rank) {
        const char inner = z.label[n_begin];
        if (q.stride_of(l) != q.stride_of(inner) * z.extent[n_begin]) break;
      }
      --n_begin;
    }
    for (const bool use_n : {true, false}) {
      if (!use_n && n_begin == z.rank) continue;  // the empty group was tried already
      const std::size_t n_lo = use_n ? n_begin : z.rank;
      std::size_t n = 1;
      for (std::size_t d = n_lo; d < z.rank; ++d) n *= z.extent[d];
      const std::size_t snq = n > 1 ? q.stride_of(z.label[z.rank - 1]) : 0;
      const orientation ob = orient(k, skq, n, snq);
      if (!ob.ok) continue;
      // M: any run [i, j] of p-only output dims, contiguous in p; [i, i) is the empty run.
      for (std::size_t i = 0; i <= n_lo; ++i) {
        for (std::size_t j = i; j <= n_lo; ++j) {
          if (j > i) {
            const char l = z.label[j - 1];
            if (j - 1 >= n_lo || !p.has(l) || q.has(l)) break;
            if (j - 1 > i && p.stride_of(z.label[j - 2]) != p.stride_of(l) * z.extent[j - 1]) break;
          }
          if (j == i && i > 0) continue;  // one empty run is enough
          std::size_t m = 1;
          for (std::size_t d = i; d < j; ++d) m *= z.extent[d];
          const std::size_t smp = m > 1 ? p.stride_of(z.label[j - 1]) : 0;
          const std::size_t smz = m > 1 ? z.stride[j - 1] : 0;
          const orientation oa = orient(m, smp, k, skp);
          if (!oa.ok) continue;
          // The loops cover every output dim outside the GEMM: z.size() / (m n) calls.
          const double cost = gemm_cost(m, n, k, z_size / (m * n));
          if (!(cost < best.cost)) continue;
          gemm_plan plan;
          plan.valid = true;
          plan.swap = swap;
          plan.trans_a = oa.trans;
          plan.trans_b = ob.trans;
          plan.m = m;
          plan.n = n;
          plan.k = k;
          plan.lda = oa.ld;
          plan.ldb = ob.ld;
          plan.ldc = m > 1 ? smz : n;
          for (std::size_t d = 0; d < n_lo; ++d) {
            if (d >= i && d < j) continue;
            const char l = z.label[d];
            plan.loops.push(z.extent[d], p.stride_of(l), q.stride_of(l), z.stride[d]);
          }
          plan.cost = cost;
          best = plan;
        }
      }
    }
  }
  return best;
}

template <class T>
void run_plan(const gemm_plan& plan, const T* x, const T* y, T* z, bool accumulate) {
  const T* a = plan.swap ? y : x;
  const T* b = plan.swap ? x : y;
  const compute_type_t<T> beta = accumulate ? 1 : 0;
  const loop_nest& l = plan.loops;
  const auto call = [&](std::size_t oa, std::size_t ob, std::size_t oc, std::size_t batch,
                        std::size_t sa, std::size_t sb, std::size_t sc) {
    gemm_strided_batched<T>(plan.trans_a, plan.trans_b, plan.m, plan.n, plan.k, 1, a + oa, plan.lda,
                            sa, b + ob, plan.ldb, sb, beta, z + oc, plan.ldc, sc, batch);
  };
  if (l.rank == 0) {
    call(0, 0, 0, 1, 0, 0, 0);
    return;
  }
  // The innermost loop is the GEMM's batch; the others are an odometer around it.
  const std::size_t last = l.rank - 1;
  std::array<std::size_t, max_dims> index{};
  std::size_t oa = 0, ob = 0, oc = 0;
  for (;;) {
    call(oa, ob, oc, l.extent[last], l.a[last], l.b[last], l.c[last]);
    std::size_t d = last;
    for (;;) {
      if (d == 0) return;
      --d;
      oa += l.a[d];
      ob += l.b[d];
      oc += l.c[d];
      if (++index[d] < l.extent[d]) break;
      oa -= l.a[d] * l.extent[d];
      ob -= l.b[d] * l.extent[d];
      oc -= l.c[d] * l.extent[d];
      index[d] = 0;
    }
  }
}

// Labels of `of` that satisfy `keep`, in the order of `order` (which holds all of them).
template <class Keep>
std::string labels_in_order(const tensor_layout& order, Keep keep) {
  std::string s;
  for (std::size_t d = 0; d < order.rank; ++d) {
    if (keep(order.label[d])) s += order.label[d];
  }
  return s;
}

// Which tensors to permute, and the GEMM plan on the result. Every subset of {x, y, z} is
// tried permuted into the canonical batched-GEMM layouts
//   x' = (batch, free x, contracted), y' = (batch, contracted, free y),
//   z' = (batch, free x, free y)
// (groups ordered like an unpermuted tensor that holds them, so the GEMM can use it as is)
// and the cheapest kept; all three permuted always gives a plan. Shared with the CUDA backend.
struct pair_choice {
  gemm_plan plan;
  tensor_layout x, y, z;
  bool px = false, py = false, pz = false;
  double cost = std::numeric_limits<double>::infinity();
};
inline pair_choice choose_pair_plan(const tensor_layout& x, const tensor_layout& y,
                                    const tensor_layout& z) {
  const auto in_x = [&](char l) { return x.has(l); };
  const auto in_y = [&](char l) { return y.has(l); };
  const auto in_z = [&](char l) { return z.has(l); };
  pair_choice best;
  // A plan on the tensors as they are that is as good as the canonical one (one GEMM per
  // batch index, with all free and contracted dims) cannot be beaten: skip the search.
  std::size_t batch_count = 1, m_all = 1, n_all = 1, k_all = 1;
  for (std::size_t d = 0; d < x.rank; ++d) {
    const char l = x.label[d];
    (y.has(l) ? (z.has(l) ? batch_count : k_all) : m_all) *= x.extent[d];
  }
  for (std::size_t d = 0; d < y.rank; ++d) {
    if (!x.has(y.label[d])) n_all *= y.extent[d];
  }
  const double ideal = std::min(gemm_cost(m_all, n_all, k_all, batch_count),
                                gemm_cost(n_all, m_all, k_all, batch_count));
  for (unsigned mask = 0; mask < 8; ++mask) {
    const bool px = (mask & 1U) != 0, py = (mask & 2U) != 0, pz = (mask & 4U) != 0;
    const tensor_layout& batch_src = !pz ? z : !px ? x : !py ? y : z;
    const tensor_layout& fx_src = !pz ? z : !px ? x : z;
    const tensor_layout& fy_src = !pz ? z : !py ? y : z;
    const tensor_layout& k_src = !px ? x : !py ? y : x;
    const std::string batch =
        labels_in_order(batch_src, [&](char l) { return in_x(l) && in_y(l) && in_z(l); });
    const std::string free_x =
        labels_in_order(fx_src, [&](char l) { return in_x(l) && !in_y(l) && in_z(l); });
    const std::string free_y =
        labels_in_order(fy_src, [&](char l) { return !in_x(l) && in_y(l) && in_z(l); });
    const std::string con =
        labels_in_order(k_src, [&](char l) { return in_x(l) && in_y(l) && !in_z(l); });
    pair_choice c;
    c.px = px;
    c.py = py;
    c.pz = pz;
    c.x = px ? dense_layout_like(batch + free_x + con, x) : x;
    c.y = py ? dense_layout_like(batch + con + free_y, y) : y;
    c.z = pz ? dense_layout_like(batch + free_x + free_y, z) : z;
    // Permuting into the same order is no permute: that subset was tried without it.
    if ((px && c.x.labels() == x.labels()) || (py && c.y.labels() == y.labels()) ||
        (pz && c.z.labels() == z.labels())) {
      continue;
    }
    c.plan = plan_direct(c.x, c.y, c.z);
    if (!c.plan.valid) continue;
    c.cost = c.plan.cost +
             permute_cost_per_element *
                 double((px ? x.size() : 0) + (py ? y.size() : 0) + (pz ? 2 * z.size() : 0));
    if (c.cost < best.cost) best = c;
    if (mask == 0 && best.cost <= ideal) break;
  }
  if (!best.plan.valid) {
    throw shape_error("zest: contract: internal error, no GEMM plan found");  // unreachable
  }
  return best;
}

// Two operands, all checks done, no zero extents; T is float or double.
template <class T>
void contract_pair(tensor_layout x, const T* xd, tensor_layout y, const T* yd,
                   const tensor_layout& z, T* out, bool accumulate) {
  // Dims in one operand only and not in the output are summed out of it first:
  // "ij,jk->k" sums i out of the first operand, then is "j,jk->k".
  const auto sum_only_dims = [&z](tensor_layout& t, const T*& data, const tensor_layout& other,
                                  scratch_slot slot) {
    const std::string kept = labels_in_order(t, [&](char l) { return z.has(l) || other.has(l); });
    if (kept.size() == t.rank) return;
    const tensor_layout reduced = dense_layout_like(kept, t);
    T* buffer = scratch<T>(slot, reduced.size());
    std::fill_n(buffer, reduced.size(), T(0));
    reduce_into(t, data, reduced, buffer);
    t = reduced;
    data = buffer;
  };
  sum_only_dims(x, xd, y, reduced_x);
  sum_only_dims(y, yd, x, reduced_y);

  const pair_choice best = choose_pair_plan(x, y, z);
  if (best.px) {
    T* xp = scratch<T>(permuted_x, x.size());
    relayout<false>(x, xd, best.x, xp);
    xd = xp;
  }
  if (best.py) {
    T* yp = scratch<T>(permuted_y, y.size());
    relayout<false>(y, yd, best.y, yp);
    yd = yp;
  }
  if (!best.pz) {
    run_plan(best.plan, xd, yd, out, accumulate);
    return;
  }
  T* zp = scratch<T>(permuted_z, z.size());
  run_plan(best.plan, xd, yd, zp, false);
  if (accumulate) {
    relayout<true>(best.z, zp, z, out);
  } else {
    relayout<false>(best.z, zp, z, out);
  }
}

// One operand: a permute, or a reduction when some dims are not in the output.
template <class T>
void contract_single(const tensor_layout& x, const T* xd, const tensor_layout& z, T* out,
                     bool accumulate) {
  bool reduces = false;
  for (std::size_t d = 0; d < x.rank; ++d) reduces = reduces || !z.has(x.label[d]);
  if (!reduces) {
    if (accumulate) {
      relayout<true>(x, xd, z, out);
    } else {
      relayout<false>(x, xd, z, out);
    }
    return;
  }
  if (!accumulate) std::fill(out, out + z.size(), T(0));
  reduce_into(x, xd, z, out);
}

inline std::string spec_of(std::span<const std::string_view> inputs, std::string_view out) {
  std::string s;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (i > 0) s += ',';
    s += inputs[i];
  }
  s += "->";
  s += out;
  return s;
}

// Checks labels and extents; throws shape_error naming the spec, the dim and the extents.
template <class T>
void check_contract(std::span<const operand_view<T>> operands, std::string_view out_labels,
                    std::span<const std::size_t> out_extents) {
  const auto fail = [&](auto&&... parts) {
    std::array<std::string_view, 3> names{};
    const std::size_t count = std::min<std::size_t>(operands.size(), names.size());
    for (std::size_t i = 0; i < count; ++i) names[i] = operands[i].labels;
    const std::string spec = spec_of(std::span(names.data(), count), out_labels);
    throw shape_error(zest::detail::message("zest: contract \"", spec, "\": ", parts...));
  };
  if (operands.empty() || operands.size() > 2) {
    fail("takes 1 or 2 operands, got ", operands.size(), "; contract larger products pairwise");
  }
  // Where each label's extent was first seen: 1-based operand, or 0 for the output.
  std::array<std::size_t, 256> extent{};
  std::array<std::size_t, 256> seen_in{};
  std::array<bool, 256> known{};
  const auto where = [&](std::size_t in) {
    return in == 0 ? std::string("the output") : zest::detail::message("operand ", in);
  };
  const auto check_tensor = [&](std::string_view labels, std::span<const std::size_t> extents,
                                std::size_t in) {
    if (labels.size() != extents.size()) {
      fail(where(in), " has ", labels.size(), " labels but ", extents.size(), " extents");
    }
    if (labels.size() > max_dims) {
      fail(where(in), " has rank ", labels.size(), ", above zest::max_dims = ", max_dims);
    }
    for (std::size_t d = 0; d < labels.size(); ++d) {
      const char l = labels[d];
      if (labels.find(l) != d) {
        fail("dim '", l, "' repeats in ", where(in),
             "; diagonals are not supported, take the diagonal first");
      }
      const auto u = static_cast<unsigned char>(l);
      if (!known[u]) {
        known[u] = true;
        extent[u] = extents[d];
        seen_in[u] = in;
      } else if (extent[u] != extents[d]) {
        fail("dim '", l, "' has extent ", extent[u], " in ", where(seen_in[u]), " but ", extents[d],
             " in ", where(in));
      }
    }
  };
  for (std::size_t i = 0; i < operands.size(); ++i) {
    check_tensor(operands[i].labels, operands[i].extents, i + 1);
  }
  for (const char l : out_labels) {
    if (!known[static_cast<unsigned char>(l)]) {
      fail("output dim '", l, "' appears in no operand");
    }
  }
  check_tensor(out_labels, out_extents, 0);
}

template <class T>
void contract_checked(std::span<const operand_view<T>> operands, std::string_view out_labels,
                      T* out, std::span<const std::size_t> out_extents, bool accumulate) {
  const tensor_layout z = dense_layout(out_labels, out_extents);
  const tensor_layout x = dense_layout(operands[0].labels, operands[0].extents);
  if (operands.size() == 1) {
    contract_single(x, operands[0].data, z, out, accumulate);
  } else {
    const tensor_layout y = dense_layout(operands[1].labels, operands[1].extents);
    contract_pair(x, operands[0].data, y, operands[1].data, z, out, accumulate);
  }
}

}  // namespace detail

// out = einsum(operands -> out_labels), or out += it with accumulate. Every tensor is dense
// row-major in the order of its labels; a label is one character. Throws shape_error when
// labels and extents disagree, a label repeats within a tensor, or an output label is in no
// operand. T is float, double or zest::bfloat16 (which computes in float).
template <class T>
void contract(std::span<const operand_view<T>> operands, std::string_view out_labels, T* out,
              std::span<const std::size_t> out_extents, bool accumulate = false) {
  static_assert(
      std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bfloat16>,
      "zest::host::contract: element type must be float, double or zest::bfloat16");
  detail::check_contract(operands, out_labels, out_extents);
  const std::size_t out_count = detail::element_count(out_extents);
  if (out_count == 0) return;
  for (const auto& op : operands) {
    if (detail::element_count(op.extents) == 0) {
      // Some contracted or summed extent is 0: the sum is empty.
      if (!accumulate) std::fill(out, out + out_count, T(0.0F));
      return;
    }
  }
  if constexpr (std::is_same_v<T, bfloat16>) {
    // Compute in float: one rounding at the end instead of one per partial sum.
    std::array<operand_view<float>, 2> views{};
    for (std::size_t i = 0; i < operands.size(); ++i) {
      const std::size_t n = detail::element_count(operands[i].extents);
      float* input = detail::scratch<float>(i == 0 ? detail::bf16_x : detail::bf16_y, n);
      for (std::size_t e = 0; e < n; ++e) input[e] = float(operands[i].data[e]);
      views[i] = {input, operands[i].labels, operands[i].extents};
    }
    float* result = detail::scratch<float>(detail::bf16_z, out_count);
    if (accumulate) {
      for (std::size_t e = 0; e < out_count; ++e) result[e] = float(out[e]);
    }
    detail::contract_checked<float>(std::span(views.data(), operands.size()), out_labels, result,
                                    out_extents, accumulate);
    for (std::size_t e = 0; e < out_count; ++e) out[e] = bfloat16(result[e]);
  } else {
    detail::contract_checked<T>(operands, out_labels, out, out_extents, accumulate);
  }
}

// Frees the scratch buffers that contract keeps on the calling thread (they hold the largest
// permuted operands seen so far, so that repeated calls do not page-fault afresh).
inline void release_workspace() {
  detail::thread_scratch<float>() = {};
  detail::thread_scratch<double>() = {};
}

// Braced-list convenience: contract({{a, "ik", ae}, {b, "kj", be}}, "ij", c, ce).
template <class T>
void contract(std::initializer_list<operand_view<T>> operands, std::string_view out_labels, T* out,
              std::span<const std::size_t> out_extents, bool accumulate = false) {
  contract<T>(std::span<const operand_view<T>>(operands.begin(), operands.size()), out_labels, out,
              out_extents, accumulate);
}

}  // namespace zest::host
