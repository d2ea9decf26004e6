// zest/optim/adamw.hpp — the AdamW update of one shard: fp32 parameters and moments, fp32,
// bfloat16 or float16 gradients.
//
//   zest::adamw_config c;                         // lr 3e-4, betas (0.9, 0.95), eps 1e-8, wd 0.1
//   ++step;                                       // 1-based: the first update uses step 1
//   zest::adamw_update(master, grad, m, v, step, schedule(step - 1), c, 1.0f / loss_scale);
//
// Per element, with g = grad * grad_scale:
//   m = b1 m + (1 - b1) g          v = b2 v + (1 - b2) g^2
//   mhat = m / (1 - b1^step)       vhat = v / (1 - b2^step)
//   param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param)     (wd term only when decay)
// The decay is decoupled (AdamW, Loshchilov & Hutter): it shrinks the parameter directly
// instead of entering the gradient. Plain Adam is weight_decay = 0 (adam_config()), or
// decay = false for parameters that are not decayed (biases, norms).
//
// The kernel is one pass over the four arrays. It works in blocks of 16 elements whose
// loops have a fixed trip count and no branches, so compilers vectorise them even at -O2
// (the square roots use SSE directly on x86: std::sqrt's errno handling keeps a compiler
// from vectorising it unless -fno-math-errno is given). The arrays must not overlap.
//
// The update is one function object, adamw_element_fn, run by the backend's loop
// (for_each_kernel, zest/backend/backend.hpp): its call operator is the formula for one
// element, which a GPU (or the emulated backend) runs per element; its host member is the
// blocked loop above, which the host backend runs. adamw_update<B>(...) takes the arrays in
// the memory of backend B (device pointers on a GPU).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#if (defined(__SSE__) || defined(_M_X64)) && !defined(__CUDA_ARCH__)
#include <xmmintrin.h>
#define ZEST_OPTIM_SSE_SQRT 1
#else
#define ZEST_OPTIM_SSE_SQRT 0
#endif

#include "zest/backend/backend.hpp"
#include "zest/backend/host/host_backend.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/device_math.hpp"
#include "zest/core/error.hpp"
#include "zest/core/float16.hpp"

namespace zest {

struct adamw_config {
  float lr = 3e-4F;  // a default for callers without a schedule; adamw_update takes lr itself
  float beta1 = 0.9F;
  float beta2 = 0.95F;
  float eps = 1e-8F;
  float weight_decay = 0.1F;
};

// Adam without weight decay.
constexpr adamw_config adam_config(adamw_config c = {}) {
  c.weight_decay = 0.0F;
  return c;
}

namespace detail {

// The per-step constants, folded once: param = keep * param - step_size * m / (sqrt(v) *
// inv_sqrt_bc2 + eps), which is the formula above rearranged.
struct adamw_constants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;     // lr / (1 - b1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - b2^step)
  float eps;
  float keep;  // 1 - lr * wd, or 1 without decay
  float grad_scale;
};

template <class G>
inline float adamw_grad(G g) {
  return static_cast<float>(g);
}

inline constexpr std::size_t adamw_block = 16;

template <class G>
inline void adamw_block_update(float* __restrict p, const G* __restrict grad, float* __restrict m,
                               float* __restrict v, const adamw_constants& k) {
  alignas(64) float root[adamw_block];
  for (std::size_t j = 0; j < adamw_block; ++j) {
    const float g = adamw_grad(grad[j]) * k.grad_scale;
    const float mi = k.beta1 * m[j] + k.one_minus_beta1 * g;
    const float vi = k.beta2 * v[j] + k.one_minus_beta2 * g * g;
    m[j] = mi;
    v[j] = vi;
    root[j] = vi;
  }
#if ZEST_OPTIM_SSE_SQRT
  for (std::size_t j = 0; j < adamw_block; j += 4) {
    _mm_store_ps(root + j, _mm_sqrt_ps(_mm_load_ps(root + j)));
  }
#else
  for (std::size_t j = 0; j < adamw_block; ++j) root[j] = std::sqrt(root[j]);
#endif
  for (std::size_t j = 0; j < adamw_block; ++j) {
    p[j] = k.keep * p[j] - k.step_size * m[j] / (root[j] * k.inv_sqrt_bc2 + k.eps);
  }
}

// The update of element i; host(n): the same over elements 0 .. n - 1 in blocks that
// vectorise, the tail that does not fill a block element by element.
template <class G>
struct adamw_element_fn {
  float* p;
  const G* grad;
  float* m;
  float* v;
  adamw_constants k;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const float g = static_cast<float>(grad[i]) * k.grad_scale;
    const float mi = k.beta1 * m[i] + k.one_minus_beta1 * g;
    const float vi = k.beta2 * v[i] + k.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    p[i] = k.keep * p[i] - k.step_size * mi / (dmath::sqrt(vi) * k.inv_sqrt_bc2 + k.eps);
  }
  void host(std::size_t n) const {
    std::size_t i = 0;
    for (; i + adamw_block <= n; i += adamw_block) {
      adamw_block_update(p + i, grad + i, m + i, v + i, k);
    }
    for (; i < n; ++i) (*this)(i);
  }
};

