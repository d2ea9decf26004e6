// zest/autodiff/attention.hpp — scaled dot-product attention on the tape: multi-head,
// grouped-query and multi-query heads, causal and/or masked.
//
//   auto o = autodiff::scaled_dot_product_attention<"bkgtd,bksd,bkse->bkgte">(q, k, v);
//   auto m = autodiff::scaled_dot_product_attention<"bhtd,bhsd,bhse->bhte">(
//       q, k, v, mask, {.causal = false});             // mask "ts" or "bts": nonzero attends
//   auto n = autodiff::scaled_dot_product_attention<"bgtd,bsd,bse->bgte">(q, k, v);   // MQA
//
// The spec names q, k, v and the output. q's last two letters are (query position t, head dim
// d), k's last two (key position s, d), v's last two (s, value dim e); the output is q's
// letters with d replaced by e. The letters before those are batch and head dims: k's and
// v's are some of q's, so a query head dim that k and v lack is shared by them. GQA: k = kv
// heads, g = query heads per kv head, q "bkgtd", k "bksd"; MQA: k of extent 1, or no k.
//
//   scores  = einsum<"bkgtd,bksd->bkgts">(scale(q, c), k)    c = o.scale, or 1/sqrt(extent(d))
//   weights = softmax over s of the scores that may attend    (causal: s <= t, global indices)
//   out     = einsum<"bkgts,bkse->bkgte">(weights, v)
//
// Composed from public ops (scale, einsum, softmax / causal_softmax / masked_softmax of
// zest/autodiff/ops.hpp), so every backend runs it and the gradients are theirs. A query that
// may attend to no key (its whole row masked) gets zeros, not NaN, and no gradient. Causal
// means a key whose global index along s exceeds the query's global index along t is masked:
// top-left aligned, right when t or s is split, evenly or not.
//
// Layouts. The einsums' default plans decide (zest/einsum, docs/einsum-policies.md): with q,
// k and v split alike over batch and head dims, everything is local. The softmax needs whole
// rows along s: where the scores come out pending (the head dim d split) or split along s
// (keys split along s), they are first reduced / gathered to the layout that keeps each row
// whole on every rank (an all-reduce, an all-gather of s). The mask is used split as the
// scores split its dims (a local slice of a replicated mask). The output's layout is the
// second einsum's.
//
// Checks: the spec at compile time (one static_assert naming the problem); the mask's dims
// (some of the scores' dims, in their order) and element type at compile time, its extents at
// run time (zest::shape_error).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "zest/autodiff/diagnostics.hpp"
#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::autodiff {

struct attention_options {
  bool causal = true;  // mask keys after the query (global index along s > along t)
  double scale = 0;    // the scores' factor; 0: 1 / sqrt(extent of the head dim)
};

