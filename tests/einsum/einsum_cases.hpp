// Property tests of einsum over sharded tensors: each spec under several layout combinations
// and policies, random extents (uneven ones included), against a naive single-rank einsum.
// Included by the einsum_*_test.cpp files, each of which runs a share of the specs, so that
// the test binaries compile in parallel.
#pragma once

#include <doctest/doctest.h>

#include <random>
#include <tuple>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/einsum/einsum.hpp"
#include "zest/plan/explain.hpp"

namespace zest::testing {

using einsum_mesh = mesh<"dp", "tp">;

template <fixed_string Spec>
inline constexpr einsum_spec spec_of = parse_einsum(view_of<Spec>);

template <fixed_string Spec, std::size_t I>
constexpr auto term_dims() {
  constexpr einsum_term t = spec_of<Spec>.inputs[I];
  fixed_string<t.size + 1> out;
  for (std::size_t k = 0; k < t.size; ++k) out.set(k, t.letters[k]);
  return out;
}

// Layout combinations, on axes dp (0) and tp (1):
//   0 everything replicated
//   1 operand 0's first dim split over dp
//   2 the first contracted letter (else the first output letter) split over dp wherever it occurs
//   3 operand 0's first dim over dp, the last operand's last dim over tp (nested if the same dim)
//   4 operand 0 partial over tp, the last operand's first dim over dp
//   5 every operand's first dim split over dp then tp
//   6 the last operand's last dim over tp then dp, operand 0's first dim over dp (a conflict)
template <fixed_string Spec, std::size_t I, int Combo>
constexpr layout_value combo_layout() {
  constexpr einsum_spec s = spec_of<Spec>;
  constexpr einsum_term t = s.inputs[I];
  constexpr std::size_t last = s.operand_count - 1;
  layout_value v = replicated_layout(2);
  auto split_on = [&](std::size_t axis, char d) {
    const auto order = static_cast<std::uint8_t>(v.split_count(d));
    v.axes[axis] = axis_placement{placement_kind::split, d, order};
  };
  if (t.size == 0) return v;
  if constexpr (Combo == 1) {
    if (I == 0) split_on(0, t.letters[0]);
  } else if constexpr (Combo == 2) {
    char pick = s.output.size ? s.output.letters[0] : s.inputs[0].letters[0];
    for (std::size_t i = 0; i < s.operand_count; ++i)
      for (std::size_t k = 0; k < s.inputs[i].size; ++k)
        if (s.is_contracted(s.inputs[i].letters[k])) pick = s.inputs[i].letters[k];
    if (t.has(pick)) split_on(0, pick);
  } else if constexpr (Combo == 3) {
    if (I == 0) split_on(0, t.letters[0]);
    if (I == last) split_on(1, t.letters[t.size - 1]);
  } else if constexpr (Combo == 4) {
    if (I == 0) v.axes[1] = axis_placement{placement_kind::partial, 0, 0};
    if (I == last) split_on(0, t.letters[0]);
  } else if constexpr (Combo == 5) {
    split_on(0, t.letters[0]);
    split_on(1, t.letters[0]);
  } else if constexpr (Combo == 6) {
    if (I == last) {
      split_on(1, t.letters[t.size - 1]);
      if (I != 0) split_on(0, t.letters[t.size - 1]);
    }
    if (I == 0 && !v.is_split(0)) {
      if (v.split_count(t.letters[0]) == 0 || !v.is_split(1)) split_on(0, t.letters[0]);
    }
  }
  return v;
}

template <class T, fixed_string Spec, std::size_t I, int Combo>
using operand_t =
    basic_tensor<T, einsum_mesh, term_dims<Spec, I>(), combo_layout<Spec, I, Combo>()>;

// Runs einsum<Spec, Options...> on the combo's operands and compares with the reference.
template <class T, fixed_string Spec, int Combo, class O1 = void, class O2 = void>
void check_einsum(const einsum_mesh& m, std::mt19937& rng, double tolerance) {
  constexpr einsum_spec s = spec_of<Spec>;
  std::array<std::size_t, 128> extent{};
  for (std::size_t i = 0; i < s.operand_count; ++i)
    for (std::size_t k = 0; k < s.inputs[i].size; ++k)
      extent[static_cast<unsigned char>(s.inputs[i].letters[k])] = 1 + rng() % 6;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto ops = std::make_tuple(make_tensor<operand_t<T, Spec, I, Combo>>(
        m,
        [&] {
          typename operand_t<T, Spec, I, Combo>::extents_type e{};
          for (std::size_t k = 0; k < s.inputs[I].size; ++k)
            e[k] = extent[static_cast<unsigned char>(s.inputs[I].letters[k])];
          return e;
        }(),
        static_cast<std::uint32_t>(11 + I))...);
    std::vector<dense> in;
    (in.push_back(
         dense{s.inputs[I].view(),
               std::vector<std::size_t>(std::get<I>(ops).extents().begin(),
                                        std::get<I>(ops).extents().end()),
               global_values(std::get<I>(ops).extents(), static_cast<std::uint32_t>(11 + I))}),
     ...);
    std::vector<std::size_t> out_extents;
    const auto want = reference_einsum(s, in, out_extents);
    const plan_report report = explain<Spec, O1, O2>(std::get<I>(ops)...);
    m.reset_stats();
    auto y = einsum<Spec, O1, O2>(std::get<I>(ops)...);
    const comm_stats stats = m.stats();
    CAPTURE(report.str());
    CHECK(stats.bytes_sent() == report.bytes());
    CHECK(stats.calls() == report.collectives());
    CHECK(std::vector<std::size_t>(y.extents().begin(), y.extents().end()) == out_extents);
    CHECK(relative_error(to_global(y), want) < tolerance);
  }
  (std::make_index_sequence<s.operand_count>{});
}

// All combos, both policies, and two forced output layouts, at every mesh shape.
template <fixed_string Spec, class T = float>
void check_spec() {
  std::mt19937 rng(99);
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  for (const auto& shape : mesh_shapes()) {
    einsum_mesh m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    CAPTURE(view_of<Spec>);
    for (int trial = 0; trial < 2; ++trial) {
      check_einsum<T, Spec, 0>(m, rng, tol);
      check_einsum<T, Spec, 1>(m, rng, tol);
      check_einsum<T, Spec, 2>(m, rng, tol);
      check_einsum<T, Spec, 3>(m, rng, tol);
      check_einsum<T, Spec, 4>(m, rng, tol);
      check_einsum<T, Spec, 5>(m, rng, tol);
      check_einsum<T, Spec, 6>(m, rng, tol);
      check_einsum<T, Spec, 6, keep_weights>(m, rng, tol);
      check_einsum<T, Spec, 3, keep_weights>(m, rng, tol);
      check_einsum<T, Spec, 2, layout<>>(m, rng, tol);
      if constexpr (spec_of<Spec>.output.size > 0) {
        constexpr char first = spec_of<Spec>.output.letters[0];
        check_einsum<T, Spec, 1, layout<split<first, "tp">>>(m, rng, tol);
      }
    }
  }
}

}  // namespace zest::testing
