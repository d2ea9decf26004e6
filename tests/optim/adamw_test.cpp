// zest::adamw_update against a double-precision reference written from the formula, over
// several steps: with and without decay, with grad_scale, with float, bfloat16 and float16
// gradients, sizes that fill whole blocks and leave tails; plus one step worked by hand and
// the size, step and overlap errors.
#include "zest/optim/adamw.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using zest::adamw_config;
using zest::bfloat16;
using zest::float16;

// The formula in double, one element at a time.
struct reference_adamw {
  std::vector<double> p, m, v;
  void step(const std::vector<double>& grad, std::int64_t t, double lr, const adamw_config& c,
            double grad_scale, bool decay) {
    const double b1 = c.beta1, b2 = c.beta2;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double g = grad[i] * grad_scale;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, static_cast<double>(t)));
      const double vhat = v[i] / (1 - std::pow(b2, static_cast<double>(t)));
      p[i] -= lr * (mhat / (std::sqrt(vhat) + c.eps) + (decay ? c.weight_decay * p[i] : 0.0));
    }
  }
};

double initial_param(std::size_t i) { return std::sin(0.37 * static_cast<double>(i) + 0.2); }
// Gradients change from step to step and include values near zero and of both signs.
double gradient(std::size_t i, std::int64_t t) {
  return 0.8 * std::cos(0.91 * static_cast<double>(i) + 1.7 * static_cast<double>(t)) +
         (i % 7 == 0 ? 0.0 : 0.01);
}

template <class G>
void run_against_reference(std::size_t n, const adamw_config& c, float grad_scale, bool decay) {
  std::vector<float> p(n), m(n, 0.0F), v(n, 0.0F);
  reference_adamw ref{std::vector<double>(n), std::vector<double>(n, 0.0),
                      std::vector<double>(n, 0.0)};
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(initial_param(i));
    ref.p[i] = p[i];
  }
  const float lr_of_step[] = {1e-2F, 2e-2F, 2e-2F, 1e-2F, 5e-3F, 5e-3F};
  for (std::int64_t t = 1; t <= 6; ++t) {
    std::vector<G> grad(n);
    std::vector<double> grad_seen(n);
    for (std::size_t i = 0; i < n; ++i) {
      // The loss-scaled gradient: what backward produces before grad_scale undoes it.
      grad[i] = G(static_cast<float>(gradient(i, t) / grad_scale));
      grad_seen[i] = static_cast<double>(static_cast<float>(grad[i]));
    }
    const float lr = lr_of_step[t - 1];
    zest::adamw_update(std::span<float>(p), std::span<const G>(grad), std::span<float>(m),
                       std::span<float>(v), t, lr, c, grad_scale, decay);
    ref.step(grad_seen, t, lr, c, grad_scale, decay);
  }
  double worst_p = 0, worst_m = 0, worst_v = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst_p = std::max(worst_p, std::abs(p[i] - ref.p[i]));
    worst_m = std::max(worst_m, std::abs(m[i] - ref.m[i]));  // crosses 0: absolute
    worst_v = std::max(worst_v, std::abs(v[i] - ref.v[i]) / (std::abs(ref.v[i]) + 1e-9));
  }
  INFO("n " << n << ", decay " << decay << ", grad_scale " << grad_scale);
  // Parameters are O(1) and move by up to ~0.07 in total; float rounding leaves ~3e-7.
  CHECK(worst_p < 1e-6);
  CHECK(worst_m < 1e-7);  // m is at most ~0.8 and crosses 0
  CHECK(worst_v < 2e-6);
  // And the parameters did move.
  CHECK(std::abs(p[1] - static_cast<float>(initial_param(1))) > 1e-3);
}

}  // namespace

