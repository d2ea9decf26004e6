// zest/zero/stage.hpp — ZeRO stages 0-3 as layout policies.
//
// A stage is nothing but a choice of layouts for a parameter's model states; the
// collectives of a training step follow from the transitions between them, as for any
// other tensor (a layout is a type, a collective is a consequence of two layouts). For a
// parameter "mh" on mesh<"dp"> (first dim split, the default):
//
//   stage  stored       compute    gradient     kept grad    grad buffer  optimizer, master
//   0      replicate    replicate  partial(dp)  replicate    replicate    replicate
//   1      replicate    replicate  partial(dp)  split(m:dp)  partial(dp)  split(m:dp)
//   2      replicate    replicate  partial(dp)  split(m:dp)  split(m:dp)  split(m:dp)
//   3      split(m:dp)  replicate  partial(dp)  split(m:dp)  split(m:dp)  split(m:dp)
//
// - compute is what an einsum uses; the gradient backward produces is its dual
//   (replicate <-> partial), so it always arrives partial over the data axis.
// - kept gradient: what the gradient collective leaves, the layout the optimizer reads.
//   partial -> replicate is an all-reduce (stage 0), partial -> split a reduce-scatter.
// - gradient buffer: what the gradient costs in memory over a step. Stage 1 partitions only
//   the optimizer state: backward still fills a full-size gradient on every rank (a partial
//   summand), which lives until the step; stage 2 keeps only its own shard (buckets are
//   reduce-scattered during backward and freed): with 16-bit parameters and gradients,
//   4Psi + K Psi/N_d bytes per rank under stage 1 against 2Psi + (2+K)Psi/N_d under stage 2
//   (zero_formula in zest/zero/planner.hpp).
// - optimizer state (Adam m, v) and fp32 master parameters share a layout: the optimizer
//   updates the shard it owns.
//
// The steps of a training step (zero_phase) are transitions between these layouts:
//   forward_gather, backward_gather  stored -> compute   (stage 3: an all-gather each; a
//                                    parameter not stored as used is gathered per use)
//   gradient_reduction               gradient -> kept    (all-reduce, or reduce-scatter)
//   parameter_update                 master -> stored    (stages 1, 2: all-gather the
//                                    updated shards; 0 and 3: nothing)
// which is 2Psi (stages 0-2) and 3Psi (stage 3) elements sent per step and rank, times
// (N_d-1)/N_d (zero_formula in zest/zero/planner.hpp).
//
// Which dim is split is a policy hook (split_first_dim by default); splits are balanced
// blocks (zest/layout/shard.hpp), so uneven extents work.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/placement.hpp"

