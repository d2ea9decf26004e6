// zest/optim/loss_scaler.hpp — dynamic loss scaling for float16 training.
//
//   zest::dynamic_loss_scaler scaler;                      // 65536, x2 every 2000 good steps
//   loss_grad = scaler.scale();                            // backward from loss * scale
//   ... backward, reduce gradients ...
//   const bool bad = zest::any_rank(mesh, zest::has_inf_or_nan(std::span<const float16>(g)));
//   if (scaler.update(bad)) zest::adamw_update(p, g, m, v, ++step, lr, c, 1.0f / scale_used);
//
// float16 tops out at 65504, so small gradients are scaled up to stay clear of its
// subnormals and large ones may overflow. update(found_inf) after every backward pass:
//   - inf/NaN found: the step is skipped (update returns false), the scale is multiplied by
//     backoff_factor (never below min_scale) and the run of good steps starts again;
//   - otherwise the step is applied (true); after growth_interval good steps in a row the
//     scale is multiplied by growth_factor (as long as it stays finite) and the run restarts.
// Every rank must reach the same verdict, or ranks would apply different steps: any_rank
// all-reduces one flag (max) over mesh.world(), apart from the axis communicators' counters.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "zest/backend/backend.hpp"
#include "zest/backend/host/host_backend.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/error.hpp"
#include "zest/core/float16.hpp"

namespace zest {

// What a checkpoint keeps of a dynamic_loss_scaler (its factors are configuration).
struct loss_scaler_state {
  float scale = 65536.0F;
  std::int64_t good_steps = 0;     // good steps in a row since the last change of scale
  std::int64_t skipped_steps = 0;  // steps skipped over the whole run
  friend constexpr bool operator==(const loss_scaler_state&, const loss_scaler_state&) = default;
};

class dynamic_loss_scaler {
 public:
  explicit dynamic_loss_scaler(float initial_scale = 65536.0F, float growth_factor = 2.0F,
                               float backoff_factor = 0.5F, std::int64_t growth_interval = 2000,
                               float min_scale = 1.0F)
      : growth_factor_(growth_factor),
        backoff_factor_(backoff_factor),
        growth_interval_(growth_interval),
        min_scale_(min_scale) {
    const auto fail = [&](const char* why) {
      throw shape_error(detail::message("zest: dynamic_loss_scaler(initial_scale ", initial_scale,
                                        ", growth_factor ", growth_factor, ", backoff_factor ",
                                        backoff_factor, ", growth_interval ", growth_interval,
                                        ", min_scale ", min_scale, "): ", why));
    };
    if (!(std::isfinite(min_scale) && min_scale > 0)) fail("min_scale must be finite and > 0");
    if (!(std::isfinite(initial_scale) && initial_scale >= min_scale)) {
      fail("initial_scale must be finite and >= min_scale");
    }
    if (!(std::isfinite(growth_factor) && growth_factor >= 1)) {
      fail("growth_factor must be finite and >= 1");
    }
    if (!(backoff_factor > 0 && backoff_factor <= 1)) fail("backoff_factor must be in (0, 1]");
    if (growth_interval < 1) fail("growth_interval must be >= 1");
    state_.scale = initial_scale;
  }

  // The factor the loss is multiplied by before backward (gradients divide by it).
  float scale() const { return state_.scale; }
  std::int64_t good_steps_in_row() const { return state_.good_steps; }
  std::int64_t skipped_steps() const { return state_.skipped_steps; }

  float growth_factor() const { return growth_factor_; }
  float backoff_factor() const { return backoff_factor_; }
  std::int64_t growth_interval() const { return growth_interval_; }
  float min_scale() const { return min_scale_; }

  // Records the outcome of a backward pass; returns whether its step should be applied.
  // found_inf must be the same on every rank (see any_rank).
  bool update(bool found_inf) {
    if (found_inf) {
      const float reduced = state_.scale * backoff_factor_;
      state_.scale = reduced < min_scale_ ? min_scale_ : reduced;
      state_.good_steps = 0;
      ++state_.skipped_steps;
      return false;
    }
    if (++state_.good_steps >= growth_interval_) {
      const float grown = state_.scale * growth_factor_;
      if (std::isfinite(grown)) state_.scale = grown;
      state_.good_steps = 0;
    }
    return true;
  }

