// autodiff::scaled_dot_product_attention (zest/autodiff/attention.hpp) and masked_softmax
// (zest/autodiff/ops.hpp) at 1, 2 and 4 ranks: values against attention computed here with
// plain loops over global row-major arrays, gradients of q, k and v with
// zest::testing::check_gradients (double, default tolerances). Grouped-query heads
// ("bkgtd,bksd,bkse->bkgte", g = 2 query heads per kv head), multi-query ("bgtd,bsd,bse->bgte")
// and multi-head ("bhtd,bhsd,bhse->bhte"); causal, masked ("bts" and "ts" masks, one query's
// row masked whole: zeros), both, and neither. Replicated, split over dp (batch), over dp x tp
// (batch, heads), queries split along t (causal with global indices), and keys split along s
// (gathered for the softmax); b = 3 and 3 heads do not split evenly over 2 or 4 ranks. Each on
// the host backend (mesh<"dp", "tp">) and the emulated one (emulated_mesh, the GPU's code
// paths), at every 2-D mesh shape of the world; one float run. The spec's checks are static.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/attention.hpp"
#include "zest/mesh/emulated_mesh.hpp"
#include "zest/testing/check_gradients.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

// The spec's checks.
using problem = ad::detail::attention_problem;
constexpr problem problem_of(std::string_view s) { return ad::detail::attention_problem_of(s); }
static_assert(problem_of("bkgtd,bksd,bkse->bkgte") == problem::none);
static_assert(problem_of("bgtd,bsd,bse->bgte") == problem::none);
static_assert(problem_of("bhtd,bhsd,bhsd->bhtd") == problem::none);  // v's dim named as k's
static_assert(problem_of("td,sd,se->te") == problem::none);
static_assert(problem_of("bhtd,bhsd->bhte") == problem::format);
static_assert(problem_of("bhtd,bhsd,bhse,x->bhte") == problem::format);
static_assert(problem_of("bhtd,d,bhse->bhte") == problem::short_operand);
static_assert(problem_of("bhtt,bhst,bhse->bhte") == problem::repeated_letter);
static_assert(problem_of("bhtd,bhsc,bhse->bhte") == problem::head_dim);
static_assert(problem_of("bhtd,bhsd,bhre->bhte") == problem::key_dim);
static_assert(problem_of("bhtd,bhbd,bhbe->bhte") == problem::repeated_letter);
static_assert(problem_of("bstd,bsrd,bsre->bste") == problem::none);
static_assert(problem_of("bhtd,bhhd,bhhe->bhte") == problem::repeated_letter);
static_assert(problem_of("bhtd,bhbd,bhbe->bhte") != problem::none);
static_assert(problem_of("bhtd,bxsd,bxse->bhte") == problem::batch_dims);
static_assert(problem_of("bhtd,bhsd,bhse->bhtd") == problem::output);
static_assert(problem_of("bhtd,bhsd,bhse->hbte") == problem::output);
static_assert(problem_of("bhtd,bhtd,bhte->bhte") == problem::key_in_query);
// The einsums it runs.
using gqa_plan = ad::detail::attention_plan<"bkgtd,bksd,bkse->bkgte">;
static_assert(view_of<gqa_plan::scores_spec> == "bkgtd,bksd->bkgts");
static_assert(view_of<gqa_plan::output_spec> == "bkgts,bkse->bkgte");
static_assert(gqa_plan::query == 't' && gqa_plan::key == 's' && gqa_plan::head == 'd');

template <class F>
void on_every_mesh(F f) {
  for (const auto& shape : mesh_shapes()) {
    mesh<"dp", "tp"> host(MPI_COMM_WORLD, shape);
    CAPTURE(host.describe());
    f(host);
    emulated_mesh<"dp", "tp"> emulated(MPI_COMM_WORLD, shape);
    f(emulated);
  }
}

// Extents of the grouped form: q [B][K][G][T][D], k [B][K][S][D], v [B][K][S][E], the output
// [B][K][G][T][E]. MHA is G = 1 and MQA K = 1: the same row-major arrays.
struct sizes {
  std::size_t B, K, G, T, S, D, E;
};