namespace detail {

enum class attention_problem {
  none,
  format,           // not "q,k,v->out"
  short_operand,    // q, k or v with fewer than two letters
  repeated_letter,  // a letter twice in one term
  head_dim,         // k's last letter is not q's
  key_dim,          // v's second-to-last letter is not k's
  key_in_query,     // k's key position letter is one of q's letters
  batch_dims,       // a letter of k or v before their last two that q lacks
  output,           // the output is not q with its last letter replaced by v's
  operand_dims,     // the tensors' dims are not the spec's terms
};

// The four terms of an attention spec.
struct attention_terms {
  std::string_view q, k, v, out;
  bool ok = false;
};
constexpr attention_terms attention_terms_of(std::string_view s) {
  attention_terms t;
  const std::size_t c1 = s.find(','), arrow = s.find("->");
  if (c1 == std::string_view::npos || arrow == std::string_view::npos) return t;
  const std::size_t c2 = s.find(',', c1 + 1);
  if (c2 == std::string_view::npos || c2 > arrow || s.find(',', c2 + 1) < arrow) return t;
  t.q = s.substr(0, c1);
  t.k = s.substr(c1 + 1, c2 - c1 - 1);
  t.v = s.substr(c2 + 1, arrow - c2 - 1);
  t.out = s.substr(arrow + 2);
  t.ok = t.out.find(',') == std::string_view::npos && t.out.find('-') == std::string_view::npos;
  return t;
}

constexpr bool has_repeat(std::string_view term) {
  for (std::size_t i = 0; i < term.size(); ++i) {
    if (term.find(term[i], i + 1) != std::string_view::npos) return true;
  }
  return false;
}

constexpr attention_problem attention_problem_of(std::string_view spec) {
  const attention_terms t = attention_terms_of(spec);
  if (!t.ok) return attention_problem::format;
  if (t.q.size() < 2 || t.k.size() < 2 || t.v.size() < 2) return attention_problem::short_operand;
  if (has_repeat(t.q) || has_repeat(t.k) || has_repeat(t.v) || has_repeat(t.out))
    return attention_problem::repeated_letter;
  const std::size_t nq = t.q.size(), nk = t.k.size(), nv = t.v.size();
  if (t.k[nk - 1] != t.q[nq - 1]) return attention_problem::head_dim;
  if (t.v[nv - 2] != t.k[nk - 2]) return attention_problem::key_dim;
  if (t.q.find(t.k[nk - 2]) != std::string_view::npos) return attention_problem::key_in_query;
  const std::string_view batch = t.q.substr(0, nq - 2);
  for (const std::string_view lead : {t.k.substr(0, nk - 2), t.v.substr(0, nv - 2)}) {
    for (const char c : lead) {
      if (batch.find(c) == std::string_view::npos) return attention_problem::batch_dims;
    }
  }
  if (t.out.size() != nq || t.out.substr(0, nq - 1) != t.q.substr(0, nq - 1) ||
      t.out[nq - 1] != t.v[nv - 1])
    return attention_problem::output;
  return attention_problem::none;
}

// The two einsums' specs: "q,k->S" and "S,v->out", S = q's letters with d replaced by s.
struct attention_einsums {
  std::array<char, 128> scores{}, output{};
  std::size_t scores_size = 0, output_size = 0;
  std::array<char, 16> score_dims{};
  std::size_t score_rank = 0;
};
constexpr attention_einsums attention_einsums_of(std::string_view spec) {
  const attention_terms t = attention_terms_of(spec);
  attention_einsums e;
  auto put = [](std::array<char, 128>& to, std::size_t& n, std::string_view s) {
    for (const char c : s) to[n++] = c;
  };
  for (const char c : t.q.substr(0, t.q.size() - 1)) e.score_dims[e.score_rank++] = c;
  e.score_dims[e.score_rank++] = t.k[t.k.size() - 2];
  const std::string_view dims(e.score_dims.data(), e.score_rank);
  put(e.scores, e.scores_size, t.q);
  put(e.scores, e.scores_size, ",");
  put(e.scores, e.scores_size, t.k);
  put(e.scores, e.scores_size, "->");
  put(e.scores, e.scores_size, dims);
  put(e.output, e.output_size, dims);
  put(e.output, e.output_size, ",");
  put(e.output, e.output_size, t.v);
  put(e.output, e.output_size, "->");
  put(e.output, e.output_size, t.out);
  return e;
}

template <std::size_t N>
constexpr fixed_string<N + 1> fixed_of(const char* s) {
  fixed_string<N + 1> out;
  for (std::size_t i = 0; i < N; ++i) out.set(i, s[i]);
  return out;
}

template <fixed_string Spec>
struct attention_plan {
  static constexpr attention_terms terms = attention_terms_of(view_of<Spec>);
  static constexpr attention_einsums e = attention_einsums_of(view_of<Spec>);
  static constexpr auto scores_spec = fixed_of<e.scores_size>(e.scores.data());
  static constexpr auto output_spec = fixed_of<e.output_size>(e.output.data());
  static constexpr auto score_dims = fixed_of<e.score_rank>(e.score_dims.data());
  static constexpr char query = terms.q[terms.q.size() - 2];
  static constexpr char head = terms.q[terms.q.size() - 1];
  static constexpr char key = terms.k[terms.k.size() - 2];
};

// The layout in which every rank holds whole rows along `key`: pending axes reduced
// (replicated), the axes that split `key` replicated.
constexpr layout_value whole_rows(layout_value v, char key) {
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if (v.is_partial(a) || v.splits(a, key)) v.axes[a] = axis_placement{};
  }
  for (std::size_t k = 1; k < max_axes; ++k) {
    for (std::size_t a = 0; a < v.axis_count; ++a) {
      if (v.is_split(a) && v.axes[a].order == k && v.split_axis(v.axes[a].dim, k - 1) == max_axes)
        v.axes[a] = axis_placement{};
    }
  }
  return v;
}

}  // namespace detail

namespace autodiff_error {
template <fixed_string Spec, detail::attention_problem P>
struct attention_spec;
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::format> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: the spec (shown above) must be three "
                "terms and an output, \"q,k,v->out\". Fix: e.g. \"bhtd,bhsd,bhse->bhte\".");
};
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::short_operand> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: q, k and v each need at least two "
                "letters, (position, feature) last (spec shown above). Fix: q \"...td\", k "
                "\"...sd\", v \"...se\".");
};
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::repeated_letter> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: a letter repeats within one term of "
                "the spec (shown above). Fix: give each dim of a term its own letter.");
};
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::head_dim> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: k's last letter must be q's last, the "
                "head dim the scores contract (spec shown above). Fix: e.g. "
                "\"bhtd,bhsd,bhse->bhte\".");
};
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::key_dim> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: v's second-to-last letter must be k's, "
                "the key position (spec shown above). Fix: e.g. \"bhtd,bhsd,bhse->bhte\".");
};
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::key_in_query> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: k's key position letter is one of q's "
                "letters (spec shown above); the scores need it as a dim of its own. Fix: name "
                "the key position apart from the query position, e.g. s for keys, t for queries.");
};
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::batch_dims> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: a batch or head letter of k or v "
                "(before their last two) is not one of q's (spec shown above). Fix: k and v "
                "may only lack q's dims, e.g. MQA \"bgtd,bsd,bse->bgte\".");
};
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::output> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: the output must be q's letters with "
                "the last (the head dim) replaced by v's last (spec shown above). Fix: e.g. "
                "\"bkgtd,bksd,bkse->bkgte\".");
};
template <fixed_string Spec>
struct attention_spec<Spec, detail::attention_problem::operand_dims> {
  static_assert(always_false<decltype(Spec)>,
                "zest scaled_dot_product_attention<Spec>: the dims of q, k or v are not their "
                "terms in the spec (spec shown above; the tensors' types below). Fix: write the "
                "spec with the tensors' dims, in their order.");
};
}  // namespace autodiff_error

