// Tests of zest::host::contract, gemm_strided_batched, permute and sum_dims against an
// independent reference: nested loops over every value of every label.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zest/backend/host/contract.hpp"
#include "zest/backend/host/gemm.hpp"
#include "zest/backend/host/permute.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/error.hpp"

namespace {

// Not `using zest::bfloat16`: OpenBLAS's cblas.h declares a global ::bfloat16 too.
using bf16 = zest::bfloat16;
using extents_t = std::vector<std::size_t>;

struct reference_result {
  std::vector<double> value;      // the einsum
  std::vector<double> magnitude;  // the same sum of |products|, to scale tolerances
};

// Splits "ab,bc->ac" into {"ab", "bc"} and "ac".
std::pair<std::vector<std::string>, std::string> parse(std::string_view spec) {
  const auto arrow = spec.find("->");
  std::vector<std::string> inputs;
  std::string_view lhs = spec.substr(0, arrow);
  for (;;) {
    const auto comma = lhs.find(',');
    inputs.emplace_back(lhs.substr(0, comma));
    if (comma == std::string_view::npos) break;
    lhs.remove_prefix(comma + 1);
  }
  return {inputs, std::string(spec.substr(arrow + 2))};
}

std::size_t count_of(const extents_t& e) {
  std::size_t n = 1;
  for (auto x : e) n *= x;
  return n;
}

std::size_t offset_of(const std::string& labels, const extents_t& extents,
                      const std::map<char, std::size_t>& index) {
  std::size_t off = 0;
  for (std::size_t d = 0; d < labels.size(); ++d) off = off * extents[d] + index.at(labels[d]);
  return off;
}

// Iterates over every assignment of values to all labels and accumulates the product.
reference_result reference(const std::vector<std::string>& inputs,
                           const std::vector<extents_t>& in_extents,
                           const std::vector<std::vector<double>>& data, const std::string& out,
                           const extents_t& out_extents) {
  std::map<char, std::size_t> extent;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    for (std::size_t d = 0; d < inputs[i].size(); ++d) extent[inputs[i][d]] = in_extents[i][d];
  }
  reference_result r;
  r.value.assign(count_of(out_extents), 0.0);
  r.magnitude.assign(count_of(out_extents), 0.0);
  std::vector<char> labels;
  for (auto& [l, e] : extent) {
    if (e == 0) return r;
    labels.push_back(l);
  }
  std::map<char, std::size_t> index;
  for (char l : labels) index[l] = 0;
  for (;;) {
    double p = 1.0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      p *= data[i][offset_of(inputs[i], in_extents[i], index)];
    }
    const std::size_t o = offset_of(out, out_extents, index);
    r.value[o] += p;
    r.magnitude[o] += std::abs(p);
    std::size_t d = labels.size();
    for (;;) {
      if (d == 0) return r;
      --d;
      if (++index[labels[d]] < extent[labels[d]]) break;
      index[labels[d]] = 0;
    }
  }
}

template <class T>
double tolerance_scale() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, float>) return 2e-5;
  else return 2e-5;  // bfloat16 computes in float; its final rounding is checked separately
}

// Runs one spec with the given extents per label; checks contract against the reference,
// both overwriting and accumulating.
// Elements compared so far, to make sure the checks actually ran.
std::size_t compared = 0;

template <class T>
void check_spec(std::string_view spec, const std::map<char, std::size_t>& extent,
                std::mt19937& rng) {
  const auto [inputs, out] = parse(spec);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<extents_t> in_extents;
  std::vector<std::vector<T>> stored;
  std::vector<std::vector<double>> exact;  // the stored values, widened
  for (const auto& in : inputs) {
    extents_t e;
    for (char l : in) e.push_back(extent.at(l));
    std::vector<T> s(count_of(e));
    std::vector<double> x(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      s[i] = T(static_cast<float>(dist(rng)));
      x[i] = static_cast<double>(static_cast<float>(s[i]));
    }
    in_extents.push_back(e);
    stored.push_back(std::move(s));
    exact.push_back(std::move(x));
  }
  extents_t out_extents;
  for (char l : out) out_extents.push_back(extent.at(l));
  const auto ref = reference(inputs, in_extents, exact, out, out_extents);

  std::vector<zest::host::operand_view<T>> views;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    views.push_back({stored[i].data(), inputs[i], in_extents[i]});
  }
  const std::size_t n = count_of(out_extents);
  for (const bool accumulate : {false, true}) {
    std::vector<T> result(n);
    std::vector<double> initial(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      // Garbage (NaN) must be overwritten when not accumulating.
      result[i] = accumulate ? T(static_cast<float>(dist(rng))) : T(std::nanf(""));
      if (accumulate) initial[i] = static_cast<double>(static_cast<float>(result[i]));
    }
    zest::host::contract<T>(views, out, result.data(), out_extents, accumulate);
    compared += n;
    for (std::size_t i = 0; i < n; ++i) {
      const double want = initial[i] + ref.value[i];
      const double got = static_cast<double>(static_cast<float>(result[i]));
      double tol = tolerance_scale<T>() * (ref.magnitude[i] + std::abs(initial[i]) + 1e-30);
      if constexpr (std::is_same_v<T, bf16>) tol += std::abs(want) * (1.0 / 128);
      if (!(std::abs(got - want) <= tol)) {
        CAPTURE(spec);
        CAPTURE(accumulate);
        CAPTURE(i);
        std::string shape;
        for (auto& [l, e] : extent) shape += std::string(1, l) + "=" + std::to_string(e) + " ";
        CAPTURE(shape);
        CHECK(got == doctest::Approx(want));
        return;
      }
    }
  }
}

