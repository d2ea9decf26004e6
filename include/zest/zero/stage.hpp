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
//   (replicate <-> partial), so it always arrives partial over the data axes.
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
//                                    parameter not stored as used is gathered per use;
//                                    under hpZ backward gathers secondary -> compute)
//   gradient_reduction               gradient -> kept    (all-reduce, or reduce-scatter)
//   parameter_update                 master -> stored    (stages 1, 2: all-gather the
//                                    updated shards; 0 and 3: nothing)
// which is 2Psi (stages 0-2) and 3Psi (stage 3) elements sent per step and rank, times
// (N_d-1)/N_d (zero_formula in zest/zero/planner.hpp).
//
// Which dim is split is a policy hook (split_first_dim by default); splits are balanced
// blocks (zest/layout/shard.hpp), so uneven extents work.
//
// The data axes are a set. The batch is split over all of them, so a gradient arrives
// partial over each; the stage partitions the states over its shard axes and keeps them
// replicated over its replica axes:
//   zero_stage<3, "dp">                              ZeRO-3 over dp
//   zero_stage<3, "gpu,node">                        ZeRO-3 over both axes at once (one split
//                                                    of m, gpu major: the node all-gather
//                                                    moves the small blocks, see below)
//   zero_stage<3, "dp">::replicated_over<"dp_rep">   HSDP (FSDP2's hybrid sharding): ZeRO-3
//                                                    within dp, DDP across dp_rep
// Under HSDP the kept gradient is split over dp and replicated over dp_rep, so the gradient
// collective is a reduce-scatter over dp and an all-reduce over dp_rep of the shard (the
// cheapest plan over the data axes: zest/layout/cheapest_plan.hpp); the stored parameters'
// all-gathers stay within dp. Per step and rank, with N the shard axes' ranks and R the
// replica axes': the shard axes carry zero_formula's elements for N, the replica axes
// 2 Psi/N (R-1)/R (hsdp_formula in zest/zero/planner.hpp).
//
// ZeRO++ (stage 3) is three more choices of the same kind:
//   ::with_secondary_over<"gpu">     hpZ: a secondary layout split inside the node, from which
//                                    backward gathers (zero_layouts::secondary)
//   ::with_quantized_weights<B>      qwZ: the weight all-gathers on an int8 wire, one fp32
//                                    scale per B elements (zero_layouts::gather_wire)
//   ::with_quantized_gradients<B>    qgZ (stages 1-3): the gradients' reduce-scatter on it,
//                                    as an all-to-all summed in fp32 (gradient_wire)
// (zest/layout/wire.hpp; zeropp_formula in zest/zero/planner.hpp).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/placement.hpp"
#include "zest/layout/step_cost.hpp"
#include "zest/layout/wire.hpp"

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
  // ZeRO++'s hpZ: the secondary copy a stage-3 parameter keeps from its forward gather to its
  // backward one, which then gathers from it (axis_count 0: none, backward gathers the
  // stored shard).
  layout_value secondary{};
  // ZeRO++'s qwZ and qgZ: how the weight gathers (stored or secondary -> compute) and the
  // gradient reduce-scatters travel (zest/layout/wire.hpp; exact unless the stage says).
  wire_format gather_wire{};
  wire_format gradient_wire{};
  constexpr bool operator==(const zero_layouts&) const = default;
};

// The communicating steps of a training step, in order.
// The engine's gradient buckets (zero_options::bucket_elements): a group's gradients move in
// runs of at most this many elements, one collective each.
inline constexpr std::size_t default_bucket_elements = std::size_t{1} << 22;

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

// One phase as a transition; fixed_order_plan(from, to) gives its collectives, `wire` how
// they travel.
struct zero_transfer {
  zero_phase phase = zero_phase::forward_gather;
  layout_value from{};
  layout_value to{};
  bool carries_gradient = false;  // gradient element type, else parameter element type
  wire_format wire{};
};

constexpr zero_transfer transfer_of(const zero_layouts& l, zero_phase p) {
  switch (p) {
    case zero_phase::forward_gather: return {p, l.stored, l.compute, false, l.gather_wire};
    case zero_phase::backward_gather:
      return {p, l.secondary.axis_count != 0 ? l.secondary : l.stored, l.compute, false,
              l.gather_wire};
    case zero_phase::gradient_reduction:
      return {p, l.gradient, l.kept_gradient, true, l.gradient_wire};
    case zero_phase::parameter_update: return {p, l.master, l.stored, false, {}};
  }
  return {};
}

