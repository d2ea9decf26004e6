// einsum_tour — a guided tour of zest, to read top to bottom and run:
//
//   mpiexec -n 4 build/default/examples/einsum_tour     # a 2x2 mesh<"dp","tp">
//
// It also runs on 1 or 2 ranks (mesh 1x1 or 2x1): an axis of size 1 has nothing to send,
// so its collectives move 0 bytes, and the checks still hold.
//
// Every case is checked against a reference that each rank computes alone, with plain
// loops, from the same global inputs; the bytes the mesh's counters saw are compared with
// the bytes the plan predicts. Rank 0 prints OK or FAIL per case; the exit code is the
// number of failures.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/zest.hpp"  // everything: mesh, tensor, layouts, einsum, explain, visualize

using zest::layout, zest::split, zest::partial;
using mesh_t = zest::mesh<"dp", "tp">;  // axis names are compile-time, sizes run-time
using values = std::vector<float>;

namespace {

int failures = 0;
bool rank0 = false;

void say(const std::string& text) {
  if (rank0) std::cout << text << std::flush;
}

// Global inputs, identical on every rank: small multiples of 1/8, so sums are nearly exact.
values global_values(std::size_t n, int seed) {
  values v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(static_cast<int>((i * 7 + seed * 13) % 17) - 8) / 8;
  return v;
}

// The reference: numpy.einsum with plain loops over every letter of the spec.
values naive_einsum(std::string_view spec,
                    std::vector<std::pair<const values*, std::vector<std::size_t>>> in) {
  std::vector<std::string_view> terms;  // "bsm,mh->bsh" -> bsm, mh, bsh
  const std::size_t arrow = spec.find("->");
  for (std::size_t at = 0, comma = 0; at < arrow; at = comma + 1) {
    comma = std::min(spec.find(',', at), arrow);
    terms.push_back(spec.substr(at, comma - at));
  }
  terms.push_back(spec.substr(arrow + 2));
  std::array<std::size_t, 128> extent{}, at{};  // by letter
  std::string letters;
  for (std::size_t t = 0; t + 1 < terms.size(); ++t) {
    for (std::size_t k = 0; k < terms[t].size(); ++k) {
      extent[std::size_t(terms[t][k])] = in[t].second[k];
      if (letters.find(terms[t][k]) == std::string::npos) letters += terms[t][k];
    }
  }
  auto flat = [&](std::string_view term) {  // row-major offset of `at` in a term
    std::size_t f = 0;
    for (char c : term) f = f * extent[std::size_t(c)] + at[std::size_t(c)];
    return f;
  };
  std::size_t out_count = 1;
  for (char c : terms.back()) out_count *= extent[std::size_t(c)];
  values out(out_count, 0.0F);
  for (;;) {  // an odometer over all letters
    float product = 1;
    for (std::size_t t = 0; t + 1 < terms.size(); ++t) product *= (*in[t].first)[flat(terms[t])];
    out[flat(terms.back())] += product;
    std::size_t k = letters.size();
    while (k > 0 && ++at[std::size_t(letters[k - 1])] == extent[std::size_t(letters[k - 1])]) {
      at[std::size_t(letters[--k])] = 0;
    }
    if (k == 0) return out;
  }
}

// OK only if every rank agrees: its shard matches the reference, its counted bytes the plan.
void report(const char* name, const values& got, const values& want, std::uint64_t counted,
            std::uint64_t planned) {
  bool ok = got.size() == want.size() && counted == planned;
  for (std::size_t i = 0; ok && i < got.size(); ++i)
    ok = std::abs(got[i] - want[i]) <= 1e-4F * (1 + std::abs(want[i]));
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all == 0) ++failures;
  char line[160];
  std::snprintf(line, sizeof line, "%s %-44s rank 0 sent %7llu B, plan says %7llu B\n\n",
                all ? "OK  " : "FAIL", name, static_cast<unsigned long long>(counted),
                static_cast<unsigned long long>(planned));
  say(line);
}

