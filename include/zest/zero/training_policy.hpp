// zest/zero/training_policy.hpp — what a model is built with: mesh, ZeRO stage, precision.
//
//   using mesh_t = zest::mesh<"dp", "tp">;
//   using policy = zest::training_policy<mesh_t, zest::zero_stage<3>, zest::bfloat16>;
//   policy::data_mask;   // 0b01: the mesh axes the batch is split over (bit a: axis a)
//   policy::shard_mask;  // 0b01: those the stage partitions over (the rest: replica axes)
//   policy::has_master;  // true: fp32 master weights beside the 16-bit parameters
//
// Layers (zest/nn/) and parameters (zest/zero/parameter.hpp) take a policy as their first
// template parameter; a custom layer composes the same way.
#pragma once

#include <cstddef>
#include <type_traits>

#include "zest/core/bfloat16.hpp"
#include "zest/core/float16.hpp"
#include "zest/zero/stage.hpp"

namespace zest {

// The choices a model is built with: its mesh, ZeRO stage and storage precision. Layers take
// it as their first template parameter, so a custom layer composes the same way.
//   Param = float:              fp32 parameters and gradients, the parameters are the master
//   Param = bfloat16 / float16: parameters and gradients stored and communicated in 16 bits,
//                               fp32 master weights and Adam states (float16 with dynamic
//                               loss scaling)
template <class Mesh, zero_stage_policy Stage = zero_stage<0>, class Param = float>
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
};

template <class P>
concept training_policy_type = requires {
  typename P::mesh_type;
  typename P::stage;
  typename P::param_type;
  P::data_mask;
};

}  // namespace zest