TEST_CASE("adamw: one step by hand") {
  // Step 1: mhat = g, vhat = g^2, so the update is lr * (g / (|g| + eps) + wd * p).
  adamw_config c;
  std::vector<float> p{1.0F, -2.0F}, m{0, 0}, v{0, 0};
  const std::vector<float> g{0.5F, -0.25F};
  zest::adamw_update(p, g, m, v, 1, 0.1F, c);
  CHECK(p[0] == doctest::Approx(1.0 - 0.1 * (1.0 + 0.1 * 1.0)).epsilon(1e-6));     // 0.89
  CHECK(p[1] == doctest::Approx(-2.0 - 0.1 * (-1.0 + 0.1 * -2.0)).epsilon(1e-6));  // -1.88
  CHECK(m[0] == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(v[0] == doctest::Approx(0.05 * 0.25).epsilon(1e-6));
  // Step 2 with g = 0 and no decay: m = 0.045, v = 0.011875, mhat = 0.045 / 0.19,
  // vhat = 0.011875 / 0.0975, p -= 0.1 * mhat / sqrt(vhat).
  const std::vector<float> zero{0.0F, 0.0F};
  const double before = p[0];
  zest::adamw_update(p, zero, m, v, 2, 0.1F, c, 1.0F, false);
  const double mhat = 0.045 / (1 - 0.9 * 0.9), vhat = 0.011875 / (1 - 0.95 * 0.95);
  CHECK(p[0] == doctest::Approx(before - 0.1 * mhat / (std::sqrt(vhat) + 1e-8)).epsilon(1e-6));
}

TEST_CASE("adamw: float gradients against the double reference") {
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{16}, std::size_t{37}, std::size_t{1000}}) {
    run_against_reference<float>(n, adamw_config{}, 1.0F, true);
    run_against_reference<float>(n, adamw_config{}, 1.0F, false);
    run_against_reference<float>(n, zest::adam_config(), 1.0F, true);
    run_against_reference<float>(
        n,
        adamw_config{
            .lr = 1e-3F, .beta1 = 0.8F, .beta2 = 0.999F, .eps = 1e-6F, .weight_decay = 0.01F},
        0.25F, true);
  }
}

TEST_CASE("adamw: bfloat16 and float16 gradients, with grad_scale") {
  for (const std::size_t n : {std::size_t{5}, std::size_t{48}, std::size_t{333}}) {
    run_against_reference<bfloat16>(n, adamw_config{}, 1.0F, true);
    run_against_reference<bfloat16>(n, adamw_config{}, 0.5F, false);
    // float16 with a loss scale of 1024: gradients up to 0.8 * 1024 fit float16 easily.
    run_against_reference<float16>(n, adamw_config{}, 1.0F / 1024.0F, true);
    run_against_reference<float16>(n, zest::adam_config(), 1.0F, true);
  }
}

TEST_CASE("adamw: plain Adam is weight_decay 0, the same as decay = false") {
  std::vector<float> p1(40), p2(40), m1(40, 0), m2(40, 0), v1(40, 0), v2(40, 0), g(40);
  for (std::size_t i = 0; i < 40; ++i) {
    p1[i] = p2[i] = static_cast<float>(initial_param(i));
    g[i] = static_cast<float>(gradient(i, 1));
  }
  for (std::int64_t t = 1; t <= 3; ++t) {
    zest::adamw_update(p1, g, m1, v1, t, 1e-2F, zest::adam_config());
    zest::adamw_update(p2, g, m2, v2, t, 1e-2F, adamw_config{}, 1.0F, false);
  }
  CHECK(p1 == p2);
  static_assert(zest::adam_config().weight_decay == 0.0F);
  static_assert(zest::adam_config().beta2 == 0.95F);
}

TEST_CASE("adamw: size mismatch, bad step and overlapping arrays are errors") {
  std::vector<float> p(10, 1.0F), g(10, 0.5F), m(10, 0.0F), v(9, 0.0F);
  try {
    zest::adamw_update(p, g, m, v, 1, 1e-3F, adamw_config{});
    FAIL("expected zest::shape_error");
  } catch (const zest::shape_error& e) {
    const std::string what = e.what();
    CHECK(what.find("adamw_update") != std::string::npos);
    CHECK(what.find("param 10") != std::string::npos);
    CHECK(what.find("v 9") != std::string::npos);
  }
  v.resize(10, 0.0F);
  CHECK_THROWS_AS(zest::adamw_update(p, g, m, v, 0, 1e-3F, adamw_config{}), zest::shape_error);
  CHECK_THROWS_AS(zest::adamw_update(p, g, m, m, 1, 1e-3F, adamw_config{}), zest::shape_error);
  std::vector<float> both(20, 0.0F);
  CHECK_THROWS_AS(
      zest::adamw_update(p, g, std::span<float>(both).first(10),
                         std::span<float>(both).subspan(5, 10), 1, 1e-3F, adamw_config{}),
      zest::shape_error);
  const std::vector<bfloat16> short_grad(3);
  CHECK_THROWS_WITH_AS(zest::adamw_update(p, short_grad, m, v, 1, 1e-3F, adamw_config{}),
                       doctest::Contains("grad 3"), zest::shape_error);
  // Adjacent, non-overlapping parts of one buffer are fine; empty spans are a no-op.
  CHECK_NOTHROW(zest::adamw_update(p, g, std::span<float>(both).first(10),
                                   std::span<float>(both).last(10), 1, 1e-3F, adamw_config{}));
  CHECK_NOTHROW(zest::adamw_update({}, std::span<const float>{}, {}, {}, 1, 1e-3F, {}));
}
