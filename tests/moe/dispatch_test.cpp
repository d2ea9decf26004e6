// MoE dispatch, experts and combine (zest/moe/dispatch.hpp) with fixed routing decisions:
// the index path equals GShard's einsum path (values and every gradient) on each
// mesh<"dp", "ep"> shape, even and uneven group counts; central differences (double) of the
// whole dispatch -> all-to-all -> experts -> all-to-all -> combine pipeline; the
// all-to-all bytes of forward and backward equal all_to_all_bytes(); the layouts on either
// side of the all-to-all; bad routing indices throw.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/moe/dispatch.hpp"

TEST_SUITE_BEGIN("moe_dispatch");
// One namespace per file: the files of this folder share one unity translation unit.
namespace dispatch_tests {

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

using mesh2 = mesh<"dp", "ep">;
using tokens = layout<split<'g', "dp", "ep">>;
using experts = layout<split<'e', "ep">>;
using x_t = tensor<double, mesh2, "gsm", tokens>;
using index_t = tensor<std::int32_t, mesh2, "gsk", tokens>;
using weight_t = tensor<double, mesh2, "gsk", tokens>;
using gsec_t = tensor<double, mesh2, "gsec", tokens>;
using w_in_t = tensor<double, mesh2, "emh", experts>;
using b_in_t = tensor<double, mesh2, "eh", experts>;
using w_out_t = tensor<double, mesh2, "ehm", experts>;
using b_out_t = tensor<double, mesh2, "em", experts>;
using globals = std::vector<std::vector<double>>;

// The dispatched tensor on either side of the all-to-all.
static_assert(has_layout<moe::expert_layout_of<"ep", tensor<double, mesh2, "egcm", tokens>>::type,
                         layout<split<'g', "dp">, split<'e', "ep">>>);
static_assert(has_layout<moe::expert_layout_of<"ep", tensor<double, mesh2, "egcm",
                                                            layout<split<'g', "ep", "dp">>>>::type,
                         layout<split<'g', "dp">, split<'e', "ep">>>);
static_assert(
    has_layout<
        moe::expert_layout_of<"ep", tensor<double, mesh2, "egcm", layout<split<'g', "dp">>>>::type,
        layout<split<'g', "dp">, split<'e', "ep">>>);

struct shape {
  std::size_t g = 4, s = 5, m = 3, e = 4, c = 2, h = 3, k = 2;
};

// Fixed routing, GShard's order: first choices take slots before second choices; a choice
// whose slot would reach the capacity is dropped (slot -1, weight 0).
struct routing_data {
  std::vector<double> expert, slot, weight;  // "gsk"
  std::vector<double> dispatch, combine;     // "gsec"
};
routing_data make_routing(const shape& d) {
  routing_data r;
  const std::size_t n = d.g * d.s * d.k;
  r.expert.assign(n, 0);
  r.slot.assign(n, -1);
  r.weight.assign(n, 0);
  r.dispatch.assign(d.g * d.s * d.e * d.c, 0);
  r.combine.assign(d.g * d.s * d.e * d.c, 0);
  for (std::size_t g = 0; g < d.g; ++g) {
    std::vector<std::size_t> used(d.e, 0);
    for (std::size_t j = 0; j < d.k; ++j) {
      for (std::size_t s = 0; s < d.s; ++s) {
        const std::size_t first = (g * 3 + s * 5) % d.e;
        const std::size_t e = j == 0 ? first : (first + 1 + (g + s) % (d.e - 1)) % d.e;
        const std::size_t at = (g * d.s + s) * d.k + j;
        r.expert[at] = static_cast<double>(e);
        if (used[e] >= d.c) continue;
        const std::size_t c = used[e]++;
        const double w = 0.25 + 0.1 * static_cast<double>((g + 2 * s + j) % 5);
        r.slot[at] = static_cast<double>(c);
        r.weight[at] = w;
        const std::size_t sec = ((g * d.s + s) * d.e + e) * d.c + c;
        r.dispatch[sec] = 1;
        r.combine[sec] = w;
      }
    }
  }
  return r;
}

template <class X>
X from(const mesh2& m, const typename X::extents_type& e, const std::vector<double>& v) {
  using T = typename X::value_type;
  const std::vector<T> t(v.begin(), v.end());
  return X::from_global(m, e, std::span<const T>(t));
}

template <class V>
std::vector<double> as_double(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Largest |a - b| over the largest |b| (which must not vanish).
double relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  if (a.size() != b.size()) return 1e30;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? worst / scale : 1e30;
}

enum input : std::size_t { in_x, in_route, in_w_in, in_b_in, in_w_out, in_b_out, inputs };

struct run_result {
  double loss = 0;
  std::vector<double> value;
  globals grads;
  std::uint64_t forward_bytes = 0, step_bytes = 0;
  moe::all_to_all_volume formula;
};

// The pipeline on one path; in[in_route] is the weight "gsk" (index path) or the combine
// tensor "gsec" (einsum path). loss = sum(z * R).
template <bool Index>
run_result run(const mesh2& m, const shape& d, const routing_data& r, const globals& in,
               bool grads) {
  ad::tape t;
  const std::array<std::size_t, 3> ge{d.g, d.s, d.k};
  const std::array<std::size_t, 4> gsec{d.g, d.s, d.e, d.c};
  auto x = t.parameter(from<x_t>(m, {d.g, d.s, d.m}, in[in_x]));
  auto w_in = t.parameter(from<w_in_t>(m, {d.e, d.m, d.h}, in[in_w_in]));
  auto b_in = t.parameter(from<b_in_t>(m, {d.e, d.h}, in[in_b_in]));
  auto w_out = t.parameter(from<w_out_t>(m, {d.e, d.h, d.m}, in[in_w_out]));
  auto b_out = t.parameter(from<b_out_t>(m, {d.e, d.m}, in[in_b_out]));
  const auto expert = from<index_t>(m, ge, r.expert);
  const auto slot = from<index_t>(m, ge, r.slot);
  m.reset_stats();
  auto finish = [&](const auto& dispatched, const auto& route, const auto& combine) {
    using d_t = typename std::remove_cvref_t<decltype(dispatched)>::tensor_type;
    static_assert(std::is_same_v<d_t, tensor<double, mesh2, "egcm", tokens>>);
    auto de = moe::to_expert_layout<"ep">(dispatched);
    static_assert(
        has_layout<typename decltype(de)::tensor_type, layout<split<'g', "dp">, split<'e', "ep">>>);
    auto h = moe::expert_feed_forward(de, w_in, b_in, w_out, b_out);
    auto y = moe::to_token_layout<d_t::layout>(h);
    auto z = combine(y);
    static_assert(std::is_same_v<typename decltype(z)::tensor_type, x_t>);
    using r_t = tensor<double, mesh2, "gsm">;
    auto rr = t.constant(from<r_t>(m, {d.g, d.s, d.m}, global_values(z.value().extents(), 99)));
    auto loss = ad::sum(z * rr);
    run_result out;
    out.forward_bytes = m.stats()[collective::all_to_all].bytes_sent;
    out.formula = moe::all_to_all_bytes<"ep">(dispatched.value());
    if (grads) {
      ad::backward(loss);
      out.step_bytes = m.stats()[collective::all_to_all].bytes_sent;
      out.value = as_double(to_global(z.value()));
      out.grads = {as_double(to_global(x.grad())),     as_double(to_global(route.grad())),
                   as_double(to_global(w_in.grad())),  as_double(to_global(b_in.grad())),
                   as_double(to_global(w_out.grad())), as_double(to_global(b_out.grad()))};
    }
    out.loss = static_cast<double>(to_global(loss.value())[0]);
    return out;
  };
  if constexpr (Index) {
    auto weight = t.parameter(from<weight_t>(m, ge, in[in_route]));
    auto dispatched = moe::dispatch_by_index(x, expert, slot, d.e, d.c);
    return finish(dispatched, weight,
                  [&](const auto& y) { return moe::combine_by_index(y, weight, expert, slot); });
  } else {
    auto dispatch = t.constant(from<gsec_t>(m, gsec, r.dispatch));
    auto combine = t.parameter(from<gsec_t>(m, gsec, in[in_route]));
    auto dispatched = ad::einsum<"gsec,gsm->egcm">(dispatch, x);
    return finish(dispatched, combine,
                  [&](const auto& y) { return ad::einsum<"gsec,egcm->gsm">(combine, y); });
  }
}

globals inputs_for(const shape& d, const std::vector<double>& route) {
  globals in(inputs);
  in[in_x] = global_values(std::array<std::size_t, 3>{d.g, d.s, d.m}, 1);
  in[in_route] = route;
  in[in_w_in] = global_values(std::array<std::size_t, 3>{d.e, d.m, d.h}, 3);
  in[in_b_in] = global_values(std::array<std::size_t, 2>{d.e, d.h}, 4);
  in[in_w_out] = global_values(std::array<std::size_t, 3>{d.e, d.h, d.m}, 5);
  in[in_b_out] = global_values(std::array<std::size_t, 2>{d.e, d.m}, 6);
  return in;
}

std::vector<mesh2> meshes() {
  std::vector<mesh2> out;
  for (const auto& s : mesh_shapes())
    out.emplace_back(MPI_COMM_WORLD, std::array<int, 2>{s[0], s[1]});
  return out;
}

// The gradient of the combine tensor at each kept choice's (e, c): the weight's gradient.
std::vector<double> combine_grad_as_weight(const shape& d, const routing_data& r,
                                           const std::vector<double>& dcombine) {
  std::vector<double> out(r.slot.size(), 0);
  for (std::size_t i = 0; i < r.slot.size(); ++i) {
    if (r.slot[i] < 0) continue;
    const std::size_t gs = i / d.k;
    const auto e = static_cast<std::size_t>(r.expert[i]);
    const auto c = static_cast<std::size_t>(r.slot[i]);
    out[i] = dcombine[(gs * d.e + e) * d.c + c];
  }
  return out;
}

void check_paths_agree(const shape& d) {
  const routing_data r = make_routing(d);
  std::size_t dropped = 0;
  for (double s : r.slot) dropped += s < 0 ? 1 : 0;
  CHECK(dropped > 0);  // the capacity is exceeded somewhere
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    const run_result a = run<true>(m, d, r, inputs_for(d, r.weight), true);
    const run_result b = run<false>(m, d, r, inputs_for(d, r.combine), true);
    CHECK(relative(a.value, b.value) < 1e-13);
    CHECK(std::abs(a.loss - b.loss) < 1e-12 * std::max(1.0, std::abs(b.loss)));
    for (std::size_t i = 0; i < inputs; ++i) {
      CAPTURE(i);
      if (i == in_route) {
        CHECK(relative(a.grads[i], combine_grad_as_weight(d, r, b.grads[i])) < 1e-13);
      } else {
        CHECK(relative(a.grads[i], b.grads[i]) < 1e-13);
      }
    }
    // The counters against the formula, on both paths.
    for (const run_result* p : {&a, &b}) {
      CHECK(p->forward_bytes == p->formula.forward());
      CHECK(p->step_bytes == p->formula.step());
    }
    const auto n = static_cast<std::size_t>(m.size(1));
    if (n > 1) {
      CHECK(a.formula.forward() > 0);
    } else {
      CHECK(a.formula.step() == 0);
    }
  }
}