namespace detail {
// The placement of a gradient on the data axes (`mask`), from the parameter's use:
// replicate <-> partial, split stays. Only the data axes are dualised: there the activations
// are split by batch, so every rank's gradient is a summand; on other axes it depends on the
// activations' layout.
constexpr layout_value dual_of_use(layout_value v, unsigned mask) {
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    if ((mask >> a & 1U) == 0) continue;
    auto& p = v.axes[a];
    if (p.kind == placement_kind::replicate) {
      p = axis_placement{placement_kind::partial, 0, 0};
    } else if (p.kind == placement_kind::partial) {
      p = axis_placement{};
    }
  }
  return v;
}

// A list of mesh axis names: one name, or several separated by commas ("gpu,node"); "" is
// the empty list.
constexpr std::size_t axis_list_size(std::string_view s) {
  if (s.empty()) return 0;
  std::size_t n = 1;
  for (char c : s) n += c == ',' ? 1U : 0U;
  return n;
}
// The i-th name (loops, not string_view::find: see docs/design-notes.md, "Compiler notes");
// past the last one, the first.
constexpr std::string_view axis_list_item(std::string_view s, std::size_t i) {
  std::size_t begin = 0;
  for (std::size_t k = 0; k < i; ++k) {
    while (begin < s.size() && s[begin] != ',') ++begin;
    begin = begin < s.size() ? begin + 1 : 0;
  }
  std::size_t end = begin;
  while (end < s.size() && s[end] != ',') ++end;
  return s.substr(begin, end - begin);
}
// Empty names and names given twice make a list ill-formed.
constexpr bool axis_list_well_formed(std::string_view s) {
  const std::size_t n = axis_list_size(s);
  for (std::size_t i = 0; i < n; ++i) {
    if (axis_list_item(s, i).empty()) return false;
    for (std::size_t j = 0; j < i; ++j) {
      if (axis_list_item(s, i) == axis_list_item(s, j)) return false;
    }
  }
  return true;
}
template <fixed_string S>
constexpr auto axis_list_of() {
  std::array<std::string_view, axis_list_size(view_of<S>)> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = axis_list_item(view_of<S>, i);
  return out;
}
// The I-th name of S as a fixed_string (a placement's template argument).
template <fixed_string S, std::size_t I>
constexpr auto axis_list_name() {
  constexpr std::string_view v = axis_list_item(view_of<S>, I);
  fixed_string<v.size() + 1> out;
  for (std::size_t k = 0; k < v.size(); ++k) out.set(k, v[k]);
  return out;
}
// "a" and "b" -> "a,b" (either may be empty).
template <fixed_string A, fixed_string B>
constexpr auto axis_list_join() {
  constexpr std::size_t comma = A.size() != 0 && B.size() != 0 ? 1 : 0;
  fixed_string<A.size() + comma + B.size() + 1> out;
  for (std::size_t k = 0; k < A.size(); ++k) out.set(k, A[k]);
  if (comma) out.set(A.size(), ',');
  for (std::size_t k = 0; k < B.size(); ++k) out.set(A.size() + comma + k, B[k]);
  return out;
}
// Bit a set for each mesh axis a that the list names (names the mesh lacks are left out).
template <class Mesh>
constexpr unsigned axis_mask_of(std::string_view list) {
  unsigned mask = 0;
  for (std::size_t i = 0; i < axis_list_size(list); ++i) {
    const std::size_t a = axis_index_of<Mesh>(axis_list_item(list, i));
    if (a < Mesh::axis_names.size()) mask |= 1U << a;
  }
  return mask;
}
template <class Mesh>
constexpr bool mesh_has_axes(std::string_view list) {
  for (std::size_t i = 0; i < axis_list_size(list); ++i) {
    if (axis_index_of<Mesh>(axis_list_item(list, i)) == Mesh::axis_names.size()) return false;
  }
  return true;
}

