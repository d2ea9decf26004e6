// zest/optim/schedule.hpp — learning-rate schedules.
//
//   const zest::warmup_cosine lr{.peak_lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 2000,
//                                .total_steps = 600000};
//   lr(0) == 6e-4 / 2000;  lr(1999) == 6e-4;  lr(2000) == 6e-4;  lr(600000) == 6e-5
//
// warmup_cosine, for a 0-based step s:
//   s <  warmup           peak * (s + 1) / warmup          (linear; the last warmup step is peak)
//   warmup <= s < total   min + (peak - min) * (1 + cos(pi * (s - warmup) / (total - warmup))) / 2
//   s >= total            min
// The arguments are checked on every call (a few comparisons): zest::shape_error names the
// field at fault.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "zest/core/error.hpp"

namespace zest {

struct warmup_cosine {
  double peak_lr = 0;
  double min_lr = 0;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;

  // Throws zest::shape_error when the fields do not describe a schedule.
  void validate() const {
    const auto fail = [&](const auto&... why) {
      throw shape_error(detail::message("zest: warmup_cosine{peak_lr ", peak_lr, ", min_lr ",
                                        min_lr, ", warmup_steps ", warmup_steps, ", total_steps ",
                                        total_steps, "}: ", why...));
    };
    if (!(std::isfinite(peak_lr) && peak_lr >= 0)) fail("peak_lr must be finite and >= 0");
    if (!(std::isfinite(min_lr) && min_lr >= 0)) fail("min_lr must be finite and >= 0");
    if (min_lr > peak_lr) fail("min_lr must not exceed peak_lr");
    if (warmup_steps < 0) fail("warmup_steps must be >= 0");
    if (total_steps < warmup_steps) fail("total_steps must be >= warmup_steps");
  }

  // The learning rate of 0-based step `step`.
  double operator()(std::int64_t step) const {
    validate();
    if (step < 0) {
      throw shape_error(
          detail::message("zest: warmup_cosine: step ", step, " is negative; steps count from 0"));
    }
    if (step < warmup_steps) {
      return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    }
    if (step >= total_steps) return min_lr;
    const double progress =
        static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
};

}  // namespace zest