// The naive pipeline over global arrays, for the values.
std::vector<double> reference(const shape& d, const routing_data& r, const globals& in) {
  const auto gelu = [](double v) {
    return 0.5 * v *
           (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
  };
  std::vector<double> z(d.g * d.s * d.m, 0);
  for (std::size_t i = 0; i < r.slot.size(); ++i) {
    if (r.slot[i] < 0) continue;
    const std::size_t gs = i / d.k;
    const auto e = static_cast<std::size_t>(r.expert[i]);
    std::vector<double> h(d.h);
    for (std::size_t hh = 0; hh < d.h; ++hh) {
      double v = in[in_b_in][e * d.h + hh];
      for (std::size_t mm = 0; mm < d.m; ++mm)
        v += in[in_x][gs * d.m + mm] * in[in_w_in][(e * d.m + mm) * d.h + hh];
      h[hh] = gelu(v);
    }
    for (std::size_t mm = 0; mm < d.m; ++mm) {
      double v = in[in_b_out][e * d.m + mm];
      for (std::size_t hh = 0; hh < d.h; ++hh) v += h[hh] * in[in_w_out][(e * d.h + hh) * d.m + mm];
      z[gs * d.m + mm] += r.weight[i] * v;
    }
  }
  return z;
}

}  // namespace

