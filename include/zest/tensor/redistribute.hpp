// zest/tensor/redistribute.hpp — change a tensor's layout; the collectives follow from it.
//
//   auto w_full = zest::redistribute<zest::layout<>>(w);            // all-gather over dp
//   auto y_rs   = zest::redistribute<zest::layout<zest::split<'b', "dp">>>(y_partial);
//
//   auto [a2, b2] = zest::redistribute_all<zest::layout<>>(a, b);   // one all-gather for both
//
// The steps run in the mover (zest/tensor/transition_group.hpp), one per mesh axis, on the
// axis' communicator; a group of tensors shares each step's collective. Whether a
// transition communicates is known at compile time (transition_plan_v, the fixed-order plan);
// the steps that run are the cheapest for the tensor's extents and the mesh's sizes
// (cheapest_plan, zest/layout/cheapest_plan.hpp), searched once per
// shape. A transition that needs no communication (replicate -> split, replicate ->
// partial) sends nothing.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/backend/backend.hpp"
#include "zest/comm/checked.hpp"
#include "zest/core/error.hpp"
#include "zest/core/memory.hpp"
#include "zest/core/source_site.hpp"
#include "zest/layout/fixed_order_plan.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/plan_cache.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"
#include "zest/tensor/tensor.hpp"
#include "zest/tensor/transition_group.hpp"

