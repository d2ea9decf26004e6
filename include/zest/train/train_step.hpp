// zest/train/train_step.hpp — one optimizer step of a model on one batch, with its numbers.
//
//   auto r = zest::train_step(engine, model, inputs, targets, schedule(step), seed);
//   r.loss;               // the global mean loss (every rank)
//   r.traffic;            // parameter and gradient collectives of this step (axis counters)
//   r.traffic_by_axis[a]; // the same, over mesh axis a alone (a step_inventory's "recorded")
//   r.scalar_traffic;     // loss, norm and agreement reductions (world counter)
//   r.seconds;            // the whole step: r.forward_seconds + r.backward_seconds +
//                         // r.update_seconds (and the counters' reads)
//
// The model is anything with loss(tape&, inputs, targets, seed) returning a scalar variable.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/core/memory.hpp"
#include "zest/core/source_site.hpp"
#include "zest/zero/engine.hpp"

namespace zest {

struct train_step_result {
  double loss = 0;
  step_report report;
  comm_stats traffic;                       // over the mesh's axis communicators
  std::vector<comm_stats> traffic_by_axis;  // per mesh axis, in the mesh's order
  comm_stats scalar_traffic;                // over the world communicator
  double seconds = 0;
  // Its parts: forward (to the loss, its all-reduce included), backward (with the gradients'
  // reductions that it overlaps and those it waits for at its end) and the optimizer's update.
  double forward_seconds = 0;
  double backward_seconds = 0;
  double update_seconds = 0;
  // zest's live bytes at their highest during the step, in the memory the mesh's backend
  // keeps tensors in (device memory on a GPU)
  std::int64_t peak_bytes = 0;
};

template <class P, class Model, sharded_tensor Ids, sharded_tensor Targets>
train_step_result train_step(zero_engine<P>& engine, const Model& model, const Ids& inputs,
                             const Targets& targets, double lr, std::uint64_t seed = 0,
                             source_site at = source_site::current()) {
  const user_call user(at);  // the step's collectives name the caller's line
  const auto& mesh = engine.mesh();
  const comm_stats axes_before = mesh.stats();
  std::vector<comm_stats> by_axis_before;
  for (std::size_t a = 0; a < mesh.axis_count; ++a) by_axis_before.push_back(mesh.axis(a).stats());
  const comm_stats world_before = mesh.world().stats();
  memory::counters& bytes = backend_of<typename P::mesh_type>::counters();
  bytes.peak.store(bytes.live.load());
  using clock = std::chrono::steady_clock;
  const auto since = [](clock::time_point from) {
    return std::chrono::duration<double>(clock::now() - from).count();
  };
  const auto start = clock::now();

  train_step_result r;
  clock::time_point backward_start;
  {
    autodiff::tape t;
    auto loss = model.loss(t, inputs, targets, seed);
    r.loss = engine.scalar_value(loss.value());
    r.forward_seconds = since(start);
    backward_start = clock::now();
    engine.backward(loss);
  }  // the tape's buffers are freed here, inside backward's time
  r.backward_seconds = since(backward_start);
  const auto update_start = clock::now();
  r.report = engine.step(lr);
  // The step's device work (the optimizer's kernels, the published copies) inside the time.
  backend_of<typename P::mesh_type>::synchronize();
  r.update_seconds = since(update_start);

  r.seconds = since(start);
  r.peak_bytes = bytes.peak.load();
  r.traffic = mesh.stats() - axes_before;
  for (std::size_t a = 0; a < mesh.axis_count; ++a)
    r.traffic_by_axis.push_back(mesh.axis(a).stats() - by_axis_before[a]);
  r.scalar_traffic = mesh.world().stats() - world_before;
  return r;
}

}  // namespace zest