TEST_CASE("index path equals einsum path: values, gradients, all-to-all bytes") {
  SUBCASE("even groups") { check_paths_agree(shape{}); }
  SUBCASE("uneven groups (5 over up to 4 ranks), top-1") {
    check_paths_agree(shape{5, 6, 4, 4, 1, 3, 1});
  }
  SUBCASE("more groups than ranks, 8 experts") { check_paths_agree(shape{6, 4, 2, 8, 1, 2, 2}); }
}

TEST_CASE("dispatch -> experts -> combine: values and central differences (double)") {
  const shape d{};
  const routing_data r = make_routing(d);
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    const globals in = inputs_for(d, r.weight);
    const run_result base = run<true>(m, d, r, in, true);
    CHECK(relative(base.value, reference(d, r, in)) < 1e-13);
    const double h = 1e-6;
    for (std::size_t i = 0; i < inputs; ++i) {
      CAPTURE(i);
      double worst = 0, scale = 0;
      for (std::size_t e = 0; e < in[i].size(); ++e) {
        globals plus = in, minus = in;
        plus[i][e] += h;
        minus[i][e] -= h;
        const double fd =
            (run<true>(m, d, r, plus, false).loss - run<true>(m, d, r, minus, false).loss) /
            (2 * h);
        worst = std::max(worst, std::abs(fd - base.grads[i][e]));
        scale = std::max(scale, std::abs(fd));
      }
      CHECK(worst < 1e-7 * scale);
    }
    // The einsum path's combine gradient by differences too (a few entries suffice).
    const globals ein = inputs_for(d, r.combine);
    const run_result eb = run<false>(m, d, r, ein, true);
    for (std::size_t e = 0; e < ein[in_route].size(); e += 7) {
      globals plus = ein, minus = ein;
      plus[in_route][e] += h;
      minus[in_route][e] -= h;
      const double fd =
          (run<false>(m, d, r, plus, false).loss - run<false>(m, d, r, minus, false).loss) /
          (2 * h);
      CHECK(std::abs(fd - eb.grads[in_route][e]) < 1e-7 * std::max(1.0, std::abs(fd)));
    }
  }
}