// Random extents for the labels of spec: mostly 1..max_extent, sometimes 1, rarely 0.
std::map<char, std::size_t> random_extents(std::string_view spec, std::mt19937& rng,
                                           std::size_t max_extent, bool allow_zero) {
  std::map<char, std::size_t> extent;
  std::uniform_int_distribution<std::size_t> pick(1, max_extent);
  std::uniform_int_distribution<int> kind(0, 9);
  for (char l : spec) {
    if (l == ',' || l == '-' || l == '>' || extent.count(l) != 0) continue;
    const int k = kind(rng);
    extent[l] = (allow_zero && k == 0) ? 0 : k <= 2 ? 1 : pick(rng);
  }
  return extent;
}

// Specs: GEMMs in every transpose, batches in every position, outer products, reductions,
// dims summed out of one operand, scalars and permutes.
constexpr std::string_view specs[] = {
    "ik,kj->ij",
    "ki,kj->ij",
    "ik,jk->ij",
    "ki,jk->ij",
    "ik,kj->ji",
    "kj,ik->ij",
    "bik,bkj->bij",
    "bik,bkj->ibj",
    "bik,bkj->ijb",
    "ibk,kbj->bij",
    "bsm,hm->bhs",
    "bsm,hm->bsh",
    "bsm,mh->hbs",
    "i,j->ij",
    "i,j->ji",
    "bi,bj->bij",
    "bi,bj->ijb",
    "i,i->",
    "bi,bi->b",
    "ij,ij->ij",
    "ij,ji->ij",
    "abc,cd->abd",
    "abcd,cdef->abef",
    "abcd,dcef->aebf",
    "ijk,jkl->il",
    "ijk,kjl->li",
    "ijk,k->ij",
    "ijk,j->ki",
    "ij,jk->k",
    "ij,kl->",
    "iab,jab->ij",
    "ai,aj->",
    ",ij->ij",
    "ij,->ji",
    ",->",
    "bhqd,bhkd->bhqk",
    "bhqk,bhkd->bqhd",
    "gsec,gsm->egcm",
    "egcm,emh->egch",
    "gsec,egcm->gsm",
    "ij->ji",
    "ijk->kij",
    "ijk->i",
    "ijk->",
    "ijk->kj",
    "->",
    "i->i",
    "abcdef->fedcba",
};

// Extents near the largest that keep the reference's loop over all labels under `budget`
// iterations: big GEMMs for 3-label specs, smaller ones for many labels.
std::map<char, std::size_t> budget_extents(std::string_view spec, std::mt19937& rng,
                                           double budget) {
  std::map<char, std::size_t> extent;
  for (char l : spec) {
    if (l != ',' && l != '-' && l != '>') extent[l] = 0;
  }
  const double top = std::pow(budget, 1.0 / double(std::max<std::size_t>(extent.size(), 1)));
  std::uniform_real_distribution<double> scale(0.6, 1.0);
  for (auto& [l, e] : extent) e = std::max<std::size_t>(2, std::size_t(top * scale(rng)));
  return extent;
}

template <class T>
void check_all_specs(std::uint32_t seed, std::size_t max_extent, int rounds, bool allow_zero) {
  std::mt19937 rng(seed);
  const std::size_t before = compared;
  for (const auto spec : specs) {
    for (int r = 0; r < rounds; ++r) {
      check_spec<T>(spec, random_extents(spec, rng, max_extent, allow_zero), rng);
    }
  }
  MESSAGE("compared ", compared - before, " elements");
  CHECK(compared - before > std::size(specs));
}

}  // namespace

