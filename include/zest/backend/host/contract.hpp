// zest/backend/host/contract.hpp — the host backend's local einsum over one or two dense
// row-major operands (the per-rank step of every distributed einsum).
//
//   std::size_t xe[] = {8, 512, 512}, we[] = {256, 512}, oe[] = {8, 256, 512};
//   zest::host::operand_view<float> ops[] = {{x, "bsm", xe}, {w, "hm", we}};
//   zest::host::contract<float>(ops, "bhs", out, oe);  // out[b][h][s] = sum_m x[b][s][m] w[h][m]
//
// Semantics are numpy.einsum with an explicit output. The GEMMs and permutes are chosen by
// the backend-neutral planner (zest/backend/contraction_plan.hpp, which the CUDA backend
// uses too): "bsm,hm->bhs" is 8 GEMMs (h x m) * (s x m)^T with w shared, and nothing is
// copied. This header runs the plan: BLAS or Eigen GEMMs (zest/backend/host/gemm.hpp),
// permutes and reductions (zest/backend/host/permute.hpp), scratch kept per thread.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "zest/backend/contraction_plan.hpp"
#include "zest/backend/host/gemm.hpp"
#include "zest/backend/host/permute.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/error.hpp"

namespace zest::host {

// The planner's operand (zest/backend/contraction_plan.hpp), under the name host callers use.
template <class T>
using operand_view = contraction::operand_view<T>;

namespace detail {

// The planner, used unqualified by the host's steps below.
using contraction::check_contract;
using contraction::choose_pair_plan;
using contraction::dense_layout;
using contraction::dense_layout_like;
using contraction::element_count;
using contraction::gemm_plan;
using contraction::labels_in_order;
using contraction::loop_nest;
using contraction::pair_choice;
using contraction::plan_direct;
using contraction::tensor_layout;

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