namespace detail {

template <fixed_string Spec, class Q, class K, class V>
constexpr bool check_attention() {
  constexpr attention_problem p = attention_problem_of(view_of<Spec>);
  if constexpr (p != attention_problem::none) {
    (void)autodiff_error::attention_spec<Spec, p>{};
    return false;
  } else {
    constexpr attention_terms t = attention_terms_of(view_of<Spec>);
    if constexpr (view_of<Q::dims> != t.q || view_of<K::dims> != t.k || view_of<V::dims> != t.v) {
      (void)autodiff_error::attention_spec<Spec, attention_problem::operand_dims>{};
      return false;
    } else {
      return true;
    }
  }
}

// softmax(mask(scale(q) k^T)) v; Mask is a tensor type, or void without a mask.
template <fixed_string Spec, class Mask, sharded_tensor Q, sharded_tensor K, sharded_tensor V>
auto attention_of(const variable<Q>& q, const variable<K>& k, const variable<V>& v,
                  const Mask* mask, const attention_options& o) {
  using T = typename Q::value_type;
  using plan = attention_plan<Spec>;
  // The extents the spec pairs, named as the attention's (the einsums would name their own).
  const std::size_t qd = q.value().extent(plan::head), kd = k.value().extent(plan::head);
  const std::size_t ks = k.value().extent(plan::key), vs = v.value().extent(plan::key);
  if (qd != kd || ks != vs || qd == 0) {
    throw shape_error(zest::detail::message(
        "zest: scaled_dot_product_attention<\"", view_of<Spec>, "\">: q's '", plan::head, "' is ",
        qd, " and k's ", kd, "; k's '", plan::key, "' is ", ks, " and v's ", vs,
        ": q and k need one head dim (not empty), k and v one key length"));
  }
  if (!std::isfinite(o.scale)) {
    throw shape_error(zest::detail::message("zest: scaled_dot_product_attention<\"", view_of<Spec>,
                                            "\">: options.scale ", o.scale,
                                            " is not finite (0 means 1/sqrt(head dim))"));
  }
  const double c =
      o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(q.value().extent(plan::head)));
  auto raw = einsum<plan::scores_spec>(scale(q, static_cast<T>(c)), k);
  using raw_t = typename decltype(raw)::tensor_type;
  static constexpr layout_value rows_at = whole_rows(raw_t::layout, plan::key);
  auto scores = [&] {
    if constexpr (rows_at == raw_t::layout) {
      return raw;
    } else {
      return redistribute<typename layout_type_for<typename Q::mesh_type, rows_at>::type>(raw);
    }
  }();
  auto weights = [&] {
    if constexpr (std::is_void_v<Mask>) {
      if (o.causal) return causal_softmax<plan::query, plan::key>(scores);
      return softmax<plan::key>(scores);
    } else {
      if (o.causal) return causal_softmax<plan::query, plan::key>(scores, *mask);
      return masked_softmax<plan::key>(scores, *mask);
    }
  }();
  return einsum<plan::output_spec>(weights, v);
}

}  // namespace detail

// Attention of q over k and v as the spec names them (see the top): causal by default, the
// scores scaled by o.scale or 1/sqrt(extent of the head dim).
template <fixed_string Spec, sharded_tensor Q, sharded_tensor K, sharded_tensor V>
auto scaled_dot_product_attention(const variable<Q>& q, const variable<K>& k, const variable<V>& v,
                                  attention_options o = {}) {
  if constexpr (!detail::check_attention<Spec, Q, K, V>()) {
    return 0;
  } else {
    return detail::attention_of<Spec, void>(q, k, v, static_cast<const void*>(nullptr), o);
  }
}

// The same where `mask` (a plain tensor, nonzero: may attend) also keeps the entry; its dims
// are some of the scores' (q's letters with the head dim replaced by k's key position, e.g.
// "bhts"), in their order, broadcast over the others: "ts", "bts", "bhts".
template <fixed_string Spec, sharded_tensor Q, sharded_tensor K, sharded_tensor V, sharded_tensor M>
auto scaled_dot_product_attention(const variable<Q>& q, const variable<K>& k, const variable<V>& v,
                                  const M& mask, attention_options o = {}) {
  if constexpr (!detail::check_attention<Spec, Q, K, V>()) {
    return 0;
  } else {
    return detail::attention_of<Spec, M>(q, k, v, &mask, o);
  }
}

}  // namespace zest::autodiff