TEST_CASE("contract matches the reference on small random shapes (incl. 0 and 1 extents)") {
  check_all_specs<double>(1, 4, 6, true);
  check_all_specs<float>(2, 4, 6, true);
  check_all_specs<bf16>(3, 4, 4, true);
}

TEST_CASE("contract matches the reference on shapes large enough for BLAS") {
  check_all_specs<double>(4, 24, 1, false);
  check_all_specs<float>(5, 24, 1, false);
  check_all_specs<bf16>(6, 20, 1, false);
}

TEST_CASE("contract matches the reference on big shapes") {
  std::mt19937 rng(8);
  const std::size_t before = compared;
  for (const auto spec : specs) {
    check_spec<float>(spec, budget_extents(spec, rng, 3e5), rng);
    check_spec<double>(spec, budget_extents(spec, rng, 1e5), rng);
    check_spec<bf16>(spec, budget_extents(spec, rng, 5e4), rng);
  }
  CHECK(compared - before > 10000);
}

TEST_CASE("contract matches the reference on random specs") {
  const std::size_t before = compared;
  // Random specs over a small alphabet: every mix of roles, orders and transposes.
  std::mt19937 rng(7);
  const std::string alphabet = "abcdef";
  std::uniform_int_distribution<int> coin(0, 2);
  for (int t = 0; t < 300; ++t) {
    std::string x, y, z;
    for (char l : alphabet) {
      const int in_x = coin(rng), in_y = coin(rng), in_z = coin(rng);
      if (in_x != 0) x += l;
      if (in_y != 0) y += l;
      if (in_z != 0 && (in_x != 0 || in_y != 0)) z += l;
    }
    std::shuffle(x.begin(), x.end(), rng);
    std::shuffle(y.begin(), y.end(), rng);
    std::shuffle(z.begin(), z.end(), rng);
    const std::string spec = x + "," + y + "->" + z;
    auto extent = random_extents(spec, rng, 5, t % 10 == 0);
    if (t % 3 == 0) check_spec<double>(spec, extent, rng);
    else check_spec<float>(spec, extent, rng);
  }
  CHECK(compared - before > 3000);
}

TEST_CASE("contract accepts a braced operand list") {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // 2 x 3
  const std::vector<float> b = {1, 0, 0, 1, 1, 1};  // 3 x 2
  const std::size_t ae[] = {2, 3}, be[] = {3, 2}, ce[] = {2, 2};
  float c[4] = {};
  zest::host::contract({{a.data(), "ik", ae}, {b.data(), "kj", be}}, "ij", c, ce);
  CHECK(c[0] == 4);
  CHECK(c[1] == 5);
  CHECK(c[2] == 10);
  CHECK(c[3] == 11);
}

TEST_CASE("release_workspace frees scratch; contract still works after it") {
  std::mt19937 rng(9);
  check_spec<float>("abcd,dcef->aebf", {{'a', 3}, {'b', 4}, {'c', 5}, {'d', 6}, {'e', 7}, {'f', 2}},
                    rng);
  zest::host::release_workspace();
  CHECK(zest::host::detail::thread_scratch<float>().size[zest::host::detail::permuted_x] == 0);
  check_spec<float>("abcd,dcef->aebf", {{'a', 3}, {'b', 4}, {'c', 5}, {'d', 6}, {'e', 7}, {'f', 2}},
                    rng);
}

TEST_CASE("contract with empty outputs and empty sums") {
  const std::vector<float> a(6, 1.0F);
  const std::size_t ae[] = {2, 0}, be[] = {0, 3}, ce[] = {2, 3};
  float c[6] = {7, 7, 7, 7, 7, 7};
  zest::host::contract<float>({{a.data(), "ik", ae}, {a.data(), "kj", be}}, "ij", c, ce, true);
  CHECK(c[0] == 7);  // accumulating an empty sum leaves out as it was
  zest::host::contract<float>({{a.data(), "ik", ae}, {a.data(), "kj", be}}, "ij", c, ce);
  for (float v : c) CHECK(v == 0);
  const std::size_t e0[] = {0, 3}, o0[] = {0};
  zest::host::contract<float>({{a.data(), "ij", e0}}, "i", c, o0);  // nothing to write
}

