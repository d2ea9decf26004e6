// zest/tensor/redistribute.hpp — change a tensor's layout; the collectives follow from it.
//
//   auto w_full = zest::redistribute<zest::layout<>>(w);            // all-gather over dp
//   auto y_rs   = zest::redistribute<zest::layout<zest::split<'b', "dp">>>(y_partial);
//
// The steps are carried out here, one per mesh axis, on the axis' communicator. Whether a
// transition communicates is known at compile time (transition_plan_v, the fixed-order plan);
// the steps that run are the cheapest for the tensor's extents and the mesh's sizes
// (plan_transition with a transition_shape, zest/layout/transition.hpp), searched once per
// shape. A transition that needs no communication (replicate -> split, replicate ->
// partial) sends nothing.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zest/backend/backend.hpp"
#include "zest/comm/checked.hpp"
#include "zest/core/error.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/transition.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

namespace detail {

// A shard in flight between two layouts: its current layout, local extents and contents.
// The contents start as the caller's buffer, borrowed: the first step that produces a new
// buffer (all of them but all_reduce and zero_partial) reads it without a copy.
template <class T, class Backend, std::size_t Rank>
struct moving_shard {
  using buffer = typename Backend::template buffer<T>;
  layout_value layout{};
  std::array<std::size_t, Rank> local{};
  std::span<const T> data;
  buffer owned;
  bool borrowed = true;