// split<D, names of S...> and layout<partial<name>...> over the names of S (at most
// max_axes). Picked from a list by the count, not deduced from an index sequence: nvcc's
// front end does not deduce split<D, name<S, I>()...> (docs/design-notes.md, "Compiler
// notes").
template <fixed_string S, std::size_t I>
inline constexpr auto axis_list_name_v = axis_list_name<S, I>();
template <char D, fixed_string S>
using split_over = std::tuple_element_t<
    axis_list_size(view_of<S>),
    std::tuple<split<D>, split<D, axis_list_name_v<S, 0>>,
               split<D, axis_list_name_v<S, 0>, axis_list_name_v<S, 1>>,
               split<D, axis_list_name_v<S, 0>, axis_list_name_v<S, 1>, axis_list_name_v<S, 2>>,
               split<D, axis_list_name_v<S, 0>, axis_list_name_v<S, 1>, axis_list_name_v<S, 2>,
                     axis_list_name_v<S, 3>>,
               split<D, axis_list_name_v<S, 0>, axis_list_name_v<S, 1>, axis_list_name_v<S, 2>,
                     axis_list_name_v<S, 3>, axis_list_name_v<S, 4>>,
               split<D, axis_list_name_v<S, 0>, axis_list_name_v<S, 1>, axis_list_name_v<S, 2>,
                     axis_list_name_v<S, 3>, axis_list_name_v<S, 4>, axis_list_name_v<S, 5>>>>;
template <fixed_string S, std::size_t I>
using partial_at = partial<axis_list_name_v<S, I>>;
template <fixed_string S>
using partial_over = std::tuple_element_t<
    axis_list_size(view_of<S>),
    std::tuple<layout<>, layout<partial_at<S, 0>>, layout<partial_at<S, 0>, partial_at<S, 1>>,
               layout<partial_at<S, 0>, partial_at<S, 1>, partial_at<S, 2>>,
               layout<partial_at<S, 0>, partial_at<S, 1>, partial_at<S, 2>, partial_at<S, 3>>,
               layout<partial_at<S, 0>, partial_at<S, 1>, partial_at<S, 2>, partial_at<S, 3>,
                      partial_at<S, 4>>,
               layout<partial_at<S, 0>, partial_at<S, 1>, partial_at<S, 2>, partial_at<S, 3>,
                      partial_at<S, 4>, partial_at<S, 5>>>>;
static_assert(max_axes == 6, "zest: split_over and partial_over list max_axes names");

}  // namespace detail

namespace zero_error {
using detail::always_false;

template <class Stage, class Mesh>
struct no_data_axis {
  static_assert(
      always_false<Stage>,
      "zest zero_stage: the mesh lacks an axis that the stage names (its data axes, or the "
      "replica axes of replicated_over). Fix: name the mesh's axes, zero_stage<K, \"dp\"> or "
      "zero_stage<K, \"dp\">::replicated_over<\"dp_rep\">, or add the axis to the mesh "
      "(stage and mesh are shown above).");
};
template <class Stage>
struct bad_secondary_axes {
  static_assert(always_false<Stage>,
                "zest zero_stage: hpZ's secondary copy (with_secondary_over) is split over some "
                "of a stage-3 parameter's shard axes (not all of them): the ones inside a "
                "node. Fix: zero_stage<3, \"gpu,node\">::with_secondary_over<\"gpu\">.");
};
template <class Stage>
struct bad_axis_list {
  static_assert(always_false<Stage>,
                "zest zero_stage: the data axes are one or more mesh axis names separated by "
                "commas, each once, and a replica axis is none of them. Fix: e.g. "
                "zero_stage<3, \"dp\">, zero_stage<3, \"gpu,node\"> or "
                "zero_stage<3, \"dp\">::replicated_over<\"dp_rep\">.");
};
template <class Stage>
struct quantized_weights_need_stage_3 {
  static_assert(always_false<Stage>,
                "zest zero_stage: ZeRO++'s qwZ quantizes the all-gathers of a stage-3 "
                "parameter's weights; under stages 0-2 weights are not gathered for use. Fix: "
                "zero_stage<3, ...>::with_quantized_weights<B>, or leave it out.");
};
template <class Stage>
struct quantized_gradients_need_a_reduce_scatter {
  static_assert(always_false<Stage>,
                "zest zero_stage: ZeRO++'s qgZ quantizes the gradients' reduce-scatter, which "
                "stages 1-3 run; stage 0 all-reduces them (exact). Fix: zero_stage<1>, <2> or "
                "<3> ::with_quantized_gradients<B>, or leave it out.");
};
// A block size of ZeRO++'s int8 wires, checked.
template <std::uint32_t B>
struct wire_block {
  static_assert(B > 0,
                "zest zero_stage: an int8 wire's block holds at least one element (one fp32 "
                "scale per block). Fix: with_quantized_weights<256> or "
                "with_quantized_gradients<256> (256 by default), or leave it out.");
  static constexpr std::uint32_t value = B;
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

// ZeRO stage `Stage` over the data-parallel mesh axes `DataAxis` (one name, or several
// separated by commas: the states are split over all of them), replicated over
// `ReplicaAxes` (none by default; replicated_over below).
//
//   using z3 = zest::zero_stage<3>;                        // over "dp", first dim split
//   using stored = z3::stored_layout<"mh">;                 // layout<split<'m', "dp">>
//   constexpr auto l = z3::layouts<zest::mesh<"dp">, "mh">; // zero_layouts, normalised
//   using hsdp = z3::replicated_over<"dp_rep">;             // ZeRO-3 in dp, DDP over dp_rep
template <int Stage, fixed_string DataAxis = "dp", zero_split_rule SplitRule = split_first_dim,
          fixed_string ReplicaAxes = "", fixed_string SecondaryAxes = "",
          std::uint32_t WeightBlock = 0, std::uint32_t GradientBlock = 0>
struct zero_stage {
  static_assert(
      Stage >= 0 && Stage <= 3,
      "zest zero_stage: ZeRO has stages 0 (DDP), 1 (optimizer state), 2 (+ gradients) and "
      "3 (+ parameters). Fix: zero_stage<0>, <1>, <2> or <3>.");

