// zest/optim/clip.hpp — the global gradient norm over sharded gradients, and clipping.
//
//   const double norm = zest::global_norm(mesh, grad_w1, grad_w2, grad_b);   // every rank
//   const float coef = zest::clip_coefficient(norm, 1.0);                    // <= 1
//   zest::adamw_update(master, grad, m, v, step, lr, c, coef / loss_scale);
//
// The norm is that of the global (logical) gradients: every element counted exactly once,
// whatever the layouts. A rank's block counts when it is this rank's own: on every mesh
// axis along which the layout is replicated only coordinate 0 counts (the others hold
// copies of the same block); along split axes every rank counts its block (they are
// disjoint). A partial layout holds summands, not values, so it is refused at compile time:
// reduce the gradient first (all-reduce or reduce-scatter it, as the ZeRO stages do).
//
// Each rank sums the squares of the elements it counts in double; one all_reduce of that
// one double over mesh.world() gives the total. The world communicator is apart from the
// axis communicators, so their counters (which tests compare with formulas) do not see it.
//
// For a run-time list of gradients (parameters of several element types, shards owned by
// some ranks only) global_norm also takes a span of norm_term: the values this rank holds
// and whether they count here; norm_term_of(tensor) makes one with the rule above.
//
// The squares are summed where the gradients live, by the backend's sum of one function
// object (square_fn below): on the host backend a vectorised loop in sixteen lanes, a fixed
// order; on a GPU a reduction kernel. Only the one double per rank and the replica rule are
// host work.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <variant>

#include "zest/backend/backend.hpp"
#include "zest/backend/host/host_backend.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/float16.hpp"
#include "zest/core/memory.hpp"
#include "zest/core/source_site.hpp"
#include "zest/layout/layout.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

// One gradient block of a run-time list: the values this rank holds (in the memory of the
// mesh's backend: device memory on a GPU) and whether they count on this rank (false for
// copies another rank counts).
struct norm_term {
  using values_type = std::variant<std::span<const float>, std::span<const bfloat16>,
                                   std::span<const float16>, std::span<const double>>;
  values_type values;
  bool counted = true;
};

namespace clip_error {
// Instantiated with the gradient's tensor type and the index of its partial mesh axis, so
// the compiler's "In instantiation of" line above the message shows both.
template <class Gradient, std::size_t PartialAxis>
struct global_norm_of_partial_gradient {
  static_assert(layout_error::always_false<Gradient>,
                "zest global_norm: a gradient with a partial layout holds summands, not values; "
                "reduce the gradient first (all-reduce or reduce-scatter it to a replicated or "
                "split layout), then take its norm");
};
}  // namespace clip_error

namespace detail {

// x[i]^2 in double: the body of the sum on every backend.
template <class T>
struct square_fn {
  const T* x;
  ZEST_HOST_DEVICE double operator()(std::size_t i) const {
    const auto d = static_cast<double>(static_cast<compute_type_t<T>>(x[i]));
    return d * d;
  }
};

// The sum of squares of values in B's memory.
template <class B, class T>
double sum_of_squares_on(std::span<const T> values) {
  return B::sum(values.size(), square_fn<T>{values.data()});
}

template <sharded_tensor G>
constexpr void check_norm_layout() {
  using X = std::remove_cvref_t<G>;
  using mesh_t = typename X::mesh_type;
  static_assert(std::is_floating_point_v<compute_type_t<typename X::value_type>>,
                "zest global_norm: gradients are float, double, zest::bfloat16 or zest::float16");
  constexpr std::size_t partial_axis = [] {
    for (std::size_t a = 0; a < mesh_t::axis_count; ++a) {
      if (X::layout.is_partial(a)) return a;
    }
    return mesh_t::axis_count;
  }();
  if constexpr (partial_axis < mesh_t::axis_count) {
    (void)clip_error::global_norm_of_partial_gradient<X, partial_axis>{};
  }
}

template <sharded_tensor G>
double tensor_sum_of_squares(const G& g) {
  using X = std::remove_cvref_t<G>;
  using T = typename X::value_type;
  return sum_of_squares_on<typename X::backend_type, T>(g.local());
}

template <class Mesh>
double all_reduce_sum(const Mesh& mesh, double local) {
  mesh.world().all_reduce(std::span<double>(&local, 1), reduce_op::sum);
  return local;
}

}  // namespace detail

// Whether tensor g's block on this rank is the one that counts its elements: coordinate 0
// along every axis on which its layout is replicated. (Partial layouts do not compile.)
template <sharded_tensor G>
bool counts_on_this_rank(const G& g) {
  using X = std::remove_cvref_t<G>;
  detail::check_norm_layout<X>();
  for (std::size_t a = 0; a < X::mesh_type::axis_count; ++a) {
    if (X::layout.is_replicate(a) && g.mesh().coord(a) != 0) return false;
  }
  return true;
}

// The norm_term of a tensor: its local block (in its backend's memory), counted by the rule
// above.
template <sharded_tensor G>
norm_term norm_term_of(const G& g) {
  return norm_term{g.local(), counts_on_this_rank(g)};
}

// This rank's sum of squares over the terms it counts (no communication); the values are in
// the memory of backend B (host memory unless named: pass backend_of<Mesh> for a GPU's).
template <class B = host_backend>
double local_sum_of_squares(std::span<const norm_term> terms) {
  double total = 0;
  for (const auto& t : terms) {
    if (!t.counted) continue;
    total += std::visit(
        [](auto values) {
          using T = typename decltype(values)::element_type;
          return detail::sum_of_squares_on<B, std::remove_const_t<T>>(values);
        },
        t.values);
  }
  return total;
}

// The 2-norm of the global gradients: the same value on every rank. One all_reduce of one
// double on mesh.world(); every rank of the mesh must call it.
template <class Mesh, sharded_tensor... G>
double global_norm(const Mesh& mesh, const G&... grads) {
  (detail::check_norm_layout<G>(), ...);
  double local = 0;
  ((local += counts_on_this_rank(grads) ? detail::tensor_sum_of_squares(grads) : 0.0), ...);
  return std::sqrt(detail::all_reduce_sum(mesh, local));
}

// The same over a run-time list of terms, whose values are in the memory of Mesh's backend.
template <class Mesh>
double global_norm(const Mesh& mesh, std::span<const norm_term> terms,
                   source_site at = source_site::current()) {
  const user_call user(at);
  return std::sqrt(detail::all_reduce_sum(mesh, local_sum_of_squares<backend_of<Mesh>>(terms)));
}

// The factor to multiply gradients by so that their norm is at most max_norm:
// min(1, max_norm / (norm + 1e-6)). max_norm <= 0 turns clipping off (1). An infinite norm
// gives 0; a NaN norm gives NaN, so that a broken gradient is not silently applied.
inline float clip_coefficient(double norm, double max_norm) {
  if (!(max_norm > 0)) return 1.0F;
  if (std::isnan(norm)) return std::numeric_limits<float>::quiet_NaN();
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.0F;
}

}  // namespace zest
