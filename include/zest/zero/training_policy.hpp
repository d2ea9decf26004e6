// zest/zero/training_policy.hpp — what a model is built with: mesh, ZeRO stage, precision.
//
//   using mesh_t = zest::mesh<"dp", "tp">;
//   using policy = zest::training_policy<mesh_t, zest::zero_stage<3>, zest::bfloat16>;
//   policy::data_mask;   // 0b01: the mesh axes the batch is split over (bit a: axis a)
//   policy::shard_mask;  // 0b01: those the stage partitions over (the rest: replica axes)
//   policy::has_master;  // true: fp32 master weights beside the 16-bit parameters
//
// Besides the data axes, a mesh axis can have a role that the layers read from the policy:
// the tensor-parallel axis (Megatron: the layers split their weights over it), the
// sequence-parallel axis (Ulysses' attention) and the expert axis (GShard's experts). They
// are named in the fourth argument; by default they are the axes named "tp", "sp" and "ep",
// each where the mesh has one:
//
//   using m = zest::mesh<"data", "model">;
//   zest::training_policy<m, zest::zero_stage<3, "data">, float, zest::axis_roles<"model">>
//   policy::tensor_axis;   // 1: "model" splits the weights; no sequence or expert axis
//
// Layers (zest/nn/) and parameters (zest/zero/parameter.hpp) take a policy as their first
// template parameter; a custom layer composes the same way.
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "zest/core/bfloat16.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/float16.hpp"
#include "zest/layout/layout.hpp"
#include "zest/zero/stage.hpp"

namespace zest {

// The mesh axes with a role in the layers, by name ("": none): the tensor-parallel axis, the
// sequence-parallel axis and the expert axis. The defaults are the conventional names; an
// axis named here that the mesh lacks means no such role, except where a role is named
// explicitly (any name other than the default), which the policy checks.
template <fixed_string Tensor = "tp", fixed_string Sequence = "sp", fixed_string Expert = "ep">
struct axis_roles {
  static constexpr fixed_string tensor = Tensor;
  static constexpr fixed_string sequence = Sequence;
  static constexpr fixed_string expert = Expert;
};

namespace detail {
template <class R>
concept axis_roles_type = requires {
  R::tensor;
  R::sequence;
  R::expert;
};
// Axis `name` of Mesh, or Mesh::axis_count when it has none ("" included).
template <class Mesh>
constexpr std::size_t role_axis(std::string_view name) {
  return name.empty() ? Mesh::axis_count : axis_index_of<Mesh>(name);
}
// Whether a role named `name` is fine on Mesh: the default name (which may be absent), ""
// (no such role) or an axis of the mesh.
template <class Mesh>
constexpr bool role_named_well(std::string_view name, std::string_view conventional) {
  return name.empty() || name == conventional || role_axis<Mesh>(name) < Mesh::axis_count;
}
}  // namespace detail

// The choices a model is built with: its mesh, ZeRO stage and storage precision. Layers take
// it as their first template parameter, so a custom layer composes the same way.
//   Param = float:              fp32 parameters and gradients, the parameters are the master
//   Param = bfloat16 / float16: parameters and gradients stored and communicated in 16 bits,
//                               fp32 master weights and Adam states (float16 with dynamic
//                               loss scaling)
//   Roles:                      the axes with a role in the layers (axis_roles above)
template <class Mesh, zero_stage_policy Stage = zero_stage<0>, class Param = float,
          detail::axis_roles_type Roles = axis_roles<>>
struct training_policy {
  static constexpr bool valid_precision = std::is_same_v<Param, float> ||
                                          std::is_same_v<Param, bfloat16> ||
                                          std::is_same_v<Param, float16>;
  static_assert(valid_precision,
                "zest training_policy: parameters are stored as float, zest::bfloat16 or "
                "zest::float16. Fix: choose one of those as the third argument.");

  using mesh_type = Mesh;
  using stage = Stage;
  using param_type = Param;
  using grad_type = Param;
  static constexpr bool has_master = !std::is_same_v<Param, float>;
  static constexpr bool loss_scaling = std::is_same_v<Param, float16>;
  static_assert(detail::mesh_has_axes<Mesh>(view_of<Stage::data_axes_list>),
                "zest training_policy: the mesh lacks an axis that the stage names as a data "
                "or replica axis. Fix: zero_stage<K, \"name\"> (and replicated_over<\"name\">) "
                "with the mesh's axis names.");
  // The mesh axes the batch is split over, those the stage partitions over and those it
  // replicates over (bit a for mesh axis a).
  static constexpr unsigned data_mask = Stage::template data_mask<Mesh>;
  static constexpr unsigned shard_mask = Stage::template shard_mask<Mesh>;
  static constexpr unsigned replica_mask = Stage::template replica_mask<Mesh>;

  // The axes with a role in the layers (Mesh::axis_count: none), and their names.
  using roles = Roles;
  static constexpr std::size_t tensor_axis = detail::role_axis<Mesh>(view_of<Roles::tensor>);
  static constexpr std::size_t sequence_axis = detail::role_axis<Mesh>(view_of<Roles::sequence>);
  static constexpr std::size_t expert_axis = detail::role_axis<Mesh>(view_of<Roles::expert>);
  static constexpr bool has_tensor_axis = tensor_axis < Mesh::axis_count;
  static constexpr bool has_sequence_axis = sequence_axis < Mesh::axis_count;
  static constexpr bool has_expert_axis = expert_axis < Mesh::axis_count;
  static_assert(detail::role_named_well<Mesh>(view_of<Roles::tensor>, "tp") &&
                    detail::role_named_well<Mesh>(view_of<Roles::sequence>, "sp") &&
                    detail::role_named_well<Mesh>(view_of<Roles::expert>, "ep"),
                "zest training_policy: axis_roles names an axis that the mesh lacks. Fix: name "
                "the mesh's axes in axis_roles<tensor, sequence, expert>, or "
                " for none.");
  static_assert((!has_tensor_axis || ((data_mask >> tensor_axis) & 1U) == 0) &&
                    (!has_sequence_axis || ((data_mask >> sequence_axis) & 1U) == 0),
                "zest training_policy: the tensor- or sequence-parallel axis is also a data "
                "axis of the stage. Fix: give each mesh axis one role.");
  static_assert(!has_tensor_axis || !has_sequence_axis || tensor_axis != sequence_axis,
                "zest training_policy: one axis is both the tensor- and the sequence-parallel "
                "axis. Fix: give each mesh axis one role.");
};

template <class P>
concept training_policy_type = requires {
  typename P::mesh_type;
  typename P::stage;
  typename P::param_type;
  P::data_mask;
};

}  // namespace zest