  using zest_zero_stage_tag = void;  // opts into zero_stage_policy
  static constexpr int stage = Stage;
  using split_rule = SplitRule;
  // The same stage with another split rule (for parameters whose first dim is taken).
  template <zero_split_rule R>
  using with_split_rule =
      zero_stage<Stage, DataAxis, R, ReplicaAxes, SecondaryAxes, WeightBlock, GradientBlock>;
  // The same stage, its states also replicated over the axes R (hybrid sharding): the batch
  // is split over them too, and their gradient sums are all-reduced.
  template <fixed_string R>
  using replicated_over =
      zero_stage<Stage, DataAxis, SplitRule, R, SecondaryAxes, WeightBlock, GradientBlock>;
  // ZeRO++'s hpZ (stage 3): from its forward gather to its backward one a parameter keeps a
  // secondary copy split over the axes S only (some of DataAxis: the ones inside a node), cut
  // from the gathered value without communication; backward gathers it over S alone.
  template <fixed_string S>
  using with_secondary_over =
      zero_stage<Stage, DataAxis, SplitRule, ReplicaAxes, S, WeightBlock, GradientBlock>;
  // ZeRO++'s qwZ (stage 3): the weight all-gathers, forward and backward, travel as int8 with
  // one fp32 scale per B elements (zest/layout/wire.hpp): about a quarter of fp32's bytes.
  // The stored shards and the optimizer stay exact; every rank computes with the same
  // decoded weights.
  template <std::uint32_t B = 256>
  using with_quantized_weights = zero_stage<Stage, DataAxis, SplitRule, ReplicaAxes, SecondaryAxes,
                                            zero_error::wire_block<B>::value, GradientBlock>;
  // ZeRO++'s qgZ (stages 1-3): the gradients' reduce-scatters become an all-to-all of int8
  // blocks (one fp32 scale per B elements), decoded and summed in fp32 by the receiver.
  // Sums over replica axes (HSDP's all-reduce) stay exact.
  template <std::uint32_t B = 256>
  using with_quantized_gradients =
      zero_stage<Stage, DataAxis, SplitRule, ReplicaAxes, SecondaryAxes, WeightBlock,
                 zero_error::wire_block<B>::value>;
  static constexpr wire_format gather_wire = int8_all_gathers(WeightBlock);
  static constexpr wire_format gradient_wire = int8_reduce_scatters(GradientBlock);