  T* writable() {
    if (borrowed) {
      owned = buffer(data.size());
      Backend::copy_slices(data.data(), 1, 1, 0, owned.data(), 1, 0, 1, data.size());
      borrowed = false;
    }
    data = {owned.data(), owned.size()};
    return owned.data();
  }
  void replace(buffer&& next) {
    owned = std::move(next);
    data = {owned.data(), owned.size()};
    borrowed = false;
  }
  buffer release() {
    if (borrowed) writable();
    return std::move(owned);
  }
};

template <std::size_t Rank>
struct slab {  // the data seen as [outer][extent][inner] around one dim
  std::size_t outer = 1, extent = 1, inner = 1;
};
template <std::size_t Rank>
slab<Rank> slab_around(const std::array<std::size_t, Rank>& ext, std::size_t dim) {
  slab<Rank> s;
  for (std::size_t i = 0; i < dim; ++i) s.outer *= ext[i];
  s.extent = ext[dim];
  for (std::size_t i = dim + 1; i < Rank; ++i) s.inner *= ext[i];
  return s;
}

// One step of a plan. The dims are a run-time argument: this, the largest function of the
// library's training path, is compiled once per element type and rank, not once per tensor
// type (bench/README.md, "Compile time and memory").
template <class T, class Mesh, class Backend, std::size_t Rank>
void apply_step(const transition_step& s, moving_shard<T, Backend, Rank>& sh,
                const std::array<std::size_t, Rank>& global, const Mesh& mesh,
                std::string_view dims) {
  // Checked mode compares this across ranks and names it in a mismatch or a timeout.
  const collective_context context("redistribute", [&](std::ostream& o) {
    const auto shown = [](std::string t) { return t.empty() ? std::string("replicate") : t; };
    o << '"' << dims << "\" " << shown(to_string(sh.layout, Mesh::axis_names)) << " -> "
      << shown(to_string(after_step(sh.layout, s), Mesh::axis_names)) << " (" << name_of(s.kind)
      << " over " << Mesh::axis_names[s.axis] << ')';
  });
  auto& comm = mesh.axis(s.axis);
  const auto n = static_cast<std::size_t>(mesh.size(s.axis));
  const auto me = static_cast<std::size_t>(mesh.coord(s.axis));
  const auto dim_of = [dims](char c) { return dims.find(c); };
  auto coords = mesh.coords();

  switch (s.kind) {
    case step_kind::all_reduce: {
      comm.all_reduce(std::span<T>(sh.writable(), sh.data.size()), reduce_op::sum);
      return;
    }
    case step_kind::zero_partial: {
      if (me != 0) Backend::fill(sh.writable(), sh.data.size(), T{});
      return;
    }
    case step_kind::slice: {
      const std::size_t i = dim_of(s.dim);
      const block_range part = balanced_block(sh.local[i], n, me);
      const auto sl = slab_around(sh.local, i);
      typename Backend::template buffer<T> out(sl.outer * part.size * sl.inner);
      Backend::copy_slices(sh.data.data(), sl.outer, sl.extent, part.offset, out.data(), part.size,
                           0, part.size, sl.inner);
      sh.replace(std::move(out));
      sh.local[i] = part.size;
      return;
    }
    case step_kind::all_gather: {
      const std::size_t i = dim_of(s.dim);
      const auto sl = slab_around(sh.local, i);
      std::vector<std::size_t> counts(n);
      std::vector<block_range> ranges(n);
      for (std::size_t c = 0; c < n; ++c) {
        coords[s.axis] = static_cast<int>(c);
        ranges[c] = dim_range(sh.layout, s.dim, global[i], mesh.sizes(), coords);
        counts[c] = sl.outer * ranges[c].size * sl.inner;
      }
      std::size_t full = 0;
      for (const auto& r : ranges) full += r.size;
      typename Backend::template buffer<T> out(sl.outer * full * sl.inner);
      if (sl.outer == 1) {  // blocks are already in place, in rank order
        comm.all_gather(std::span<const T>(sh.data.data(), sh.data.size()),
                        std::span<T>(out.data(), out.size()), std::span<const std::size_t>(counts));
      } else {
        typename Backend::template buffer<T> staged(out.size());
        comm.all_gather(std::span<const T>(sh.data.data(), sh.data.size()),
                        std::span<T>(staged.data(), staged.size()),
                        std::span<const std::size_t>(counts));
        std::size_t at = 0;
        std::size_t pos = 0;
        for (std::size_t c = 0; c < n; ++c) {
          Backend::copy_slices(staged.data() + at, sl.outer, ranges[c].size, 0, out.data(), full,
                               pos, ranges[c].size, sl.inner);
          at += counts[c];
          pos += ranges[c].size;
        }
      }
      sh.replace(std::move(out));
      sh.local[i] = full;
      return;
    }
    case step_kind::reduce_scatter: {
      const std::size_t i = dim_of(s.dim);
      const auto sl = slab_around(sh.local, i);
      std::vector<std::size_t> counts(n);
      std::vector<block_range> parts(n);
      for (std::size_t c = 0; c < n; ++c) {
        parts[c] = balanced_block(sl.extent, n, c);
        counts[c] = sl.outer * parts[c].size * sl.inner;
      }
      typename Backend::template buffer<T> out(counts[me]);
      if (sl.outer == 1) {
        comm.reduce_scatter(std::span<const T>(sh.data.data(), sh.data.size()),
                            std::span<T>(out.data(), out.size()),
                            std::span<const std::size_t>(counts), reduce_op::sum);
      } else {
        typename Backend::template buffer<T> staged(sh.data.size());
        std::size_t at = 0;
        for (std::size_t c = 0; c < n; ++c) {
          Backend::copy_slices(sh.data.data(), sl.outer, sl.extent, parts[c].offset,
                               staged.data() + at, parts[c].size, 0, parts[c].size, sl.inner);
          at += counts[c];
        }
        comm.reduce_scatter(std::span<const T>(staged.data(), staged.size()),
                            std::span<T>(out.data(), out.size()),
                            std::span<const std::size_t>(counts), reduce_op::sum);
      }
      sh.replace(std::move(out));
      sh.local[i] = parts[me].size;
      return;
    }
    case step_kind::all_to_all: {
      // I hold my block of `dim` and all of `to_dim` (within its outer splits). Rank c gets
      // my block cut to its part of to_dim; I get every rank's block of `dim` cut to mine.
      const std::size_t i = dim_of(s.dim);
      const std::size_t j = dim_of(s.to_dim);
      const auto send_slab = slab_around(sh.local, j);
      std::vector<std::size_t> send_counts(n), recv_counts(n);
      std::vector<block_range> to_parts(n), from_ranges(n);
      for (std::size_t c = 0; c < n; ++c) {
        to_parts[c] = balanced_block(sh.local[j], n, c);
        send_counts[c] = send_slab.outer * to_parts[c].size * send_slab.inner;
        coords[s.axis] = static_cast<int>(c);
        from_ranges[c] = dim_range(sh.layout, s.dim, global[i], mesh.sizes(), coords);
      }
      // Elements other than dims i and j are the same on every rank of the axis.
      std::size_t rest = 1;
      for (std::size_t k = 0; k < Rank; ++k) {
        if (k != i && k != j) rest *= sh.local[k];
      }
      std::size_t full = 0;
      for (std::size_t c = 0; c < n; ++c) {
        recv_counts[c] = rest * from_ranges[c].size * to_parts[me].size;
        full += from_ranges[c].size;
      }
      typename Backend::template buffer<T> send(sh.data.size());
      std::size_t at = 0;
      for (std::size_t c = 0; c < n; ++c) {
        Backend::copy_slices(sh.data.data(), send_slab.outer, send_slab.extent, to_parts[c].offset,
                             send.data() + at, to_parts[c].size, 0, to_parts[c].size,
                             send_slab.inner);
        at += send_counts[c];
      }
      std::size_t recv_total = 0;
      for (auto c : recv_counts) recv_total += c;
      typename Backend::template buffer<T> recv(recv_total);
      comm.all_to_all(
          std::span<const T>(send.data(), send.size()), std::span<const std::size_t>(send_counts),
          std::span<T>(recv.data(), recv.size()), std::span<const std::size_t>(recv_counts));
      auto out_local = sh.local;
      out_local[i] = full;
      out_local[j] = to_parts[me].size;
      const auto recv_slab = slab_around(out_local, i);
      typename Backend::template buffer<T> out(recv_total);
      at = 0;
      std::size_t pos = 0;
      for (std::size_t c = 0; c < n; ++c) {
        Backend::copy_slices(recv.data() + at, recv_slab.outer, from_ranges[c].size, 0, out.data(),
                             full, pos, from_ranges[c].size, recv_slab.inner);
        at += recv_counts[c];
        pos += from_ranges[c].size;
      }
      sh.replace(std::move(out));
      sh.local = out_local;
      return;
    }
  }
}

}  // namespace detail