// mask(b, t, s): may query t of batch b attend to key s.
using mask_fn = bool (*)(std::size_t, std::size_t, std::size_t);
bool everywhere(std::size_t, std::size_t, std::size_t) { return true; }
// Drops a few keys, and query t = 2 of batch 1 whole.
bool some(std::size_t b, std::size_t t, std::size_t s) {
  if (b == 1 && t == 2) return false;
  return (b + 2 * t + 3 * s) % 4 != 1;
}
// The same without the batch: for "ts" masks.
bool some_ts(std::size_t, std::size_t t, std::size_t s) { return (t + s) % 3 != 2 || s == 0; }

std::vector<double> reference_attention(const sizes& n, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        bool causal, double scale, mask_fn mask) {
  std::vector<double> out(n.B * n.K * n.G * n.T * n.E, 0.0);
  std::vector<double> w(n.S);
  for (std::size_t b = 0; b < n.B; ++b) {
    for (std::size_t h = 0; h < n.K; ++h) {
      for (std::size_t g = 0; g < n.G; ++g) {
        for (std::size_t t = 0; t < n.T; ++t) {
          const std::size_t qrow = (((b * n.K + h) * n.G + g) * n.T + t);
          double top = -1e300;
          bool any = false;
          for (std::size_t s = 0; s < n.S; ++s) {
            const bool keep = mask(b, t, s) && !(causal && s > t);
            w[s] = 0;
            if (!keep) continue;
            double dot = 0;
            for (std::size_t d = 0; d < n.D; ++d)
              dot += q[qrow * n.D + d] * k[((b * n.K + h) * n.S + s) * n.D + d];
            w[s] = scale * dot;
            top = any ? std::max(top, w[s]) : w[s];
            any = true;
          }
          if (!any) continue;  // no key: zeros
          double total = 0;
          for (std::size_t s = 0; s < n.S; ++s) {
            const bool keep = mask(b, t, s) && !(causal && s > t);
            w[s] = keep ? std::exp(w[s] - top) : 0.0;
            total += w[s];
          }
          for (std::size_t s = 0; s < n.S; ++s) {
            for (std::size_t e = 0; e < n.E; ++e)
              out[qrow * n.E + e] += w[s] / total * v[((b * n.K + h) * n.S + s) * n.E + e];
          }
        }
      }
    }
  }
  return out;
}

template <class T>
std::vector<double> global_of(const T& t) {
  const auto g = to_global(t);
  return std::vector<double>(g.begin(), g.end());
}

// The loss, a weighted sum of every output, is about 100 here, so the central difference's
// rounding at the default step (1e-16 * 100 / 1e-6 ~ 1e-8) reaches the default absolute
// tolerance on small gradients; a step of 1e-5 keeps it ten times below, and the truncation
// error (h^2 times a third derivative) stays near 1e-10.
gradient_check_options options() {
  gradient_check_options o;
  o.max_elements = 8;
  o.step = 1e-5;
  return o;
}

// A mask tensor of type Mt (dims "bts" or "ts") from mask(b, t, s).
template <class Mt>
Mt mask_tensor(const typename Mt::mesh_type& m, const sizes& n, mask_fn mask) {
  if constexpr (Mt::rank == 3) {
    return Mt::generate(m, {n.B, n.T, n.S}, [&](const auto& i) {
      return static_cast<std::uint8_t>(mask(i[0], i[1], i[2]) ? 1 + i[2] % 2 : 0);
    });
  } else {
    return Mt::generate(m, {n.T, n.S}, [&](const auto& i) {
      return static_cast<std::uint8_t>(mask(0, i[0], i[1]) ? 1 : 0);
    });
  }
}

