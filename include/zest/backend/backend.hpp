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
//   sum(n, f)                 the sum over i < n of f(i), a double on the host (f as above)
//   counters()                zest::memory::counters of the memory the buffers live in
//   synchronize()             returns once the backend's queued work is done (a no-op on
//                             the host; timings of GPU work call it)
//
// The element and row loops of autodiff, the optimizers, ZeRO's packing and MoE's index ops
// are written once as such function objects. The host backend keeps its own vectorised
// loops where it has them; every other backend runs the function objects. The emulated
// backend (zest/backend/emulated/emulated_backend.hpp) runs them on the host, so the code
// paths of the GPU are tested on machines without one.
//
// The host backend is the default: a mesh whose communicator does not name a backend
// (`using backend_type = ...`) computes on the host.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>

namespace zest {

template <class B>
concept backend = requires {
  B::name;
  typename B::template buffer<float>;
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

}  // namespace zest