template <class A, class B>
bool overlaps(std::span<A> a, std::span<B> b) {
  if (a.empty() || b.empty()) return false;
  const auto* a0 = reinterpret_cast<const unsigned char*>(a.data());  // NOLINT
  const auto* b0 = reinterpret_cast<const unsigned char*>(b.data());  // NOLINT
  return a0 < b0 + b.size_bytes() && b0 < a0 + a.size_bytes();
}

template <class Backend, class G>
void adamw_update_impl(std::span<float> param, std::span<const G> grad, std::span<float> m,
                       std::span<float> v, std::int64_t step, float lr, const adamw_config& c,
                       float grad_scale, bool decay) {
  const std::size_t n = param.size();
  if (grad.size() != n || m.size() != n || v.size() != n) {
    throw shape_error(message("zest: adamw_update: sizes differ: param ", n, ", grad ", grad.size(),
                              ", m ", m.size(), ", v ", v.size()));
  }
  if (step < 1) {
    throw shape_error(message("zest: adamw_update: step ", step,
                              " is not a valid step count; steps count from 1 (the first "
                              "update is step 1)"));
  }
  if (overlaps(param, m) || overlaps(param, v) || overlaps(m, v) || overlaps(param, grad) ||
      overlaps(m, grad) || overlaps(v, grad)) {
    throw shape_error(
        "zest: adamw_update: param, grad, m and v must be distinct arrays that do "
        "not overlap");
  }
  // Bias corrections in double: 1 - b^step loses digits in float for b close to 1.
  const auto t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t);
  const adamw_constants k{
      .beta1 = c.beta1,
      .one_minus_beta1 = 1.0F - c.beta1,
      .beta2 = c.beta2,
      .one_minus_beta2 = 1.0F - c.beta2,
      .step_size = static_cast<float>(static_cast<double>(lr) / bc1),
      .inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2)),
      .eps = c.eps,
      .keep = decay ? static_cast<float>(1.0 - static_cast<double>(lr) * c.weight_decay) : 1.0F,
      .grad_scale = grad_scale,
  };
  if (n == 0) return;
  for_each_kernel<Backend>(n,
                           adamw_element_fn<G>{param.data(), grad.data(), m.data(), v.data(), k});
}

}  // namespace detail

// One AdamW step on a shard. `step` is the 1-based count of updates including this one;
// `lr` the learning rate of this step (c.lr is not read). Throws zest::shape_error when the
// four sizes differ, the arrays overlap, or step < 1.
inline void adamw_update(std::span<float> param, std::span<const float> grad, std::span<float> m,
                         std::span<float> v, std::int64_t step, float lr, const adamw_config& c,
                         float grad_scale = 1.0F, bool decay = true) {
  detail::adamw_update_impl<host_backend, float>(param, grad, m, v, step, lr, c, grad_scale, decay);
}
// bfloat16 gradients, converted on the fly (the formula is the same).
inline void adamw_update(std::span<float> param, std::span<const bfloat16> grad, std::span<float> m,
                         std::span<float> v, std::int64_t step, float lr, const adamw_config& c,
                         float grad_scale = 1.0F, bool decay = true) {
  detail::adamw_update_impl<host_backend, bfloat16>(param, grad, m, v, step, lr, c, grad_scale,
                                                    decay);
}
// float16 gradients (fp16 training: grad_scale = 1 / loss scale undoes the scaling).
inline void adamw_update(std::span<float> param, std::span<const float16> grad, std::span<float> m,
                         std::span<float> v, std::int64_t step, float lr, const adamw_config& c,
                         float grad_scale = 1.0F, bool decay = true) {
  detail::adamw_update_impl<host_backend, float16>(param, grad, m, v, step, lr, c, grad_scale,
                                                   decay);
}

// The same step on arrays in the memory of backend B (float, bfloat16 or float16
// gradients); on the host backend exactly the overloads above.
template <backend B, class G>
void adamw_update(std::span<float> param, std::span<const G> grad, std::span<float> m,
                  std::span<float> v, std::int64_t step, float lr, const adamw_config& c,
                  float grad_scale = 1.0F, bool decay = true) {
  static_assert(
      std::is_same_v<G, float> || std::is_same_v<G, bfloat16> || std::is_same_v<G, float16>,
      "zest adamw_update: gradients are float, zest::bfloat16 or zest::float16");
  detail::adamw_update_impl<B, G>(param, grad, m, v, step, lr, c, grad_scale, decay);
}

}  // namespace zest

#undef ZEST_OPTIM_SSE_SQRT