TEST_CASE("contract reports bad specs with the dim and the extents") {
  const std::vector<float> a(64, 1.0F);
  float c[64] = {};
  const std::size_t e23[] = {2, 3}, e43[] = {4, 3}, e24[] = {2, 4}, e22[] = {2, 2};
  using zest::host::contract;
  using op = zest::host::operand_view<float>;
  const auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const zest::shape_error& e) {
      return e.what();
    }
    return "no exception";
  };
  std::string m = message_of([&] {
    contract<float>({op{a.data(), "ik", e23}, op{a.data(), "kj", e43}}, "ij", c, e23);
  });
  CHECK(m.find("'k'") != std::string::npos);
  CHECK(m.find("extent 3") != std::string::npos);
  CHECK(m.find("4") != std::string::npos);
  CHECK(m.find("ik,kj->ij") != std::string::npos);

  m = message_of([&] { contract<float>({op{a.data(), "ik", e23}}, "ik", c, e24); });
  CHECK(m.find("'k'") != std::string::npos);
  CHECK(m.find("the output") != std::string::npos);

  m = message_of([&] { contract<float>({op{a.data(), "ii", e22}}, "i", c, e22); });
  CHECK(m.find("repeats") != std::string::npos);

  m = message_of([&] { contract<float>({op{a.data(), "ij", e22}}, "iz", c, e22); });
  CHECK(m.find("'z'") != std::string::npos);

  m = message_of([&] { contract<float>({op{a.data(), "ij", e22}}, "ii", c, e22); });
  CHECK(m.find("repeats") != std::string::npos);

  m = message_of([&] { contract<float>({op{a.data(), "ijk", e22}}, "ij", c, e22); });
  CHECK(m.find("3 labels but 2 extents") != std::string::npos);

  m = message_of([&] {
    contract<float>({op{a.data(), "ij", e22}, op{a.data(), "jk", e22}, op{a.data(), "kl", e22}},
                    "il", c, e22);
  });
  CHECK(m.find("1 or 2 operands") != std::string::npos);

  const std::vector<std::size_t> e13(13, 1);
  m = message_of([&] { contract<float>({op{a.data(), "abcdefghijklm", e13}}, "a", c, e22); });
  CHECK(m.find("max_dims") != std::string::npos);
}

TEST_CASE("the bench contractions need no permute") {
  using zest::host::detail::dense_layout;
  using zest::host::detail::plan_direct;
  const extents_t bsm = {8, 64, 32}, hm = {16, 32}, bhs = {8, 16, 64};
  const auto plan =
      plan_direct(dense_layout("bsm", bsm), dense_layout("hm", hm), dense_layout("bhs", bhs));
  REQUIRE(plan.valid);
  CHECK(plan.m * plan.n * plan.k == 16 * 64 * 32);  // one (h x m)(m x s) GEMM per b
  CHECK(plan.loops.count() == 8);
  const extents_t bik = {4, 8, 9}, bkj = {4, 9, 10}, bij = {4, 8, 10};
  const auto batched =
      plan_direct(dense_layout("bik", bik), dense_layout("bkj", bkj), dense_layout("bij", bij));
  REQUIRE(batched.valid);
  CHECK(batched.loops.count() == 4);
  CHECK(batched.m * batched.n * batched.k == 8 * 9 * 10);
}

