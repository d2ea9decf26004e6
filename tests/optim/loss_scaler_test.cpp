// zest::dynamic_loss_scaler on one process: skip and back off on inf, grow after the
// interval, the minimum scale, save/restore, argument checks; has_inf_or_nan per type, on host
// memory and through a backend's sum (the emulated backend: the body a GPU runs).
#include "zest/optim/loss_scaler.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "zest/backend/emulated/emulated_backend.hpp"

using zest::dynamic_loss_scaler;

TEST_CASE("dynamic_loss_scaler: defaults") {
  const dynamic_loss_scaler s;
  CHECK(s.scale() == 65536.0F);
  CHECK(s.growth_factor() == 2.0F);
  CHECK(s.backoff_factor() == 0.5F);
  CHECK(s.growth_interval() == 2000);
  CHECK(s.min_scale() == 1.0F);
  CHECK(s.good_steps_in_row() == 0);
  CHECK(s.skipped_steps() == 0);
}

TEST_CASE(
    "dynamic_loss_scaler: an inf skips the step and halves the scale; growth after the "
    "interval; the minimum holds") {
  dynamic_loss_scaler s(8.0F, 2.0F, 0.5F, 3, 1.0F);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 8.0F);
  CHECK(s.good_steps_in_row() == 2);
  CHECK(s.update(false));  // the third good step in a row: grow
  CHECK(s.scale() == 16.0F);
  CHECK(s.good_steps_in_row() == 0);

  CHECK(s.update(false));
  CHECK_FALSE(s.update(true));  // inf: skip, halve, restart the run
  CHECK(s.scale() == 8.0F);
  CHECK(s.good_steps_in_row() == 0);
  CHECK(s.skipped_steps() == 1);

  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 8.0F);  // the run was reset by the inf: two good steps are not three
  for (int i = 0; i < 5; ++i) CHECK_FALSE(s.update(true));  // 4, 2, 1, 1, 1
  CHECK(s.scale() == 1.0F);
  CHECK(s.skipped_steps() == 6);
  for (int i = 0; i < 3; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 2.0F);
}

TEST_CASE("dynamic_loss_scaler: a minimum that is not a power of two, and no growth to inf") {
  dynamic_loss_scaler s(10.0F, 2.0F, 0.25F, 1, 3.0F);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 3.0F);  // 2.5 would be below the minimum
  CHECK(s.update(false));
  CHECK(s.scale() == 6.0F);  // interval 1: every good step grows

  dynamic_loss_scaler huge(std::numeric_limits<float>::max() / 1.5F, 2.0F, 0.5F, 1, 1.0F);
  const float before = huge.scale();
  CHECK(huge.update(false));
  CHECK(huge.scale() == before);
}

TEST_CASE("dynamic_loss_scaler: state saves and restores") {
  dynamic_loss_scaler a(1024.0F, 2.0F, 0.5F, 4, 1.0F);
  a.update(false);
  a.update(true);
  a.update(false);
  a.update(false);
  const zest::loss_scaler_state saved = a.state();
  CHECK(saved == zest::loss_scaler_state{512.0F, 2, 1});

  dynamic_loss_scaler b(1024.0F, 2.0F, 0.5F, 4, 1.0F);
  b.restore(saved);
  CHECK(b.state() == saved);
  // Both continue identically: two more good steps grow both.
  CHECK(a.update(false) == b.update(false));
  CHECK(a.update(false) == b.update(false));
  CHECK(a.scale() == 1024.0F);
  CHECK(b.state() == a.state());

  CHECK_THROWS_AS(b.restore({0.5F, 0, 0}), zest::shape_error);  // below min_scale
  CHECK_THROWS_AS(b.restore({8.0F, 4, 0}), zest::shape_error);  // a full interval is a growth
  CHECK_THROWS_AS(b.restore({8.0F, 0, -1}), zest::shape_error);
}

TEST_CASE("dynamic_loss_scaler: invalid arguments") {
  CHECK_THROWS_AS(dynamic_loss_scaler(0.0F), zest::shape_error);
  CHECK_THROWS_AS(dynamic_loss_scaler(0.5F), zest::shape_error);  // below min_scale 1
  CHECK_THROWS_AS(dynamic_loss_scaler(8.0F, 0.5F), zest::shape_error);
  CHECK_THROWS_AS(dynamic_loss_scaler(8.0F, 2.0F, 0.0F), zest::shape_error);
  CHECK_THROWS_AS(dynamic_loss_scaler(8.0F, 2.0F, 1.5F), zest::shape_error);
  CHECK_THROWS_WITH_AS(dynamic_loss_scaler(8.0F, 2.0F, 0.5F, 0),
                       doctest::Contains("growth_interval must be >= 1"), zest::shape_error);
  CHECK_THROWS_AS(dynamic_loss_scaler(8.0F, 2.0F, 0.5F, 10, 0.0F), zest::shape_error);
  CHECK_NOTHROW(dynamic_loss_scaler(1.0F, 1.0F, 1.0F, 1, 1.0F));
}

TEST_CASE_TEMPLATE("has_inf_or_nan", T, float, double, zest::bfloat16, zest::float16) {
  const auto make = [](float x) { return T(x); };
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{1000}}) {
    std::vector<T> values(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = make(static_cast<float>(i % 13) - 6.0F);
    CHECK_FALSE(zest::has_inf_or_nan(std::span<const T>(values)));
    CHECK_FALSE(zest::has_inf_or_nan<zest::emulated_backend>(std::span<const T>(values)));
    if (n == 0) continue;
    for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      for (const float bad :
           {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN()}) {
        auto copy = values;
        copy[at] = make(bad);
        INFO("n " << n << ", at " << at << ", value " << bad);
        CHECK(zest::has_inf_or_nan(std::span<const T>(copy)));
        CHECK(zest::has_inf_or_nan(std::span<T>(copy)));
        CHECK(zest::has_inf_or_nan<zest::emulated_backend>(std::span<const T>(copy)));
      }
    }
  }
}

TEST_CASE("has_inf_or_nan: float16's largest finite value is finite, its overflow is not") {
  std::vector<zest::float16> h(10, zest::float16(65504.0F));
  CHECK_FALSE(zest::has_inf_or_nan(std::span<const zest::float16>(h)));
  h[3] = zest::float16(70000.0F);  // overflows to inf
  CHECK(zest::has_inf_or_nan(std::span<const zest::float16>(h)));
  std::vector<float> tiny(10, std::numeric_limits<float>::denorm_min());
  tiny[2] = std::numeric_limits<float>::max();
  CHECK_FALSE(zest::has_inf_or_nan(std::span<const float>(tiny)));
}
