// zest/backend/backend.hpp — where a tensor's shard lives and what computes on it.
//
// A backend is a type with static members; tensors, redistribute and einsum use nothing
// else to touch shard memory, so the same typed program runs on the host or on a GPU by
// changing the mesh's communicator (which names its backend):
//
//   buffer<T>                 owning storage: buffer(n) (contents unspecified), data(),
//                             size(), move-only or copyable
//   copy_slices(...)          strided block copy, the packing step of every collective
//   fill(p, n, value)         set n elements
//   contract(views, out...)   local einsum of one or two operands (zest/backend/host/contract.hpp)
//   to_host / from_host       staging for generate, from_global and to_global
//   for_each(n, f)            f(i) for every i < n, in any order and in parallel: f is a
//                             trivially copyable function object whose call operator is
//                             ZEST_HOST_DEVICE (a CUDA kernel runs it on the GPU backend)
//   sum(n, f)                 the sum over i < n of f(i), a double on the host (f as above;
//                             the host backend adds in sixteen lanes, a fixed order)
//   runs_host_loops           optional, true on the host backend only: for_each_kernel and
//                             sum_kernel below call a function object's host-vectorised
//                             member where it has one
//   host_addressable          optional, true on the host backend only: host code may read
//                             and write the buffers in place, so host_staging below views
//                             them instead of copying
//   counters()                zest::memory::counters of the memory the buffers live in
//   synchronize()             returns once the backend's queued work is done (a no-op on
//                             the host; timings of GPU work call it)
//
// The element and row loops of autodiff, the optimizers, ZeRO's packing and MoE's index ops
// are written once as such function objects. A function object may also carry the same loop
// vectorised for host memory (Eigen array expressions), as a member
//
//   void host(std::size_t n) const;      // for_each_kernel: does what f(0) .. f(n - 1) do
//   double host_sum(std::size_t n) const;  // sum_kernel: the sum of f(0) .. f(n - 1)
//
// which for_each_kernel<B> / sum_kernel<B> call on a backend with runs_host_loops (the host
// backend); every other backend runs f(i) itself. So an operation is written once, and the
// host's speed is a member of its kernel, not a second body. The emulated backend
// (zest/backend/emulated/emulated_backend.hpp) runs the plain f(i) on the host, so the code
// paths of the GPU are tested on machines without one.
//
// Host code that must see a shard as host memory (a checkpoint's record of it) goes through
// host_staging<B, T> below: the shard itself where B is host_addressable, a host copy with a
// write-back elsewhere; one mechanism on B's members, not a branch per caller.
//
// The host backend is the default: a mesh whose communicator does not name a backend
// (`using backend_type = ...`) computes on the host.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zest/backend/contraction_plan.hpp"
#include "zest/core/memory.hpp"