namespace zest {

// Split rules: which dim (an index into the parameter's dims) a partitioning stage splits.
// Usable at compile time (layout types) and at run time.
struct split_first_dim {
  static constexpr std::size_t dim_index(std::string_view) { return 0; }
};
// E.g. for weights stored [out, in] whose first dim is small on some layers.
struct split_last_dim {
  static constexpr std::size_t dim_index(std::string_view dims) {
    return dims.empty() ? 0 : dims.size() - 1;
  }
};

// A dim chosen by its letter, e.g. split_dim_named<'m'> for expert weights "emh" whose
// expert dim is already split over an expert axis (a dims string without D picks dim 0).
template <char D>
struct split_dim_named {
  static constexpr std::size_t dim_index(std::string_view dims) {
    const std::size_t i = dims.find(D);
    return i == std::string_view::npos ? 0 : i;
  }
};

template <class R>
concept zero_split_rule = requires(std::string_view dims) {
  { R::dim_index(dims) } -> std::convertible_to<std::size_t>;
};

// The layouts of one parameter's model states under a stage, normalised against a mesh.
struct zero_layouts {
  layout_value stored{};           // the parameter between uses
  layout_value compute{};          // the parameter as an einsum uses it
  layout_value gradient{};         // as backward produces it: the dual of compute
  layout_value kept_gradient{};    // after the gradient collective; what the optimizer reads
  layout_value gradient_buffer{};  // what the gradient occupies in memory over a step
  layout_value optimizer_state{};  // Adam's m and v
  layout_value master{};           // fp32 master parameters
  constexpr bool operator==(const zero_layouts&) const = default;
};

// The communicating steps of a training step, in order.
enum class zero_phase : std::uint8_t {
  forward_gather,
  backward_gather,
  gradient_reduction,
  parameter_update
};
inline constexpr std::array<zero_phase, 4> zero_phases{
    zero_phase::forward_gather, zero_phase::backward_gather, zero_phase::gradient_reduction,
    zero_phase::parameter_update};

constexpr std::string_view name_of(zero_phase p) {
  switch (p) {
    case zero_phase::forward_gather: return "forward_gather";
    case zero_phase::backward_gather: return "backward_gather";
    case zero_phase::gradient_reduction: return "gradient_reduction";
    case zero_phase::parameter_update: return "parameter_update";
  }
  return "?";
}

// One phase as a transition; plan_transition(from, to) gives its collectives.
struct zero_transfer {
  zero_phase phase = zero_phase::forward_gather;
  layout_value from{};
  layout_value to{};
  bool carries_gradient = false;  // gradient element type, else parameter element type
};

constexpr zero_transfer transfer_of(const zero_layouts& l, zero_phase p) {
  switch (p) {
    case zero_phase::forward_gather:
    case zero_phase::backward_gather: return {p, l.stored, l.compute, false};
    case zero_phase::gradient_reduction: return {p, l.gradient, l.kept_gradient, true};
    case zero_phase::parameter_update: return {p, l.master, l.stored, false};
  }
  return {};
}

namespace detail {
// The placement of a gradient on axis `a`, from the parameter's use: replicate <-> partial,
// split stays. Only the data axis is dualised: there the activations are split by batch, so
// every rank's gradient is a summand; on other axes it depends on the activations' layout.
constexpr layout_value dual_of_use(layout_value v, std::size_t a) {
  auto& p = v.axes[a];
  if (p.kind == placement_kind::replicate) {
    p = axis_placement{placement_kind::partial, 0, 0};
  } else if (p.kind == placement_kind::partial) {
    p = axis_placement{};
  }
  return v;
}

template <class Mesh>
constexpr std::size_t axis_index_of(std::string_view axis) {
  for (std::size_t a = 0; a < Mesh::axis_names.size(); ++a) {
    if (Mesh::axis_names[a] == axis) return a;
  }
  return Mesh::axis_names.size();
}

}  // namespace detail

namespace zero_error {
template <class>
inline constexpr bool always_false = false;

template <class Stage, class Mesh>
struct no_data_axis {
  static_assert(
      always_false<Stage>,
      "zest zero_stage: the mesh has no axis of the stage's data-parallel name. Fix: name "
      "one of the mesh's axes, zero_stage<K, \"dp\">, or add that axis to the mesh "
      "(stage and mesh are shown above).");
};
template <class Stage, fixed_string Dims>
struct split_dim_out_of_range {
  static_assert(always_false<Stage>,
                "zest zero_stage: the split rule chose a dim index the parameter does not have. "
                "Fix: return an index below the number of dims from the rule's dim_index(dims).");
};
template <class Stage>
struct scalar_parameter {
  static_assert(always_false<Stage>,
                "zest zero_stage: a parameter needs at least one dim to be partitioned. Fix: give "
                "it a dim of extent 1, e.g. \"a\".");
};
}  // namespace zero_error

// ZeRO stage `Stage` over the data-parallel mesh axis `DataAxis`.
//
//   using z3 = zest::zero_stage<3>;                        // over "dp", first dim split
//   using stored = z3::stored_layout<"mh">;                 // layout<split<'m', "dp">>
//   constexpr auto l = z3::layouts<zest::mesh<"dp">, "mh">; // zero_layouts, normalised
template <int Stage, fixed_string DataAxis = "dp", zero_split_rule SplitRule = split_first_dim>
struct zero_stage {
  static_assert(
      Stage >= 0 && Stage <= 3,
      "zest zero_stage: ZeRO has stages 0 (DDP), 1 (optimizer state), 2 (+ gradients) and "
      "3 (+ parameters). Fix: zero_stage<0>, <1>, <2> or <3>.");

  using zest_zero_stage_tag = void;  // opts into zero_stage_policy
  static constexpr int stage = Stage;
  static constexpr std::string_view data_axis = view_of<DataAxis>;
  using split_rule = SplitRule;
  // The same stage with another split rule (for parameters whose first dim is taken).
  template <zero_split_rule R>
  using with_split_rule = zero_stage<Stage, DataAxis, R>;

  // What the stage partitions over the data axis (ZeRO's P_os, P_g, P_p).
  static constexpr bool partitions_optimizer_state = Stage >= 1;
  static constexpr bool partitions_gradients = Stage >= 2;
  static constexpr bool partitions_parameters = Stage >= 3;

  // The dim of a parameter with dims Dims that is split over the data axis.
  template <fixed_string Dims>
  static constexpr char split_dim = SplitRule::dim_index(view_of<Dims>) < Dims.size()
                                        ? Dims[SplitRule::dim_index(view_of<Dims>)]
                                        : Dims[0];