// One case: the value against the reference, then (with `gradients`) check_gradients of q, k
// and v. Mt is the mask's tensor type, or void.
template <fixed_string Spec, class Qt, class Kt, class Vt, class Mt = void>
void check_case(const typename Qt::mesh_type& m, const sizes& n,
                const typename Qt::extents_type& qe, const typename Kt::extents_type& ke,
                const typename Vt::extents_type& ve, ad::attention_options o, mask_fn mask,
                bool gradients) {
  CAPTURE(view_of<Spec>);
  CAPTURE(layout_string<Qt>());
  CAPTURE(layout_string<Kt>());
  CAPTURE(o.causal);
  const auto qg = global_values(qe, 1), kg = global_values(ke, 2), vg = global_values(ve, 3);
  const Qt q = Qt::from_global(m, qe, qg);
  const Kt k = Kt::from_global(m, ke, kg);
  const Vt v = Vt::from_global(m, ve, vg);
  const double scale = o.scale != 0 ? o.scale : 1 / std::sqrt(static_cast<double>(n.D));
  const auto want = reference_attention(n, qg, kg, vg, o.causal, scale, mask);
  auto attend = [&](const auto& qv, const auto& kv, const auto& vv) {
    if constexpr (std::is_void_v<Mt>) {
      return ad::scaled_dot_product_attention<Spec>(qv, kv, vv, o);
    } else {
      return ad::scaled_dot_product_attention<Spec>(qv, kv, vv, mask_tensor<Mt>(m, n, mask), o);
    }
  };
  {
    ad::tape t;
    auto y = attend(t.constant(Qt(q)), t.constant(Kt(k)), t.constant(Vt(v)));
    const auto got = global_of(y.value());
    CHECK(relative_error(got, want) < 1e-12);
    bool finite = true;
    for (double x : got) finite = finite && std::isfinite(x);
    CHECK(finite);
  }
  if (!gradients) return;
  const auto r = check_gradients(
      options(),
      [&](ad::tape& t, const auto& qv, const auto& kv, const auto& vv) {
        return weighted_sum(t, attend(qv, kv, vv));
      },
      q, k, v);
  CHECK_MESSAGE(r.ok(), r);
}

const sizes gqa{3, 3, 2, 4, 5, 4, 3};

TEST_CASE("grouped-query attention \"bkgtd,bksd,bkse->bkgte\": causal, masked, both, neither") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    const sizes& n = gqa;
    const std::array<std::size_t, 5> qe{n.B, n.K, n.G, n.T, n.D};
    const std::array<std::size_t, 4> ke{n.B, n.K, n.S, n.D}, ve{n.B, n.K, n.S, n.E};
    constexpr fixed_string spec = "bkgtd,bksd,bkse->bkgte";
    using bts = tensor<std::uint8_t, M, "bts", layout<split<'b', "dp">>>;
    auto each = [&]<class QL, class KL, class VL, bool Gradients>() {
      using q_t = tensor<double, M, "bkgtd", QL>;
      using k_t = tensor<double, M, "bksd", KL>;
      using v_t = tensor<double, M, "bkse", VL>;
      check_case<spec, q_t, k_t, v_t>(m, n, qe, ke, ve, {}, everywhere, Gradients);
      check_case<spec, q_t, k_t, v_t>(m, n, qe, ke, ve, {.causal = false, .scale = 0.7}, everywhere,
                                      false);
      check_case<spec, q_t, k_t, v_t, bts>(m, n, qe, ke, ve, {.causal = false}, some, Gradients);
      check_case<spec, q_t, k_t, v_t, bts>(m, n, qe, ke, ve, {}, some, false);
    };
    using bdp = layout<split<'b', "dp">>;
    using heads = layout<split<'b', "dp">, split<'k', "tp">>;
    each.template operator()<layout<>, layout<>, layout<>, false>();
    each.template operator()<bdp, bdp, bdp, false>();
    // Batch over dp and heads over tp (gradients: every element's block on another rank).
    each.template operator()<heads, heads, heads, true>();
    // Queries along t over tp: the causal mask at global indices.
    each.template operator()<layout<split<'b', "dp">, split<'t', "tp">>, bdp, bdp, false>();
    // Keys along s over tp: the scores are gathered along s for the softmax.
    using keys = layout<split<'b', "dp">, split<'s', "tp">>;
    each.template operator()<bdp, keys, keys, false>();
    // The head dim over tp: the scores come out pending and are reduced.
    using head_dim = layout<split<'k', "dp">, split<'d', "tp">>;
    each.template operator()<head_dim, head_dim, layout<split<'k', "dp">>, false>();
  });
}

