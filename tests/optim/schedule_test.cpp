// zest::warmup_cosine at hand-computed points, and its argument checks.
#include "zest/optim/schedule.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

TEST_CASE("warmup_cosine: warmup, cosine, end") {
  const zest::warmup_cosine lr{
      .peak_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110};
  // Warmup: peak * (step + 1) / 10.
  CHECK(lr(0) == doctest::Approx(1e-4).epsilon(1e-12));
  CHECK(lr(4) == doctest::Approx(5e-4).epsilon(1e-12));
  CHECK(lr(9) == doctest::Approx(1e-3).epsilon(1e-12));
  // Cosine over [10, 110): starts at peak, halfway (step 60) at (peak + min) / 2.
  CHECK(lr(10) == doctest::Approx(1e-3).epsilon(1e-12));
  CHECK(lr(60) == doctest::Approx(5.5e-4).epsilon(1e-12));
  // A quarter of the way: min + (peak - min) * (1 + cos(pi / 4)) / 2.
  CHECK(lr(35) == doctest::Approx(1e-4 + 9e-4 * (1 + std::sqrt(0.5)) / 2).epsilon(1e-12));
  // The last cosine step, 99 of 100: just above min.
  CHECK(lr(109) ==
        doctest::Approx(1e-4 + 9e-4 * (1 + std::cos(std::numbers::pi * 0.99)) / 2).epsilon(1e-12));
  CHECK(lr(109) > 1e-4);
  // At and after the end: min.
  CHECK(lr(110) == 1e-4);
  CHECK(lr(1000000) == 1e-4);
  // Monotone after warmup.
  for (int s = 10; s < 120; ++s) CHECK(lr(s + 1) <= lr(s));
}

TEST_CASE("warmup_cosine: edge cases") {
  const zest::warmup_cosine no_warmup{
      .peak_lr = 2.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4};
  CHECK(no_warmup(0) == 2.0);
  CHECK(no_warmup(2) == doctest::Approx(1.0).epsilon(1e-15));
  CHECK(no_warmup(4) == 0.0);
  const zest::warmup_cosine warmup_only{
      .peak_lr = 1.0, .min_lr = 0.5, .warmup_steps = 4, .total_steps = 4};
  CHECK(warmup_only(0) == 0.25);
  CHECK(warmup_only(3) == 1.0);
  CHECK(warmup_only(4) == 0.5);
  const zest::warmup_cosine constant{
      .peak_lr = 3e-4, .min_lr = 3e-4, .warmup_steps = 0, .total_steps = 100};
  CHECK(constant(50) == doctest::Approx(3e-4).epsilon(1e-15));
}

TEST_CASE("warmup_cosine: invalid arguments are zest::shape_error") {
  using zest::warmup_cosine;
  const auto at0 = [](const warmup_cosine& s) { return s(0); };
  CHECK_THROWS_WITH_AS(at0({.peak_lr = 1e-4, .min_lr = 1e-3, .warmup_steps = 1, .total_steps = 2}),
                       doctest::Contains("min_lr must not exceed peak_lr"), zest::shape_error);
  CHECK_THROWS_WITH_AS(at0({.peak_lr = 1, .min_lr = 0, .warmup_steps = 10, .total_steps = 5}),
                       doctest::Contains("total_steps must be >= warmup_steps"), zest::shape_error);
  CHECK_THROWS_AS(at0({.peak_lr = 1, .min_lr = 0, .warmup_steps = -1, .total_steps = 5}),
                  zest::shape_error);
  CHECK_THROWS_AS(at0({.peak_lr = -1, .min_lr = -2, .warmup_steps = 0, .total_steps = 5}),
                  zest::shape_error);
  CHECK_THROWS_AS(at0({.peak_lr = NAN, .min_lr = 0, .warmup_steps = 0, .total_steps = 5}),
                  zest::shape_error);
  const warmup_cosine ok{.peak_lr = 1, .min_lr = 0, .warmup_steps = 1, .total_steps = 5};
  CHECK_THROWS_WITH_AS(ok(-1), doctest::Contains("step -1"), zest::shape_error);
  CHECK_NOTHROW(ok.validate());
}