namespace detail {
// Carries out a plan on a shard; `from` may be a run-time value (tests sweep all pairs).
// The shard is either borrowed (a span, read by the first step) or handed over (a buffer).
template <fixed_string Dims, class T, class Mesh, std::size_t Rank,
          class Backend = backend_of<Mesh>>
typename Backend::template buffer<T> run_transition(const transition_plan& plan,
                                                    const layout_value& from,
                                                    const std::array<std::size_t, Rank>& local,
                                                    std::span<const T> data,
                                                    const std::array<std::size_t, Rank>& global,
                                                    const Mesh& mesh) {
  moving_shard<T, Backend, Rank> sh{from, local, data, {}, true};
  for (const auto& s : plan) {
    apply_step<T, Mesh, Backend, Rank>(s, sh, global, mesh, view_of<Dims>);
    sh.layout = after_step(sh.layout, s);
  }
  return sh.release();
}
template <fixed_string Dims, class Buffer, class Mesh, std::size_t Rank,
          class Backend = backend_of<Mesh>>
requires(!std::is_lvalue_reference_v<Buffer>) Buffer
    run_transition(const transition_plan& plan, const layout_value& from,
                   const std::array<std::size_t, Rank>& local, Buffer&& data,
                   const std::array<std::size_t, Rank>& global, const Mesh& mesh) {
  using T = typename Buffer::value_type;
  moving_shard<T, Backend, Rank> sh{from, local, {}, {}, true};
  sh.replace(std::move(data));
  for (const auto& s : plan) {
    apply_step<T, Mesh, Backend, Rank>(s, sh, global, mesh, view_of<Dims>);
    sh.layout = after_step(sh.layout, s);
  }
  return sh.release();
}
}  // namespace detail