namespace zest {

namespace detail {

// Carries out a plan on one shard (a group of one); `from` may be a run-time value (tests
// sweep all pairs). The shard is either borrowed (a span, read by the first step) or handed
// over (a buffer). One function per element type, mesh and backend, whatever the dims: the
// typed overloads below only name the dims and extents.
template <class T, class Mesh, class Backend, class Data>
typename Backend::template buffer<T> run_shard_transition(const transition_plan& plan,
                                                          std::string_view dims, layout_value from,
                                                          const shard_extents& local, Data&& data,
                                                          const shard_extents& global,
                                                          const Mesh& mesh) {
  transition_group<T, Mesh, Backend> g(mesh);
  g.add(dims, from, plan, global, local, std::forward<Data>(data));
  g.run();
  return g.release(0);
}
template <fixed_string Dims, class T, class Mesh, std::size_t Rank,
          class Backend = backend_of<Mesh>>
typename Backend::template buffer<T> run_transition(const transition_plan& plan, layout_value from,
                                                    const std::array<std::size_t, Rank>& local,
                                                    std::span<const T> data,
                                                    const std::array<std::size_t, Rank>& global,
                                                    const Mesh& mesh) {
  return run_shard_transition<T, Mesh, Backend>(plan, view_of<Dims>, from, to_shard_extents(local),
                                                data, to_shard_extents(global), mesh);
}
template <fixed_string Dims, class Buffer, class Mesh, std::size_t Rank,
          class Backend = backend_of<Mesh>>
requires(!std::is_lvalue_reference_v<Buffer>) Buffer
    run_transition(const transition_plan& plan, layout_value from,
                   const std::array<std::size_t, Rank>& local, Buffer&& data,
                   const std::array<std::size_t, Rank>& global, const Mesh& mesh) {
  return run_shard_transition<typename Buffer::value_type, Mesh, Backend>(
      plan, view_of<Dims>, from, to_shard_extents(local), std::move(data), to_shard_extents(global),
      mesh);
}
}  // namespace detail

// The fixed-order plan between two layouts, computed once per pair at compile time. It needs
// a collective exactly when the plan that runs does, and costs no less than it for any shape.
template <layout_key From, layout_key To>
inline constexpr transition_plan transition_plan_v = fixed_order_plan(to_layout(From),
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
auto redistribute(X&& t, source_site at = source_site::current()) {
  using x_t = std::remove_cvref_t<X>;
  const user_call user(at);
  return redistribute_to<layout_value_of<typename x_t::mesh_type, x_t::dims, Layout>>(
      std::forward<X>(t));
}

// x at layout L: x itself (a reference, no copy) when it has L already, else x redistributed
// to L. The one "bring x to layout L" of einsum's operands, the autodiff ops and the layers.
template <layout_key L, sharded_tensor X>
decltype(auto) at_layout(const X& x) {
  if constexpr (X::layout == L) {
    return (x);
  } else {
    return redistribute_to<L>(x);
  }
}

// ----- Several tensors at once ------------------------------------------------------------
//
//   auto [wq, wk, wv] = zest::redistribute_all<zest::layout<>>(q_shard, k_shard, v_shard);
//   auto pending = zest::redistribute_async<zest::layout<>>(w1, w2);  // issued now
//   ...                                                                // other work
//   auto [w1_full, w2_full] = pending.wait();
//
// Each tensor takes its own transition (one layout for all, or one per tensor in order), and
// every collective step runs once for the whole group: the tensors whose next step is the same
// kind on the same axis share one collective, their blocks packed rank-major. The bytes are
// those of the tensors' own transitions; the calls are one per axis and step instead of one
// per tensor. The tensors share an element type and a mesh. A tensor passed as an lvalue is
// read in place: it must live until wait() returns; an rvalue's storage is taken over.

template <class T, class Mesh, class... Results>
class pending_redistribution {
 public:
  pending_redistribution(const Mesh& mesh, std::unique_ptr<detail::transition_group<T, Mesh>> group,
                         std::tuple<typename Results::extents_type...> extents)
      : mesh_(&mesh), group_(std::move(group)), extents_(std::move(extents)) {}

  // Completes the collectives and returns the tensors in their new layouts.
  std::tuple<Results...> wait() {
    if (!group_) {
      throw std::logic_error(
          "zest redistribute_async: wait() called twice; the first call returned the tensors");
    }
    group_->wait();
    auto out = build(std::index_sequence_for<Results...>{});
    group_.reset();
    return out;
  }

 private:
  template <std::size_t... K>
  std::tuple<Results...> build(std::index_sequence<K...>) {
    return std::tuple<Results...>(Results(*mesh_, std::get<K>(extents_), group_->release(K))...);
  }

  const Mesh* mesh_;
  std::unique_ptr<detail::transition_group<T, Mesh>> group_;
  std::tuple<typename Results::extents_type...> extents_;
};

namespace detail {
// The layout tensor K of a group is brought to: the only layout given, or the K-th.
template <std::size_t K, class... Layouts>
using group_layout_at =
    std::tuple_element_t<(sizeof...(Layouts) == 1 ? 0 : K), std::tuple<Layouts...>>;

template <std::size_t K, class X, class... Layouts>
using group_result_t =
    with_layout<std::remove_cvref_t<X>,
                layout_value_of<typename std::remove_cvref_t<X>::mesh_type,
                                std::remove_cvref_t<X>::dims, group_layout_at<K, Layouts...>>>;

template <class... Layouts, std::size_t... K, class... X>
auto make_group(std::index_sequence<K...>, X&&... xs) {
  using first_t = std::remove_cvref_t<std::tuple_element_t<0, std::tuple<X...>>>;
  using T = typename first_t::value_type;
  using mesh_t = typename first_t::mesh_type;
  const mesh_t& mesh = std::get<0>(std::forward_as_tuple(xs...)).mesh();
  std::size_t index = 0;
  (
      [&] {
        if (&xs.mesh() != &mesh) {
          throw shape_error(detail::message(
              "zest redistribute_all/redistribute_async: tensor ", index, " (\"",
              view_of<std::remove_cvref_t<X>::dims>,
              "\") lives on another mesh object than tensor 0; a group moves over one mesh's "
              "communicators. Fix: move tensors of different meshes in separate calls"));
        }
        ++index;
      }(),
      ...);
  auto group = std::make_unique<transition_group<T, mesh_t>>(mesh);
  (
      [&] {
        using x_t = std::remove_cvref_t<X>;
        using result_t = group_result_t<K, X, Layouts...>;
        const transition_plan plan =
            transition_plan_for<x_t::dims>(x_t::layout, result_t::layout, xs.extents(), mesh);
        constexpr bool owned =
            !std::is_lvalue_reference_v<X> && !std::is_const_v<std::remove_reference_t<X>>;
        if constexpr (owned) {
          const auto local = to_shard_extents(xs.local_extents());
          group->add(view_of<x_t::dims>, x_t::layout, plan, to_shard_extents(xs.extents()), local,
                     std::move(xs.storage()));
        } else {
          group->add(view_of<x_t::dims>, x_t::layout, plan, to_shard_extents(xs.extents()),
                     to_shard_extents(xs.local_extents()), std::span<const T>(xs.local()));
        }
      }(),
      ...);
  return std::tuple(&mesh, std::move(group), std::tuple(xs.extents()...));
}

// The checks of a group's types, each with its fix; instantiated before anything else.
template <class LayoutList, class TensorList>
struct group_check;
template <class... Layouts, class... X>
struct group_check<std::tuple<Layouts...>, std::tuple<X...>> {
  static_assert(sizeof...(X) > 0, "zest redistribute_all/async: give at least one tensor");
  static_assert(sizeof...(Layouts) == 1 || sizeof...(Layouts) == sizeof...(X),
                "zest redistribute_all/async: give one layout for every tensor, or one per "
                "tensor in the tensors' order. Fix: redistribute_all<layout<>>(a, b) or "
                "redistribute_all<layout<>, layout<split<'m', \"dp\">>>(a, b)");
  using first_t = std::remove_cvref_t<std::tuple_element_t<0, std::tuple<X...>>>;
  static_assert(
      (std::is_same_v<typename std::remove_cvref_t<X>::value_type, typename first_t::value_type> &&
       ...),
      "zest redistribute_all/async: the tensors of a group share one element type (one "
      "buffer per collective). Fix: move tensors of different element types in separate calls");
  static_assert(
      (std::is_same_v<typename std::remove_cvref_t<X>::mesh_type, typename first_t::mesh_type> &&
       ...),
      "zest redistribute_all/async: the tensors of a group live on one mesh type. Fix: move "
      "tensors of different meshes in separate calls");
  static constexpr bool reported = true;
};

// Whether the group may be formed, apart from the checks: the callers build nothing after a
// failed check, so its static_assert is the one error (a class whose static_assert failed
// is invalid, and clang would read its members as true).
template <class LayoutList, class TensorList>
inline constexpr bool group_ok = false;
template <class... Layouts, class... X>
inline constexpr bool group_ok<std::tuple<Layouts...>, std::tuple<X...>> =
    sizeof...(X) > 0 && (sizeof...(Layouts) == 1 || sizeof...(Layouts) == sizeof...(X)) &&
    (std::is_same_v<
         typename std::remove_cvref_t<X>::value_type,
         typename std::remove_cvref_t<std::tuple_element_t<0, std::tuple<X...>>>::value_type> &&
     ...) &&
    (std::is_same_v<
         typename std::remove_cvref_t<X>::mesh_type,
         typename std::remove_cvref_t<std::tuple_element_t<0, std::tuple<X...>>>::mesh_type> &&
     ...);

template <class Indices, class LayoutList, class TensorList>
struct group_types;
template <std::size_t... K, class... Layouts, class... X>
struct group_types<std::index_sequence<K...>, std::tuple<Layouts...>, std::tuple<X...>> {
  using first_t = std::remove_cvref_t<std::tuple_element_t<0, std::tuple<X...>>>;
  using pending = pending_redistribution<typename first_t::value_type, typename first_t::mesh_type,
                                         group_result_t<K, X, Layouts...>...>;
};
}  // namespace detail

namespace detail {
// Forms the group, runs it (Blocking) or issues its first collective, and returns the
// handle whose wait() hands the tensors over.
template <bool Blocking, class... Layouts, class... X>
auto move_group(X&&... xs) {
  using pending = typename group_types<std::index_sequence_for<X...>, std::tuple<Layouts...>,
                                       std::tuple<X...>>::pending;
  auto [mesh, group, extents] =
      make_group<Layouts...>(std::index_sequence_for<X...>{}, std::forward<X>(xs)...);
  if constexpr (Blocking) {
    group->run();
  } else {
    group->start();
  }
  return pending(*mesh, std::move(group), std::move(extents));
}
}  // namespace detail

// Issues the group's first collective now (non-blocking) and returns a handle; wait()
// completes the rest and returns the tensors, a std::tuple, in their new layouts.
template <class... Layouts, sharded_tensor... X>
[[nodiscard]] auto redistribute_async(X&&... xs) {
  static_assert(detail::group_check<std::tuple<Layouts...>, std::tuple<X...>>::reported);
  if constexpr (detail::group_ok<std::tuple<Layouts...>, std::tuple<X...>>) {
    return detail::move_group<false, Layouts...>(std::forward<X>(xs)...);
  }
}

// The same, blocking: the group's collectives in turn, then the tensors (a std::tuple).
template <class... Layouts, sharded_tensor... X>
auto redistribute_all(X&&... xs) {
  static_assert(detail::group_check<std::tuple<Layouts...>, std::tuple<X...>>::reported);
  if constexpr (detail::group_ok<std::tuple<Layouts...>, std::tuple<X...>>) {
    return detail::move_group<true, Layouts...>(std::forward<X>(xs)...).wait();
  }
}

// The fixed-order plan of redistribute<Layout> for tensor type X, at compile time: whether
// it communicates, and an upper bound on what it sends for any extents.
template <sharded_tensor X, class Layout>
inline constexpr transition_plan redistribute_plan =
    fixed_order_plan(X::layout, layout_value_of<typename X::mesh_type, X::dims, Layout>);

// The plan redistribute<Layout>(x) runs: the cheapest for x's extents and mesh.
template <class Layout, sharded_tensor X>
transition_plan redistribute_plan_for(const X& x) {
  return transition_plan_for<X::dims>(
      X::layout, layout_value_of<typename X::mesh_type, X::dims, Layout>, x.extents(), x.mesh());
}

// The whole global tensor on every rank, partial sums added: for checks and small outputs.
template <sharded_tensor X>
std::vector<typename std::remove_cvref_t<X>::value_type> to_global(
    const X& t, source_site at = source_site::current()) {
  using x_t = std::remove_cvref_t<X>;
  const user_call user(at);
  const auto full =
      redistribute_to<replicated_layout(x_t::mesh_type::axis_count)>(t).local_to_host();
  return std::vector<typename x_t::value_type>(full.begin(), full.end());
}

}  // namespace zest