TEST_CASE("multi-query attention \"bgtd,bsd,bse->bgte\" and k of extent 1") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    const sizes n{3, 1, 3, 4, 4, 2, 3};
    const std::array<std::size_t, 4> qe{n.B, n.G, n.T, n.D};
    const std::array<std::size_t, 3> ke{n.B, n.S, n.D}, ve{n.B, n.S, n.E};
    constexpr fixed_string spec = "bgtd,bsd,bse->bgte";
    using ts = tensor<std::uint8_t, M, "ts">;
    using q_t = tensor<double, M, "bgtd", layout<split<'b', "dp">, split<'g', "tp">>>;
    using k_t = tensor<double, M, "bsd", layout<split<'b', "dp">>>;
    using v_t = tensor<double, M, "bse", layout<split<'b', "dp">>>;
    check_case<spec, q_t, k_t, v_t>(m, n, qe, ke, ve, {}, everywhere, false);
    check_case<spec, q_t, k_t, v_t, ts>(m, n, qe, ke, ve, {}, some_ts, true);
    // The grouped spec with one kv head.
    const std::array<std::size_t, 5> qe5{n.B, 1, n.G, n.T, n.D};
    const std::array<std::size_t, 4> ke5{n.B, 1, n.S, n.D}, ve5{n.B, 1, n.S, n.E};
    using q5_t = tensor<double, M, "bkgtd", layout<split<'b', "dp">, split<'g', "tp">>>;
    using k5_t = tensor<double, M, "bksd", layout<split<'b', "dp">>>;
    using v5_t = tensor<double, M, "bkse", layout<split<'b', "dp">>>;
    check_case<"bkgtd,bksd,bkse->bkgte", q5_t, k5_t, v5_t>(m, n, qe5, ke5, ve5, {}, everywhere,
                                                           false);
  });
}

TEST_CASE("multi-head attention \"bhtd,bhsd,bhse->bhte\" with a \"ts\" mask") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    const sizes n{3, 3, 1, 5, 5, 3, 2};
    const std::array<std::size_t, 4> qe{n.B, n.K, n.T, n.D};
    const std::array<std::size_t, 4> ke{n.B, n.K, n.S, n.D}, ve{n.B, n.K, n.S, n.E};
    constexpr fixed_string spec = "bhtd,bhsd,bhse->bhte";
    using ts = tensor<std::uint8_t, M, "ts", layout<split<'s', "tp">>>;  // gathered on use
    using q_t = tensor<double, M, "bhtd", layout<split<'b', "dp">, split<'h', "tp">>>;
    using k_t = tensor<double, M, "bhsd", layout<split<'b', "dp">, split<'h', "tp">>>;
    using v_t = tensor<double, M, "bhse", layout<split<'b', "dp">, split<'h', "tp">>>;
    check_case<spec, q_t, k_t, v_t>(m, n, qe, ke, ve, {}, everywhere, false);
    check_case<spec, q_t, k_t, v_t, ts>(m, n, qe, ke, ve, {}, some_ts, true);
    check_case<spec, q_t, k_t, v_t, ts>(m, n, qe, ke, ve, {.causal = false, .scale = -0.4}, some_ts,
                                        false);
  });
}