// What this rank should hold of y: the block of the global reference at local_offsets().
// A partial layout has no such block (only the sum is defined): gather it, sums added.
template <class Y>
values mine(const Y& y, const values& want) {
  if constexpr (Y::layout.any_partial()) {
    return want;
  } else {
    values out;
    std::array<std::size_t, Y::rank> at{};  // an odometer over the local shard
    for (std::size_t n = 0; n < y.local_count(); ++n) {
      std::size_t flat = 0;
      for (std::size_t k = 0; k < Y::rank; ++k)
        flat = flat * y.extents()[k] + y.local_offsets()[k] + at[k];
      out.push_back(want[flat]);
      for (std::size_t k = Y::rank; k-- > 0 && ++at[k] == y.local_extents()[k];) at[k] = 0;
    }
    return out;
  }
}
template <class Y>
values held(const Y& y) {
  if constexpr (Y::layout.any_partial()) {
    return zest::to_global(y);
  } else {
    return values(y.local().begin(), y.local().end());
  }
}

// zest::redistribute<To>(x), wrapped: print its plan (zest::explain), run it, check it.
template <class To, class X>
auto check_redistribute(const char* name, const X& x, const values& want) {
  const zest::plan_report plan = zest::explain<To>(x);
  say(plan.str());
  x.mesh().reset_stats();
  auto y = zest::redistribute<To>(x);
  const std::uint64_t counted = x.mesh().stats().bytes_sent();
  report(name, held(y), mine(y, want), counted, plan.bytes());
  return y;
}

// zest::einsum<Spec, Options...>(xs...), wrapped the same way.
template <zest::fixed_string Spec, class O1 = void, class O2 = void, class... X>
auto check_einsum(const char* name, const values& want, const X&... xs) {
  const zest::plan_report plan = zest::explain<Spec, O1, O2>(xs...);
  say(plan.str());
  const auto& mesh = std::get<0>(std::tie(xs...)).mesh();
  mesh.reset_stats();
  auto y = zest::einsum<Spec, O1, O2>(xs...);
  const std::uint64_t counted = mesh.stats().bytes_sent();
  report(name, held(y), mine(y, want), counted, plan.bytes());
  return y;
}