  // The layouts, as types a tensor can be declared with.
  template <fixed_string Dims>
  using sharded_layout = layout<split<split_dim<Dims>, DataAxis>>;
  template <fixed_string Dims>
  using stored_layout = std::conditional_t<partitions_parameters, sharded_layout<Dims>, layout<>>;
  template <fixed_string Dims>
  using compute_layout = layout<>;
  template <fixed_string Dims>
  using gradient_layout = layout<partial<DataAxis>>;
  template <fixed_string Dims>
  using kept_gradient_layout =
      std::conditional_t<partitions_optimizer_state, sharded_layout<Dims>, layout<>>;
  template <fixed_string Dims>
  using gradient_buffer_layout = std::conditional_t<
      partitions_gradients, sharded_layout<Dims>,
      std::conditional_t<partitions_optimizer_state, layout<partial<DataAxis>>, layout<>>>;
  template <fixed_string Dims>
  using optimizer_state_layout =
      std::conditional_t<partitions_optimizer_state, sharded_layout<Dims>, layout<>>;
  template <fixed_string Dims>
  using master_layout = optimizer_state_layout<Dims>;

  // The same layouts as values, normalised against Mesh (usable at compile and run time).
  template <class Mesh, fixed_string Dims>
  static constexpr zero_layouts layouts_for() {
    if constexpr (Dims.size() == 0) {
      (void)zero_error::scalar_parameter<zero_stage>{};
      return {};
    } else if constexpr (SplitRule::dim_index(view_of<Dims>) >= Dims.size()) {
      (void)zero_error::split_dim_out_of_range<zero_stage, Dims>{};
      return {};
    } else if constexpr (detail::axis_index_of<Mesh>(view_of<DataAxis>) ==
                         Mesh::axis_names.size()) {
      (void)zero_error::no_data_axis<zero_stage, Mesh>{};
      return {};
    } else {
      // The gradient layout is not a free choice: autodiff makes it the dual of the use.
      static_assert(layout_value_of<Mesh, Dims, gradient_layout<Dims>> ==
                    detail::dual_of_use(layout_value_of<Mesh, Dims, compute_layout<Dims>>,
                                        detail::axis_index_of<Mesh>(view_of<DataAxis>)));
      zero_layouts l;
      l.stored = layout_value_of<Mesh, Dims, stored_layout<Dims>>;
      l.compute = layout_value_of<Mesh, Dims, compute_layout<Dims>>;
      l.gradient = layout_value_of<Mesh, Dims, gradient_layout<Dims>>;
      l.kept_gradient = layout_value_of<Mesh, Dims, kept_gradient_layout<Dims>>;
      l.gradient_buffer = layout_value_of<Mesh, Dims, gradient_buffer_layout<Dims>>;
      l.optimizer_state = layout_value_of<Mesh, Dims, optimizer_state_layout<Dims>>;
      l.master = layout_value_of<Mesh, Dims, master_layout<Dims>>;
      return l;
    }
  }
  template <class Mesh, fixed_string Dims>
  static constexpr zero_layouts layouts = layouts_for<Mesh, Dims>();
};

// A nested tag, not a partial specialisation on zero_stage<K, A, R>: nvcc's front end does not
// match those when an argument is of class type (docs/design-notes.md).
template <class S>
inline constexpr bool is_zero_stage_v = requires {
  typename S::zest_zero_stage_tag;
};
template <class S>
concept zero_stage_policy = is_zero_stage_v<S>;

// Run-time stage -> compile-time policy: calls f(zero_stage<K, DataAxis, SplitRule>{}).
//   zest::with_zero_stage(flags.zero, [&](auto stage) { train<decltype(stage)>(...); });
template <fixed_string DataAxis = "dp", zero_split_rule SplitRule = split_first_dim, class F>
decltype(auto) with_zero_stage(int stage, F&& f) {
  switch (stage) {
    case 0: return std::forward<F>(f)(zero_stage<0, DataAxis, SplitRule>{});
    case 1: return std::forward<F>(f)(zero_stage<1, DataAxis, SplitRule>{});
    case 2: return std::forward<F>(f)(zero_stage<2, DataAxis, SplitRule>{});
    case 3: return std::forward<F>(f)(zero_stage<3, DataAxis, SplitRule>{});
    default: break;
  }
  throw shape_error(detail::message("zest: with_zero_stage: stage ", stage,
                                    " does not exist; ZeRO has stages 0-3"));
}

}  // namespace zest