// The fixed-order plan between two layouts, computed once per pair at compile time. It needs
// a collective exactly when the plan that runs does, and costs no less than it for any shape.
template <layout_key From, layout_key To>
inline constexpr transition_plan transition_plan_v = plan_transition(to_layout(From),
                                                                     to_layout(To));

// Runs the cheapest plan from the tensor's layout to To for its extents. (The tensor type is
// taken whole and taken apart through its members: deducing class-type template arguments
// from a function argument is something nvcc's front end does not do.)
template <layout_key To, sharded_tensor X>
auto redistribute_to(X&& t) {
  using x_t = std::remove_cvref_t<X>;
  using value_type = typename x_t::value_type;
  using result_t = with_layout<x_t, To>;
  constexpr bool owned =
      !std::is_lvalue_reference_v<X> && !std::is_const_v<std::remove_reference_t<X>>;
  if constexpr (transition_plan_v<x_t::layout, To>.size() == 0) {
    if constexpr (owned) {
      return result_t(t.mesh(), t.extents(), std::move(t.storage()));
    } else {
      return result_t(t.mesh(), t.extents(), typename result_t::storage_type(t.storage()));
    }
  } else if constexpr (owned) {
    const transition_plan plan =
        transition_plan_for<x_t::dims>(x_t::layout, result_t::layout, t.extents(), t.mesh());
    return result_t(
        t.mesh(), t.extents(),
        detail::run_transition<x_t::dims>(plan, x_t::layout, t.local_extents(),
                                          std::move(t.storage()), t.extents(), t.mesh()));
  } else {
    const transition_plan plan =
        transition_plan_for<x_t::dims>(x_t::layout, result_t::layout, t.extents(), t.mesh());
    return result_t(t.mesh(), t.extents(),
                    detail::run_transition<x_t::dims>(plan, x_t::layout, t.local_extents(),
                                                      std::span<const value_type>(t.local()),
                                                      t.extents(), t.mesh()));
  }
}

// redistribute<layout<...>>(t): the public spelling, with the layout written as users write it.
template <class Layout, sharded_tensor X>
auto redistribute(X&& t) {
  using x_t = std::remove_cvref_t<X>;
  return redistribute_to<layout_value_of<typename x_t::mesh_type, x_t::dims, Layout>>(
      std::forward<X>(t));
}

// The fixed-order plan of redistribute<Layout> for tensor type X, at compile time: whether
// it communicates, and an upper bound on what it sends for any extents.
template <sharded_tensor X, class Layout>
inline constexpr transition_plan redistribute_plan =
    plan_transition(X::layout, layout_value_of<typename X::mesh_type, X::dims, Layout>);

// The plan redistribute<Layout>(x) runs: the cheapest for x's extents and mesh.
template <class Layout, sharded_tensor X>
transition_plan redistribute_plan_for(const X& x) {
  return transition_plan_for<X::dims>(
      X::layout, layout_value_of<typename X::mesh_type, X::dims, Layout>, x.extents(), x.mesh());
}

// The whole global tensor on every rank, partial sums added: for checks and small outputs.
template <sharded_tensor X>
std::vector<typename std::remove_cvref_t<X>::value_type> to_global(const X& t) {
  using x_t = std::remove_cvref_t<X>;
  const auto full =
      redistribute_to<replicated_layout(x_t::mesh_type::axis_count)>(t).local_to_host();
  return std::vector<typename x_t::value_type>(full.begin(), full.end());
}

}  // namespace zest
