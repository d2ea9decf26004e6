// zest/zest.hpp — the umbrella header: the library's types and operations, from meshes and
// layouts to layers, ZeRO and MoE.
//
// What reads or writes files in formats of its own has an umbrella of its own, so that a
// program that computes does not compile a JSON parser, a plotter or a terminal progress line:
//   zest/io.hpp      checkpoints (zest/io/, zest/train/checkpoint.hpp) and the JSON they carry
//   zest/report.hpp  the training log (JSON), the SVG plotter, the progress line
//
//   #include <zest/zest.hpp>
//   using mesh_t = zest::mesh<"dp", "tp">;
//   using x_t = zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "dp">>>;
//   auto y = zest::einsum<"bsm,mh->bsh">(x, w);
#pragma once

#include "zest/config.hpp"

#include "zest/core/bfloat16.hpp"
#include "zest/core/device_math.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/float16.hpp"
#include "zest/core/memory.hpp"
#include "zest/core/random.hpp"

#include "zest/comm/checked.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/comm/local_communicator.hpp"
#if ZEST_HAS_MPI
#include "zest/comm/mpi_communicator.hpp"
#include "zest/comm/mpi_environment.hpp"
#endif

#include "zest/mesh/mesh.hpp"

#include "zest/layout/cheapest_plan.hpp"
#include "zest/layout/fixed_order_plan.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/layout_of.hpp"
#include "zest/layout/layout_string.hpp"
#include "zest/layout/placement.hpp"
#include "zest/layout/plan_cache.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"

#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/relabel.hpp"
#include "zest/tensor/tensor.hpp"

#include "zest/backend/backend.hpp"
#include "zest/backend/emulated/emulated_backend.hpp"
#include "zest/backend/host/contract.hpp"
#include "zest/backend/host/host_backend.hpp"

#include "zest/einsum/einsum.hpp"
#include "zest/einsum/plan.hpp"
#include "zest/einsum/policy.hpp"
#include "zest/einsum/spec.hpp"

#include "zest/plan/explain.hpp"
#include "zest/plan/visualize.hpp"

#include "zest/autodiff/attention.hpp"
#include "zest/autodiff/checkpoint.hpp"
#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/einsum_grad.hpp"
#include "zest/autodiff/kernels.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/relabel.hpp"
#include "zest/autodiff/rope.hpp"
#include "zest/autodiff/shape_ops.hpp"
#include "zest/autodiff/tape.hpp"

#include "zest/moe/dispatch.hpp"
#include "zest/moe/gating.hpp"
#include "zest/moe/moe_layer.hpp"

#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"

#include "zest/io/checksum.hpp"
#include "zest/io/tensor_record.hpp"

#include "zest/mesh/emulated_mesh.hpp"
#include "zest/mesh/mesh_shape.hpp"
#include "zest/zero/engine.hpp"
#include "zest/zero/init.hpp"
#include "zest/zero/parameter.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/recomputation.hpp"
#include "zest/zero/stage.hpp"
#include "zest/zero/training_policy.hpp"

#include "zest/nn/attention.hpp"
#include "zest/nn/block.hpp"
#include "zest/nn/embedding.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/nn/layer_norm.hpp"
#include "zest/nn/linear.hpp"
#include "zest/nn/mlp.hpp"

#include "zest/optim/adamw.hpp"
#include "zest/optim/clip.hpp"
#include "zest/optim/loss_scaler.hpp"
#include "zest/optim/schedule.hpp"

#include "zest/train/train_step.hpp"