TEST_CASE("attention in float: the kernels the GPU runs, masked and causal") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    const sizes& n = gqa;
    const std::array<std::size_t, 5> qe{n.B, n.K, n.G, n.T, n.D};
    const std::array<std::size_t, 4> ke{n.B, n.K, n.S, n.D}, ve{n.B, n.K, n.S, n.E};
    using heads = layout<split<'b', "dp">, split<'k', "tp">>;
    using q_t = tensor<float, M, "bkgtd", heads>;
    using k_t = tensor<float, M, "bksd", heads>;
    using v_t = tensor<float, M, "bkse", heads>;
    using mask_t = tensor<std::uint8_t, M, "bts">;
    const auto qg = global_values(qe, 1), kg = global_values(ke, 2), vg = global_values(ve, 3);
    auto as_float = [](const std::vector<double>& g) {
      return std::vector<float>(g.begin(), g.end());
    };
    ad::tape t;
    auto q = t.constant(q_t::from_global(m, qe, as_float(qg)));
    auto k = t.constant(k_t::from_global(m, ke, as_float(kg)));
    auto v = t.constant(v_t::from_global(m, ve, as_float(vg)));
    auto y = ad::scaled_dot_product_attention<"bkgtd,bksd,bkse->bkgte">(
        q, k, v, mask_tensor<mask_t>(m, n, some));
    const auto want = reference_attention(n, qg, kg, vg, true, 0.5, some);  // 1/sqrt(4)
    CHECK(relative_error(global_of(y.value()), want) < 1e-5);
  });
}

TEST_CASE("attention: a fully masked query row gives zeros and no gradient") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    const sizes n{2, 1, 1, 3, 3, 2, 2};
    using q_t = tensor<double, M, "btd", layout<split<'t', "dp">>>;
    using kv_t = tensor<double, M, "bsd">;
    using mask_t = tensor<std::uint8_t, M, "bts">;
    const std::array<std::size_t, 3> qe{n.B, n.T, n.D}, ke{n.B, n.S, n.D};
    ad::tape t;
    auto q = t.parameter(q_t::from_global(m, qe, global_values(qe, 1)));
    auto k = t.parameter(kv_t::from_global(m, ke, global_values(ke, 2)));
    auto v = t.parameter(kv_t::from_global(m, ke, global_values(ke, 3)));
    // Batch 1, query 1 attends to nothing.
    const auto mask = mask_t::generate(m, {n.B, n.T, n.S}, [](const auto& i) {
      return static_cast<std::uint8_t>(i[0] == 1 && i[1] == 1 ? 0 : 1);
    });
    auto y = ad::scaled_dot_product_attention<"btd,bsd,bsd->btd">(q, k, v, mask);
    ad::backward(weighted_sum(t, y));
    const auto out = global_of(y.value());
    const auto dq = global_of(q.grad());
    for (std::size_t d = 0; d < n.D; ++d) {
      CHECK(out[(1 * n.T + 1) * n.D + d] == 0.0);
      CHECK(dq[(1 * n.T + 1) * n.D + d] == 0.0);
    }
    bool finite = true;
    for (double x : global_of(k.grad())) finite = finite && std::isfinite(x);
    CHECK(finite);
  });
}

TEST_CASE("masked_softmax against plain loops; its mask's extents are checked") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using x_t = tensor<double, M, "bts", layout<split<'b', "dp">, split<'t', "tp">>>;
    using mask_t = tensor<std::uint8_t, M, "ts", layout<split<'t', "dp">>>;
    const std::array<std::size_t, 3> e{3, 5, 4};
    const auto in = global_values(e, 7);
    const x_t x = x_t::from_global(m, e, in);
    const auto mask = mask_t::generate(m, {e[1], e[2]}, [](const auto& i) {
      return static_cast<std::uint8_t>(i[0] == 3 || (i[0] + i[1]) % 3 == 0 ? 0 : 1);
    });
    std::vector<double> want(in.size(), 0.0), want_causal(in.size(), 0.0);
    for (std::size_t b = 0; b < e[0]; ++b) {
      for (std::size_t t = 0; t < e[1]; ++t) {
        for (int causal = 0; causal < 2; ++causal) {
          auto& out = causal ? want_causal : want;
          const std::size_t row = (b * e[1] + t) * e[2];
          auto keep = [&](std::size_t s) {
            return !(t == 3 || (t + s) % 3 == 0) && !(causal && s > t);
          };
          double top = -1e300, total = 0;
          for (std::size_t s = 0; s < e[2]; ++s)
            if (keep(s)) top = std::max(top, in[row + s]);
          for (std::size_t s = 0; s < e[2]; ++s)
            if (keep(s)) total += std::exp(in[row + s] - top);
          for (std::size_t s = 0; s < e[2]; ++s)
            out[row + s] = keep(s) ? std::exp(in[row + s] - top) / total : 0.0;
        }
      }
    }
    ad::tape t;
    auto xv = t.constant(x_t(x));
    CHECK(relative_error(global_of(ad::masked_softmax<'s'>(xv, mask).value()), want) < 1e-14);
    CHECK(relative_error(global_of(ad::causal_softmax<'t', 's'>(xv, mask).value()), want_causal) <
          1e-14);
    const auto r = check_gradients(
        options(),
        [&](ad::tape& tp, const auto& v) {
          return weighted_sum(tp, ad::causal_softmax<'t', 's'>(v, mask));
        },
        x);
    CHECK_MESSAGE(r.ok(), r);
    const auto wrong = mask_t::generate(m, {e[1], e[2] + 1}, [](const auto&) { return 1; });
    try {
      (void)ad::masked_softmax<'s'>(xv, wrong);
      FAIL("no shape_error");
    } catch (const shape_error& err) {
      const std::string what = err.what();
      CHECK(what.find("masked_softmax") != std::string::npos);
      CHECK(what.find("dim 's'") != std::string::npos);
    }
  });
}