// A 2-D partial tensor whose summands really differ: global element i lives on the rank
// whose coordinate on `axis` is i % size; the others hold 0 there. local_offsets() says
// where this rank's shard sits in the global tensor.
template <class X>
X make_partial(const mesh_t& m, std::size_t axis, const typename X::extents_type& e,
               const values& g) {
  X t(m, e);
  const auto& lo = t.local_offsets();
  const auto& le = t.local_extents();
  for (std::size_t i = 0; i < le[0]; ++i) {
    for (std::size_t j = 0; j < le[1]; ++j) {
      const std::size_t flat = (lo[0] + i) * e[1] + lo[1] + j;
      const auto owner = static_cast<int>(flat % static_cast<std::size_t>(m.size(axis)));
      t.local()[i * le[1] + j] = owner == m.coord(axis) ? g[flat] : 0.0F;
    }
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);  // MPI_Init here, MPI_Finalize when main returns
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // 4 ranks -> 2x2; 2 ranks -> 2x1; 1 rank -> 1x1 (any even n >= 4 -> (n/2)x2). Rank r sits
  // at row-major coordinates: (dp, tp) = (r / tp, r % tp); each axis has its communicator.
  const int tp = world >= 4 && world % 2 == 0 ? 2 : 1;
  mesh_t m(MPI_COMM_WORLD, {world / tp, tp});
  rank0 = m.rank() == 0;
  say("zest einsum tour on " + m.describe() +
      (world == 4 ? "\n\n" : "  (run with mpiexec -n 4 for a 2x2 mesh)\n\n"));

  // ---- 1. Tensors and layouts ----------------------------------------------------------
  // A layout lists what each mesh axis does to the tensor; unnamed axes replicate. 7 rows
  // over 2 ranks is uneven: blocks are balanced, the first ranks get the extra row.
  using ab = zest::tensor<float, mesh_t, "ab">;  // replicated everywhere
  using ab_a = zest::tensor<float, mesh_t, "ab", layout<split<'a', "dp">>>;
  using ab_b = zest::tensor<float, mesh_t, "ab", layout<split<'b', "dp">>>;
  using ab_p = zest::tensor<float, mesh_t, "ab", layout<partial<"dp">>>;
  using ab_ap = zest::tensor<float, mesh_t, "ab", layout<split<'a', "dp">, partial<"tp">>>;
  using ab_ab = zest::tensor<float, mesh_t, "ab", layout<split<'a', "dp">, split<'b', "tp">>>;
  const ab::extents_type e{7, 10};
  const values g = global_values(70, 1);
  const auto x_rep = ab::from_global(m, e, g);  // each rank keeps the block its layout gives it
  const auto x_a = ab_a::from_global(m, e, g);
  const auto x_ab = ab_ab::from_global(m, e, g);
  const auto x_p = make_partial<ab_p>(m, 0, e, g);
  const auto x_ap = make_partial<ab_ap>(m, 1, e, g);
  say("== 1. Who holds what: zest::visualize\n" + zest::visualize(x_ab) + zest::visualize(x_p) +
      "\n");

  // ---- 2. Every per-axis transition: the collective follows from the two layouts ---------
  say("== 2. Transitions: zest::redistribute<layout>(x)\n");
  check_redistribute<layout<>>("split(a:dp) -> replicate: all-gather", x_a, g);
  check_redistribute<layout<>>("partial(dp) -> replicate: all-reduce", x_p, g);
  check_redistribute<layout<split<'a', "dp">>>("partial(dp) -> split(a:dp): reduce-scatter", x_p,
                                               g);
  auto x_b = check_redistribute<layout<split<'b', "dp">>>("split(a:dp) -> split(b:dp): all-to-all",
                                                          x_a, g);
  static_assert(std::is_same_v<decltype(x_b), ab_b>);  // the result's layout is in its type
  check_redistribute<layout<split<'a', "dp">>>("replicate -> split(a:dp): local slice", x_rep, g);
  check_redistribute<layout<partial<"dp">>>("replicate -> partial(dp): keep on coord 0", x_rep, g);
  // Several axes at once: the partial sum over tp becomes a nested split of a ...
  check_redistribute<layout<split<'a', "dp", "tp">>>("split(a:dp) partial(tp) -> split(a:dp,tp)",
                                                     x_ap, g);
  // ... and swapping which axis splits which dim takes a gather, an all-to-all and a slice.
  check_redistribute<layout<split<'b', "dp">, split<'a', "tp">>>(
      "split(a:dp) split(b:tp) -> swapped", x_ab, g);

  // ---- 3. A dense layer y = x w, "bsm,mh->bsh", three ways --------------------------------
  // b = batch, s = sequence, m = model, h = hidden. The einsum derives the output layout at
  // compile time (static_assert on it) and runs only the collectives the layouts need.
  const std::size_t B = 6, S = 3, M = 8, H = 10;
  const values gx = global_values(B * S * M, 2), gw = global_values(M * H, 3),
               gdy = global_values(B * S * H, 4);
  const values gy = naive_einsum("bsm,mh->bsh", {{&gx, {B, S, M}}, {&gw, {M, H}}});
  using x_dp = zest::tensor<float, mesh_t, "bsm", layout<split<'b', "dp">>>;
  const auto x = x_dp::from_global(m, {B, S, M}, gx);

  say("== 3a. Data parallel: x split(b:dp), w replicated -> no communication\n");
  const auto w_rep = zest::tensor<float, mesh_t, "mh">::from_global(m, {M, H}, gw);
  auto y_dp = check_einsum<"bsm,mh->bsh">("data parallel: y split(b:dp)", gy, x, w_rep);
  static_assert(zest::has_layout<decltype(y_dp), layout<split<'b', "dp">>>);

  say("== 3b. ZeRO-3: w stored split(m:dp), all-gathered on use (policy gather_weights)\n");
  using w_zero_t = zest::tensor<float, mesh_t, "mh", layout<split<'m', "dp">>>;
  const auto w_zero = w_zero_t::from_global(m, {M, H}, gw);
  check_einsum<"bsm,mh->bsh">("ZeRO-3 forward: gather w, y split(b:dp)", gy, x, w_zero);
  // Backward: dw = x^T dy sums over b, which is split: each dp rank holds a summand, so the
  // deduced layout is partial(dp). Forcing the stored layout makes that a reduce-scatter.
  const auto dy =
      zest::tensor<float, mesh_t, "bsh", layout<split<'b', "dp">>>::from_global(m, {B, S, H}, gdy);
  static_assert(
      zest::has_layout<decltype(zest::einsum<"bsm,bsh->mh">(x, dy)), layout<partial<"dp">>>);
  const values gdw = naive_einsum("bsm,bsh->mh", {{&gx, {B, S, M}}, {&gdy, {B, S, H}}});
  auto dw = check_einsum<"bsm,bsh->mh", layout<split<'m', "dp">>>(
      "ZeRO-3 grad: reduce-scatter to split(m:dp)", gdw, x, dy);
  static_assert(std::is_same_v<decltype(dw), w_zero_t>);  // the gradient has the weight's type

  say("== 3c. Megatron MLP on tp: column-parallel w1, row-parallel w2 (dp still splits b)\n");
  const values gw1 = global_values(M * H, 5), gw2 = global_values(H * M, 6);
  const auto w1 =
      zest::tensor<float, mesh_t, "mh", layout<split<'h', "tp">>>::from_global(m, {M, H}, gw1);
  const auto w2 =
      zest::tensor<float, mesh_t, "hm", layout<split<'h', "tp">>>::from_global(m, {H, M}, gw2);
  values gh = naive_einsum("bsm,mh->bsh", {{&gx, {B, S, M}}, {&gw1, {M, H}}});
  auto h1 = check_einsum<"bsm,mh->bsh">("column parallel: h split(b:dp) split(h:tp)", gh, x, w1);
  static_assert(zest::has_layout<decltype(h1), layout<split<'b', "dp">, split<'h', "tp">>>);
  // An elementwise op on a split tensor is local: apply ReLU to the shard (not to a partial!).
  for (float& v : h1.local()) v = std::max(v, 0.0F);
  for (float& v : gh) v = std::max(v, 0.0F);
  const values gz = naive_einsum("bsh,hm->bsm", {{&gh, {B, S, H}}, {&gw2, {H, M}}});
  // h is contracted and split alike: each tp rank has a summand; name the output layout to
  // all-reduce it (without it, the result type would say partial(tp)).
  static_assert(zest::has_layout<decltype(zest::einsum<"bsh,hm->bsm">(h1, w2)),
                                 layout<split<'b', "dp">, partial<"tp">>>);
  check_einsum<"bsh,hm->bsm", layout<split<'b', "dp">>>("row parallel: partial(tp) all-reduced", gz,
                                                        h1, w2);

  // ---- 4. GShard MoE dispatch: group split -> expert split is one all-to-all ----------------
  // G groups of S tokens, E experts with capacity C. The one-hot mask sends token s of group
  // g to expert (g + s) % E, slot s / E (dropped when over capacity).
  say("== 4. GShard dispatch: GSEC,GSM->EGCM, then split(G:dp) -> split(E:dp)\n");
  const std::size_t G = 4, Sg = 6, E = 4, C = 2, Mg = 5;
  values gmask(G * Sg * E * C, 0.0F);
  for (std::size_t gi = 0; gi < G; ++gi) {
    for (std::size_t s = 0; s < Sg; ++s) {
      if (s / E < C) gmask[((gi * Sg + s) * E + (gi + s) % E) * C + s / E] = 1;
    }
  }
  const values gtok = global_values(G * Sg * Mg, 7);
  const auto mask = zest::tensor<float, mesh_t, "GSEC", layout<split<'G', "dp">>>::from_global(
      m, {G, Sg, E, C}, gmask);
  const auto tokens = zest::tensor<float, mesh_t, "GSM", layout<split<'G', "dp">>>::from_global(
      m, {G, Sg, Mg}, gtok);
  const values gdisp =
      naive_einsum("GSEC,GSM->EGCM", {{&gmask, {G, Sg, E, C}}, {&gtok, {G, Sg, Mg}}});
  auto dispatched =
      check_einsum<"GSEC,GSM->EGCM">("dispatch: local, EGCM split(G:dp)", gdisp, mask, tokens);
  auto by_expert = check_redistribute<layout<split<'E', "dp">>>(
      "EGCM split(G:dp) -> split(E:dp): all-to-all", dispatched, gdisp);
  // Each rank now holds all tokens routed to its experts: the expert layer is local.
  const std::size_t He = 3;
  const values gwe = global_values(E * Mg * He, 8);
  const auto w_e = zest::tensor<float, mesh_t, "EMH", layout<split<'E', "dp">>>::from_global(
      m, {E, Mg, He}, gwe);
  const values gexp =
      naive_einsum("EGCM,EMH->EGCH", {{&gdisp, {E, G, C, Mg}}, {&gwe, {E, Mg, He}}});
  check_einsum<"EGCM,EMH->EGCH">("experts: EGCM,EMH->EGCH, local", gexp, by_expert, w_e);

  say(failures == 0 ? "all cases OK\n" : std::to_string(failures) + " case(s) FAILED\n");
  return failures;
}