TEST_CASE("gemm_strided_batched: transposes, shared operands, beta, bfloat16") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1, 1);
  // Tiny (loops), square (GEMM), one row or column (GEMV), a dot product.
  const std::array<std::size_t, 3> shapes[] = {
      {3, 4, 5}, {40, 41, 42}, {1, 300, 50}, {300, 1, 50}, {1, 1, 5000}};
  for (const auto& [m, n, k] : shapes) {
    const std::size_t batch = 3;
    for (int flags = 0; flags < 16; ++flags) {
      const bool ta = (flags & 1) != 0, tb = (flags & 2) != 0, share_a = (flags & 4) != 0;
      const bool with_beta = (flags & 8) != 0;
      // Leading dimensions larger than the rows: padded matrices.
      const std::size_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
      const std::size_t sa = share_a ? 0 : (ta ? k : m) * lda, sb = (tb ? n : k) * ldb;
      const std::size_t sc = m * ldc;
      std::vector<double> a(std::max<std::size_t>(sa, 1) * batch + (ta ? k : m) * lda);
      std::vector<double> b(sb * batch), c(sc * batch);
      for (auto& v : a) v = dist(rng);
      for (auto& v : b) v = dist(rng);
      for (auto& v : c) v = dist(rng);
      std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(c.begin(), c.end());
      std::vector<bf16> ah(a.size()), bh(b.size()), ch(c.size());
      for (std::size_t i = 0; i < a.size(); ++i) ah[i] = bf16(af[i]);
      for (std::size_t i = 0; i < b.size(); ++i) bh[i] = bf16(bf[i]);
      for (std::size_t i = 0; i < c.size(); ++i) ch[i] = bf16(cf[i]);
      const double alpha = 0.5, beta = with_beta ? 2.0 : 0.0;
      std::vector<double> want = c;
      for (std::size_t p = 0; p < batch; ++p) {
        for (std::size_t i = 0; i < m; ++i) {
          for (std::size_t j = 0; j < n; ++j) {
            double s = 0;
            for (std::size_t q = 0; q < k; ++q) {
              const double x = a[p * sa + (ta ? q * lda + i : i * lda + q)];
              const double y = b[p * sb + (tb ? j * ldb + q : q * ldb + j)];
              s += x * y;
            }
            double& w = want[p * sc + i * ldc + j];
            w = alpha * s + beta * w;
          }
        }
      }
      std::vector<double> got = c;
      zest::host::gemm_strided_batched<double>(ta, tb, m, n, k, alpha, a.data(), lda, sa, b.data(),
                                               ldb, sb, beta, got.data(), ldc, sc, batch);
      zest::host::gemm_strided_batched<float>(ta, tb, m, n, k, float(alpha), af.data(), lda, sa,
                                              bf.data(), ldb, sb, float(beta), cf.data(), ldc, sc,
                                              batch);
      zest::host::gemm_strided_batched<bf16>(ta, tb, m, n, k, float(alpha), ah.data(), lda, sa,
                                             bh.data(), ldb, sb, float(beta), ch.data(), ldc, sc,
                                             batch);
#if ZEST_HOST_GEMM_HAS_EIGEN
      std::vector<double> eigen = c;
      for (std::size_t p = 0; p < batch; ++p) {
        zest::host::detail::gemm_eigen<double>(ta, tb, m, n, k, alpha, a.data() + p * sa, lda,
                                               b.data() + p * sb, ldb, beta, eigen.data() + p * sc,
                                               ldc);
      }
#endif
      for (std::size_t p = 0; p < batch; ++p) {
        for (std::size_t i = 0; i < m; ++i) {
          for (std::size_t j = 0; j < n; ++j) {
            const std::size_t o = p * sc + i * ldc + j;
            CHECK(got[o] == doctest::Approx(want[o]).epsilon(1e-12));
            CHECK(cf[o] == doctest::Approx(want[o]).epsilon(1e-4).scale(double(k)));
            CHECK(float(ch[o]) == doctest::Approx(want[o]).epsilon(2e-2).scale(double(k)));
#if ZEST_HOST_GEMM_HAS_EIGEN
            CHECK(eigen[o] == doctest::Approx(want[o]).epsilon(1e-12));
#endif
          }
        }
      }
    }
  }
}

TEST_CASE("permute and sum_dims") {
  // A 5-D permute large enough to take the tiled transpose path.
  const extents_t e = {3, 17, 2, 33, 5};
  std::vector<double> x(count_of(e));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = double(i);
  const std::size_t perms[][5] = {
      {4, 3, 2, 1, 0}, {0, 3, 2, 1, 4}, {1, 0, 2, 3, 4}, {3, 0, 1, 4, 2}};
  for (const auto& perm : perms) {
    std::vector<double> y(x.size(), -1);
    zest::host::permute<double, double>(x.data(), e, perm, y.data());
    std::string in = "abcde", out;
    for (auto p : perm) out += in[p];
    extents_t oe;
    for (auto p : perm) oe.push_back(e[p]);
    const auto ref = reference({in}, {e}, {x}, out, oe);
    CHECK(y == ref.value);
    std::vector<float> yf(x.size(), 1.0F);  // converting and accumulating
    zest::host::permute<double, float>(x.data(), e, perm, yf.data(), true);
    for (std::size_t i = 0; i < yf.size(); ++i) CHECK(yf[i] == float(ref.value[i] + 1));
  }
  const std::size_t bad[] = {0, 0, 1, 2, 3};
  std::vector<double> y(x.size());
  CHECK_THROWS_AS((zest::host::permute<double, double>(x.data(), e, bad, y.data())),
                  zest::shape_error);

  const std::size_t summed[] = {1, 3};
  std::vector<double> s(3 * 2 * 5, -1);
  zest::host::sum_dims<double, double>(x.data(), e, summed, s.data());
  const auto ref = reference({"abcde"}, {e}, {x}, "ace", {3, 2, 5});
  for (std::size_t i = 0; i < s.size(); ++i) CHECK(s[i] == doctest::Approx(ref.value[i]));
}