  // The axes the stage partitions over, those it replicates over, and both: the axes the
  // batch is split over ("data axes").
  static constexpr auto shard_axes = detail::axis_list_of<DataAxis>();
  static constexpr auto replica_axes = detail::axis_list_of<ReplicaAxes>();
  static constexpr fixed_string data_axes_list = detail::axis_list_join<DataAxis, ReplicaAxes>();
  static constexpr auto data_axes = detail::axis_list_of<data_axes_list>();
  static constexpr bool well_formed =
      !shard_axes.empty() && detail::axis_list_well_formed(view_of<data_axes_list>);
  static constexpr auto secondary_axes = detail::axis_list_of<SecondaryAxes>();
  static constexpr bool hierarchical = !secondary_axes.empty();
  static constexpr bool secondary_well_formed() {
    // Some of the shard axes, not all (that secondary would be the stored shard itself).
    bool ok =
        !hierarchical || (Stage == 3 && detail::axis_list_well_formed(view_of<SecondaryAxes>) &&
                          secondary_axes.size() < shard_axes.size());
    for (std::string_view a : secondary_axes) {
      bool found = false;
      for (std::string_view d : shard_axes) found = found || a == d;
      ok = ok && found;
    }
    return ok;
  }

  // What the stage partitions over its shard axes (ZeRO's P_os, P_g, P_p).
  static constexpr bool partitions_optimizer_state = Stage >= 1;
  static constexpr bool partitions_gradients = Stage >= 2;
  static constexpr bool partitions_parameters = Stage >= 3;

  // The dim of a parameter with dims Dims that is split over the shard axes.
  template <fixed_string Dims>
  static constexpr char split_dim = SplitRule::dim_index(view_of<Dims>) < Dims.size()
                                        ? Dims[SplitRule::dim_index(view_of<Dims>)]
                                        : Dims[0];

  // The layouts, as types a tensor can be declared with.
  template <fixed_string Dims>
  using sharded_layout = layout<detail::split_over<split_dim<Dims>, DataAxis>>;
  template <fixed_string Dims>
  using stored_layout = std::conditional_t<partitions_parameters, sharded_layout<Dims>, layout<>>;
  template <fixed_string Dims>
  using compute_layout = layout<>;
  template <fixed_string Dims>
  using gradient_layout = detail::partial_over<data_axes_list>;
  template <fixed_string Dims>
  using kept_gradient_layout =
      std::conditional_t<partitions_optimizer_state, sharded_layout<Dims>, layout<>>;
  template <fixed_string Dims>
  using gradient_buffer_layout = std::conditional_t<
      partitions_gradients, sharded_layout<Dims>,
      std::conditional_t<partitions_optimizer_state, gradient_layout<Dims>, layout<>>>;
  template <fixed_string Dims>
  using optimizer_state_layout =
      std::conditional_t<partitions_optimizer_state, sharded_layout<Dims>, layout<>>;
  template <fixed_string Dims>
  using master_layout = optimizer_state_layout<Dims>;
  // hpZ's secondary copy (the stored layout where there is none).
  template <fixed_string Dims>
  using secondary_layout =
      std::conditional_t<hierarchical, layout<detail::split_over<split_dim<Dims>, SecondaryAxes>>,
                         stored_layout<Dims>>;

  // The data axes of Mesh as a mask (bit a for mesh axis a): all of them, the shard axes
  // and the replica axes.
  template <class Mesh>
  static constexpr unsigned data_mask = detail::axis_mask_of<Mesh>(view_of<data_axes_list>);
  template <class Mesh>
  static constexpr unsigned shard_mask = detail::axis_mask_of<Mesh>(view_of<DataAxis>);
  template <class Mesh>
  static constexpr unsigned replica_mask = detail::axis_mask_of<Mesh>(view_of<ReplicaAxes>);

