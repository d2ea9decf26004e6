// zest/backend/contraction_plan.hpp — how a local einsum over one or two dense operands
// becomes strided batched GEMMs: the planner that every backend runs its contractions by
// (the host's BLAS or Eigen, zest/backend/host/contract.hpp; cuBLAS,
// zest/backend/cuda/cuda_backend.hpp). Plain C++ on plain descriptors: no element type, no
// memory, no backend.
//
//   std::size_t xe[] = {8, 512, 512}, we[] = {256, 512}, oe[] = {8, 256, 512};
//   auto x = zest::contraction::dense_layout("bsm", xe);
//   auto w = zest::contraction::dense_layout("hm", we);
//   auto z = zest::contraction::dense_layout("bhs", oe);
//   zest::contraction::pair_choice c = zest::contraction::choose_pair_plan(x, w, z);
//   // c.plan: 8 GEMMs (h x m) * (s x m)^T, w shared (c.plan.loops: b); c.px, c.py, c.pz:
//   // which tensors to permute first (none here)
//
// Labels of two operands play roles:
//   batch      in both operands and the output   (b in "bij,bjk->bik")
//   free       in one operand and the output     (i, k)
//   contracted in both operands, not the output  (j)
//   summed     in one operand only, not output   (summed out of that operand first)
// A contraction is a strided batched GEMM whenever each of the groups M (free dims of one
// operand), N (free dims of the other, innermost in the output) and K (contracted) is
// contiguous in every tensor that holds it. Transposes are then GEMM flags, leading
// dimensions absorb gaps, and every other output dim becomes a batch loop whose stride is 0
// in the operand that lacks it. Only when a group is not contiguous is a tensor permuted; a
// small cost model picks which ones (if any).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "zest/config.hpp"
#include "zest/core/error.hpp"

namespace zest::contraction {

// One operand of a local contraction: dense row-major data (in the backend's memory), one
// label per dim, its extents.

template <class T>
struct operand_view {
  const T* data;
  std::string_view labels;
  std::span<const std::size_t> extents;
};

inline constexpr std::size_t no_dim = static_cast<std::size_t>(-1);

// Row-major strides of a dense tensor: extents (2,3,4) -> strides (12,4,1).
inline std::array<std::size_t, max_dims> dense_strides(std::span<const std::size_t> extents) {
  std::array<std::size_t, max_dims> strides{};
  std::size_t s = 1;
  for (std::size_t d = extents.size(); d-- > 0;) {
    strides[d] = s;
    s *= extents[d];
  }
  return strides;
}

inline std::size_t element_count(std::span<const std::size_t> extents) {
  std::size_t n = 1;
  for (auto e : extents) n *= e;
  return n;
}

// Below this many multiply-adds a GEMM call is dominated by its fixed cost; the host runs
// such products in plain loops (zest/backend/host/gemm.hpp), and the cost model below
// prices them so.
inline constexpr std::size_t small_gemm_volume = 4096;

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
// and the cheapest kept; all three permuted always gives a plan.
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

}  // namespace zest::contraction