namespace zest {

namespace detail {
// Stand-ins for the function objects for_each and sum take, used only in the concept below.
struct backend_probe_loop {
  void operator()(std::size_t) const {}
};
struct backend_probe_sum {
  float operator()(std::size_t) const { return 0; }
};
template <class B>
concept backend_loop_flag = !requires {
  B::runs_host_loops;
}
|| requires {
  { B::runs_host_loops } -> std::convertible_to<bool>;
};
template <class B>
concept backend_memory_flag = !requires {
  B::host_addressable;
}
|| requires {
  { B::host_addressable } -> std::convertible_to<bool>;
};
}  // namespace detail

// The members listed at the top of this file, each with the signature its uses need (checked
// for float; the members are templates over the element type). A backend that lacks one, or
// has it with another signature, fails here, where the type is declared, rather than deep in
// an einsum or an optimizer step.
template <class B>
concept backend = requires {
  { B::name } -> std::convertible_to<std::string_view>;
  typename B::template buffer<float>;
}
&&std::constructible_from<typename B::template buffer<float>, std::size_t>&&
    std::movable<typename B::template buffer<float>>&& detail::backend_loop_flag<B>&&
        detail::backend_memory_flag<B>&& requires(
            typename B::template buffer<float>& buf, const typename B::template buffer<float>& cbuf,
            float* p, const float* cp, std::size_t n, std::span<const float> values,
            std::span<const contraction::operand_view<float>> operands, std::string_view labels,
            std::span<const std::size_t> extents) {
  { buf.data() } -> std::convertible_to<float*>;
  { cbuf.data() } -> std::convertible_to<const float*>;
  { cbuf.size() } -> std::convertible_to<std::size_t>;
  B::copy_slices(cp, n, n, n, p, n, n, n, n);
  B::fill(p, n, 1.0F);
  B::contract(operands, labels, p, extents);
  B::for_each(n, detail::backend_probe_loop{});
  { B::sum(n, detail::backend_probe_sum{}) } -> std::convertible_to<double>;
  { B::counters() } -> std::same_as<memory::counters&>;
  B::synchronize();
  { B::template from_host<float>(values) } -> std::same_as<typename B::template buffer<float>>;
  B::to_host(values, p);
};

struct host_backend;

namespace detail {
template <class Comm>
struct backend_of_communicator {
  using type = host_backend;
};
template <class Comm>
requires requires { typename Comm::backend_type; }
struct backend_of_communicator<Comm> {
  using type = typename Comm::backend_type;
};
}  // namespace detail

// The backend of a mesh type (through its communicator).
template <class Mesh>
using backend_of = typename detail::backend_of_communicator<typename Mesh::communicator_type>::type;

namespace detail {
template <class B>
constexpr bool runs_host_loops() {
  if constexpr (requires { B::runs_host_loops; }) {
    return B::runs_host_loops;
  } else {
    return false;
  }
}
template <class B>
constexpr bool host_addressable() {
  if constexpr (requires { B::host_addressable; }) {
    return B::host_addressable;
  } else {
    return false;
  }
}
}  // namespace detail

// B::for_each(n, f), or f.host(n) where B runs host loops and f has that member.
template <class B, class F>
void for_each_kernel(std::size_t n, const F& f) {
  if constexpr (detail::runs_host_loops<B>() && requires { f.host(n); }) {
    f.host(n);
  } else {
    B::for_each(n, f);
  }
}
// B::sum(n, f), or f.host_sum(n) where B runs host loops and f has that member.
template <class B, class F>
double sum_kernel(std::size_t n, const F& f) {
  if constexpr (detail::runs_host_loops<B>() && requires { f.host_sum(n); }) {
    return f.host_sum(n);
  } else {
    return B::sum(n, f);
  }
}

// A block of B's memory as host memory: host() is the block itself where B is
// host_addressable, else a host copy made at construction (B::to_host); write_back() puts the
// copy's values back into the block (B::from_host, then B::copy_slices into it: the block
// stays where it is), and does nothing in place. T may be const: then there is nothing to
// write back. The block must outlive the staging.
//
//   host_staging<B, float> s(tensor.local());
//   read_or_change(s.host());
//   s.write_back();
template <class B, class T>
class host_staging {
 public:
  static constexpr bool in_place = detail::host_addressable<B>();
  using value_type = std::remove_const_t<T>;

  explicit host_staging(std::span<T> block) : block_(block) {
    if constexpr (!in_place) {
      copy_.resize(block.size());
      B::to_host(std::span<const value_type>(block.data(), block.size()), copy_.data());
    }
  }

  std::span<T> host() {
    if constexpr (in_place) {
      return block_;
    } else {
      return std::span<T>(copy_.data(), copy_.size());
    }
  }

  void write_back() const requires(!std::is_const_v<T>) {
    if constexpr (!in_place) {
      const std::size_t n = block_.size();
      if (n == 0) return;
      const auto staged =
          B::template from_host<value_type>(std::span<const value_type>(copy_.data(), n));
      B::copy_slices(staged.data(), 1, n, 0, block_.data(), n, 0, n, 1);
    }
  }

 private:
  std::span<T> block_;
  std::vector<value_type, memory::tracking_allocator<value_type>> copy_;
};

}  // namespace zest