TEST_CASE("dispatch_by_index: empty slots are zero, routes are checked") {
  const shape d{};
  const routing_data r = make_routing(d);
  for (const auto& m : meshes()) {
    ad::tape t;
    const std::array<std::size_t, 3> ge{d.g, d.s, d.k};
    auto x = t.constant(from<x_t>(m, {d.g, d.s, d.m}, inputs_for(d, r.weight)[in_x]));
    const auto expert = from<index_t>(m, ge, r.expert);
    const auto slot = from<index_t>(m, ge, r.slot);
    const auto dispatched = to_global(moe::dispatch_by_index(x, expert, slot, d.e, d.c).value());
    const auto xg = to_global(x.value());
    // Every slot holds its token's row or zeros.
    std::vector<double> want(d.e * d.g * d.c * d.m, 0);
    for (std::size_t i = 0; i < r.slot.size(); ++i) {
      if (r.slot[i] < 0) continue;
      const std::size_t g = i / (d.s * d.k), s = (i / d.k) % d.s;
      const auto e = static_cast<std::size_t>(r.expert[i]);
      const auto c = static_cast<std::size_t>(r.slot[i]);
      for (std::size_t mm = 0; mm < d.m; ++mm)
        want[((e * d.g + g) * d.c + c) * d.m + mm] = xg[(g * d.s + s) * d.m + mm];
    }
    CHECK(as_double(dispatched) == want);
    // An expert or slot out of range: every rank holds a group, each has a bad entry.
    if (static_cast<std::size_t>(m.world_size()) <= d.g) {
      auto bad = r.expert;
      for (std::size_t g = 0; g < d.g; ++g) bad[g * d.s * d.k] = static_cast<double>(d.e);
      const auto bad_expert = from<index_t>(m, ge, bad);
      CHECK_THROWS_AS(moe::dispatch_by_index(x, bad_expert, slot, d.e, d.c), shape_error);
      CHECK_THROWS_AS(moe::dispatch_by_index(x, expert, slot, d.e, d.c - 1), shape_error);
    }
  }
}

}  // namespace dispatch_tests

TEST_SUITE_END();