TEST_CASE("attention: mismatched extents and a non-finite scale are refused by name") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using q_t = tensor<double, M, "bhtd", layout<split<'b', "dp">>>;
    using k_t = tensor<double, M, "bhsd", layout<split<'b', "dp">>>;
    using v_t = tensor<double, M, "bhse", layout<split<'b', "dp">>>;
    constexpr fixed_string spec = "bhtd,bhsd,bhse->bhte";
    ad::tape t;
    auto q = t.constant(q_t(m, {2, 3, 4, 6}));
    auto k = t.constant(k_t(m, {2, 3, 5, 6}));
    auto v = t.constant(v_t(m, {2, 3, 5, 2}));
    auto refused = [&](auto&& run, std::initializer_list<std::string_view> parts) {
      try {
        (void)run();
        FAIL("no shape_error");
      } catch (const shape_error& err) {
        const std::string what = err.what();
        CHECK_MESSAGE(what.find("scaled_dot_product_attention<\"bhtd,bhsd,bhse->bhte\">") !=
                          std::string::npos,
                      what);
        for (auto part : parts) CHECK_MESSAGE(what.find(part) != std::string::npos, what);
      }
    };
    // q's head dim 6, k's 4.
    auto k4 = t.constant(k_t(m, {2, 3, 5, 4}));
    refused([&] { return ad::scaled_dot_product_attention<spec>(q, k4, v); },
            {"q's 'd' is 6 and k's 4"});
    // k's 5 keys, v's 7.
    auto v7 = t.constant(v_t(m, {2, 3, 7, 2}));
    refused([&] { return ad::scaled_dot_product_attention<spec>(q, k, v7); },
            {"k's 's' is 5 and v's 7"});
    for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
      refused([&] { return ad::scaled_dot_product_attention<spec>(q, k, v, {.scale = bad}); },
              {"options.scale", "is not finite"});
    }
    // A finite scale is taken as given: 1 and the default 1/sqrt(6) differ.
    const auto q_val =
        q_t::from_global(m, {2, 3, 4, 6}, global_values(std::array<std::size_t, 4>{2, 3, 4, 6}, 3));
    const auto k_val =
        k_t::from_global(m, {2, 3, 5, 6}, global_values(std::array<std::size_t, 4>{2, 3, 5, 6}, 5));
    const auto v_val =
        v_t::from_global(m, {2, 3, 5, 2}, global_values(std::array<std::size_t, 4>{2, 3, 5, 2}, 9));
    auto a = ad::scaled_dot_product_attention<spec>(t.constant(q_t(q_val)), t.constant(k_t(k_val)),
                                                    t.constant(v_t(v_val)), {.scale = 1.0});
    auto b = ad::scaled_dot_product_attention<spec>(t.constant(q_t(q_val)), t.constant(k_t(k_val)),
                                                    t.constant(v_t(v_val)));
    CHECK(relative_error(global_of(a.value()), global_of(b.value())) > 1e-6);
  });
}

}  // namespace