  loss_scaler_state state() const { return state_; }
  // Restores a saved state; throws zest::shape_error when it does not fit this scaler.
  void restore(const loss_scaler_state& s) {
    if (!(std::isfinite(s.scale) && s.scale >= min_scale_) || s.good_steps < 0 ||
        s.good_steps >= growth_interval_ || s.skipped_steps < 0) {
      throw shape_error(detail::message(
          "zest: dynamic_loss_scaler::restore: state {scale ", s.scale, ", good_steps ",
          s.good_steps, ", skipped_steps ", s.skipped_steps, "} does not fit a scaler with ",
          "min_scale ", min_scale_, " and growth_interval ", growth_interval_));
    }
    state_ = s;
  }

 private:
  float growth_factor_;
  float backoff_factor_;
  std::int64_t growth_interval_;
  float min_scale_;
  loss_scaler_state state_;
};

namespace detail {

// The raw bits of an element and the mask of its exponent: all ones means inf or NaN.
template <class T>
struct nonfinite_mask;
template <>
struct nonfinite_mask<float> {
  using bits_type = std::uint32_t;
  static constexpr bits_type exponent = 0x7f800000U;
  ZEST_HOST_DEVICE static constexpr bits_type bits(float x) { return std::bit_cast<bits_type>(x); }
};
template <>
struct nonfinite_mask<double> {
  using bits_type = std::uint64_t;
  static constexpr bits_type exponent = 0x7ff0000000000000ULL;
  ZEST_HOST_DEVICE static constexpr bits_type bits(double x) { return std::bit_cast<bits_type>(x); }
};
template <>
struct nonfinite_mask<bfloat16> {
  using bits_type = std::uint16_t;
  static constexpr bits_type exponent = 0x7f80U;
  ZEST_HOST_DEVICE static constexpr bits_type bits(bfloat16 x) { return x.bits; }
};
template <>
struct nonfinite_mask<float16> {
  using bits_type = std::uint16_t;
  static constexpr bits_type exponent = 0x7c00U;
  ZEST_HOST_DEVICE static constexpr bits_type bits(float16 x) { return x.bits(); }
};

// 1 for an inf or NaN element (its exponent bits all ones), else 0: summed by the backend,
// every element read (no early exit, no atomics). The body of the test on every backend.
template <class T>
struct nonfinite_count_fn {
  using mask = nonfinite_mask<T>;
  const T* x;
  ZEST_HOST_DEVICE double operator()(std::size_t i) const {
    return (mask::bits(x[i]) & mask::exponent) == mask::exponent ? 1.0 : 0.0;
  }
};

}  // namespace detail

// Whether any element is inf or NaN, for float, double, bfloat16 and float16 in the memory of
// backend B (device memory on a GPU): the backend's sum of a test of exponent bits per
// element (on the host a loop that vectorises; on a GPU a reduction kernel).
//   const bool bad = zest::has_inf_or_nan<zest::backend_of<Mesh>>(std::span<const float16>(g));
template <backend B, class T>
bool has_inf_or_nan(std::span<const T> values) {
  return B::sum(values.size(), detail::nonfinite_count_fn<std::remove_cv_t<T>>{values.data()}) !=
         0.0;
}

// The same on values in host memory.
template <class T>
bool has_inf_or_nan(std::span<const T> values) {
  return has_inf_or_nan<host_backend>(values);
}
template <class T>
requires(!std::is_const_v<T>) bool has_inf_or_nan(std::span<T> values) {
  return has_inf_or_nan<host_backend>(std::span<const T>(values));
}

// True on every rank when `local` is true on any rank of the mesh: an all_reduce (max) of
// one value over mesh.world(). Every rank of the mesh must call it.
template <class Mesh>
bool any_rank(const Mesh& mesh, bool local) {
  std::int32_t flag = local ? 1 : 0;
  mesh.world().all_reduce(std::span<std::int32_t>(&flag, 1), reduce_op::max);
  return flag != 0;
}

}  // namespace zest