  // The same layouts as values, normalised against Mesh (usable at compile and run time).
  template <class Mesh, fixed_string Dims>
  static constexpr zero_layouts layouts_for() {
    if constexpr (!well_formed) {
      (void)zero_error::bad_axis_list<zero_stage>{};
      return {};
    } else if constexpr (!secondary_well_formed()) {
      (void)zero_error::bad_secondary_axes<zero_stage>{};
      return {};
    } else if constexpr (WeightBlock != 0 && Stage != 3) {
      (void)zero_error::quantized_weights_need_stage_3<zero_stage>{};
      return {};
    } else if constexpr (GradientBlock != 0 && Stage == 0) {
      (void)zero_error::quantized_gradients_need_a_reduce_scatter<zero_stage>{};
      return {};
    } else if constexpr (Dims.size() == 0) {
      (void)zero_error::scalar_parameter<zero_stage>{};
      return {};
    } else if constexpr (SplitRule::dim_index(view_of<Dims>) >= Dims.size()) {
      (void)zero_error::split_dim_out_of_range<zero_stage, Dims>{};
      return {};
    } else if constexpr (!detail::mesh_has_axes<Mesh>(view_of<data_axes_list>)) {
      (void)zero_error::no_data_axis<zero_stage, Mesh>{};
      return {};
    } else {
      // The gradient layout is not a free choice: autodiff makes it the dual of the use.
      static_assert(
          layout_value_of<Mesh, Dims, gradient_layout<Dims>> ==
          detail::dual_of_use(layout_value_of<Mesh, Dims, compute_layout<Dims>>, data_mask<Mesh>));
      zero_layouts l;
      l.stored = layout_value_of<Mesh, Dims, stored_layout<Dims>>;
      l.compute = layout_value_of<Mesh, Dims, compute_layout<Dims>>;
      l.gradient = layout_value_of<Mesh, Dims, gradient_layout<Dims>>;
      l.kept_gradient = layout_value_of<Mesh, Dims, kept_gradient_layout<Dims>>;
      l.gradient_buffer = layout_value_of<Mesh, Dims, gradient_buffer_layout<Dims>>;
      l.optimizer_state = layout_value_of<Mesh, Dims, optimizer_state_layout<Dims>>;
      l.master = layout_value_of<Mesh, Dims, master_layout<Dims>>;
      if constexpr (hierarchical) l.secondary = layout_value_of<Mesh, Dims, secondary_layout<Dims>>;
      l.gather_wire = gather_wire;
      l.gradient_wire = gradient_wire;
      return l;
    }
  }
  template <class Mesh, fixed_string Dims>
  static constexpr zero_layouts layouts = layouts_for<Mesh, Dims>();
};

// The shape a parameter's ZeRO transitions are planned on (by the engine and the planner
// alike): its dims and extents on the mesh's sizes, an element over a replica axis priced
// 1 + replica_axis_penalty times. Hybrid sharding's replica axes are the ones across nodes;
// among plans of equal bytes (stage 0's all-reduce over both axes) the search then reduces
// over the shard axes first and sends the least over the replica axes.
inline constexpr std::uint8_t replica_axis_penalty = 3;
template <class Dims, class Extents, class Sizes>
constexpr transition_shape zero_transition_shape(const Dims& dims, const Extents& extents,
                                                 const Sizes& sizes, unsigned replica_mask) {
  transition_shape s = make_transition_shape(dims, extents, sizes);
  for (std::size_t a = 0; a < s.axis_count; ++a) {
    if ((replica_mask >> a & 1U) != 0) s.penalty[a] = replica_axis_penalty;
  }
  return s;
}

// A nested tag, not a partial specialisation on zero_stage<K, A, R>: nvcc's front end does not
// match those when an argument is of class type (docs/design-notes.md).
template <class S>
inline constexpr bool is_zero_stage_v = requires {
  typename S::zest_zero_stage_tag;
};
template <class S>
concept zero_stage_policy = is_zero_stage_v<S>;

// Run-time stage -> compile-time policy: calls f(zero_stage<K, DataAxis, SplitRule,
// ReplicaAxes>{}).
//   zest::with_zero_stage(flags.zero, [&](auto stage) { train<decltype(stage)>(...); });
template <fixed_string DataAxis = "dp", zero_split_rule SplitRule = split_first_dim,
          fixed_string ReplicaAxes = "", class F>
decltype(auto) with_zero_stage(int stage, F&& f) {
  switch (stage) {
    case 0: return std::forward<F>(f)(zero_stage<0, DataAxis, SplitRule, ReplicaAxes>{});
    case 1: return std::forward<F>(f)(zero_stage<1, DataAxis, SplitRule, ReplicaAxes>{});
    case 2: return std::forward<F>(f)(zero_stage<2, DataAxis, SplitRule, ReplicaAxes>{});
    case 3: return std::forward<F>(f)(zero_stage<3, DataAxis, SplitRule, ReplicaAxes>{});
    default: break;
  }
  throw shape_error(detail::message("zest: with_zero_stage: stage ", stage,
                                    " does not exist; ZeRO has stages 0-3"));
}

}  // namespace zest
