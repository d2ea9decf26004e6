// zest/zero/cost_model.hpp — time of a training step from a cluster description: compute at
// a fraction of the device's peak, and each collective of the layout priced by an alpha-beta
// model on the link of its mesh axis.
//
//   zest::cluster v100 = zest::dgx2_v100_cluster();        // 125 TFLOP/s, NVSwitch, 800 Gbps
//   auto t = zest::estimate_step(config, layout, v100);
//   t.total_seconds(), t.achieved_flops() / 1e12          // TFLOP/s per GPU
//
// Collectives (n ranks, link latency alpha per message step, bandwidth beta in bytes/s per GPU
// and direction, S the buffer of one rank):
//   all-gather of S (the gathered buffer), reduce-scatter of S (the input):
//                                      (n-1) alpha + (n-1)/n S / beta   (ring)
//   all-reduce of S:                   2(n-1) alpha + 2(n-1)/n S / beta (ring: RS + AG)
//   all-to-all of S (this rank's send buffer):
//                                      (n-1) alpha + (n-1)/n S / beta   (pairwise exchange)
// The bytes terms are what zest's communicators count as sent (docs/design-notes.md,
// "Transitions"), so a plan's bytes sent per rank convert to time as sent / beta plus the
// latency steps of its calls.
//
// A step (per GPU; T the tokens of a data rank per step, b s per micro-batch times the
// accumulation; Psi the matrices a token meets, top_k experts each):
//   compute   6 Psi T + 12 L T s h (q k^T and p v over the full s x s scores, fwd + bwd),
//             expert matrices times the capacity factor (the experts compute all their
//             slots), divided by tp; recomputation adds a forward: full, 2 Psi_layers T +
//             4 L T s h; selective, 4 L T s h; all at efficiency x peak.
//   memory    where the cluster gives a memory bandwidth (a CPU, whose element-wise work and
//             fresh pages are not hidden behind its GEMMs): the activations forward
//             produces (transformer_activation_bytes without recomputation, per micro-batch)
//             moved `activation_passes` times (3: written in forward, read in backward,
//             their gradients written; one more under full recomputation) at that bandwidth.
//   collectives  the step's inventory (zest/zero/step_inventory.hpp: ZeRO's phases on the data
//             axes, Megatron's and Ulysses' activations, the experts' all-to-alls, the
//             gradients of replicated weights), each line on the link of its axis: dp on
//             cluster::data, hybrid sharding's replica axis (dp_rep) on cluster::data_replica,
//             tp, ep and sp on cluster::tensor, ::expert and ::sequence. Its bytes are what
//             zest's communicators count in a run (tests/train/train_gpt_checks.py).
// Overlap: none by default (the step is the sum); with `overlap` the communication hides
// behind compute (the step is the larger of the two).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "zest/comm/communicator.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/stage.hpp"
#include "zest/zero/step_inventory.hpp"
#include "zest/zero/transformer_plan.hpp"

namespace zest {

struct axis_link {
  double bandwidth = 1e9;  // bytes/s per GPU and direction
  double latency = 1e-5;   // seconds per message step
};

struct cluster {
  std::string name = "cluster";
  double peak_flops = 1e12;      // per device
  double efficiency = 0.5;       // share of the peak that the step's compute reaches
  double memory_bandwidth = 0;   // bytes/s for the activations' traffic; 0: not modelled
  double activation_passes = 3;  // times each activation byte is moved per step
  axis_link data{};              // the dp axis
  axis_link data_replica{};      // hybrid sharding's dp_rep axis (across nodes)
  axis_link tensor{};            // the tp axis
  axis_link expert{};            // the ep axis
  axis_link sequence{};          // Ulysses' sp axis
};

// DGX-2 nodes of 16 V100 (32 GB), as in the ZeRO paper's and Turing-NLG's runs: 125 TFLOP/s
// fp16 tensor-core peak; within a node NVSwitch (the ZeRO paper's 300 GB/s per link, both
// directions: 150 GB/s per GPU and direction, of which a ring is taken to reach 120), across
// nodes 800 Gbps of InfiniBand EDR per node (8 links of 12.5 GB/s) shared by its 16 GPUs:
// 6.25 GB/s each. tp and ep are inside a node, dp across nodes. The latencies (5 us per
// NVSwitch step, 20 us across nodes) and the efficiency are assumptions, printed with the
// figures.
inline cluster dgx2_v100_cluster(double efficiency = 0.4) {
  cluster c;
  c.name = "DGX-2 V100";
  c.peak_flops = 125e12;
  c.efficiency = efficiency;
  c.tensor = {120e9, 5e-6};
  c.expert = c.tensor;
  c.sequence = c.tensor;
  c.data = {800e9 / 8 / 16, 20e-6};
  c.data_replica = c.data;
  return c;
}

// DGX A100 nodes of 8 A100: 312 TFLOP/s bf16 tensor-core peak; NVSwitch 300 GB/s per GPU
// and direction (240 taken as a ring's), across nodes 8 HDR links of 200 Gbps per node, one
// per GPU: 25 GB/s each. Latencies and efficiency assumed as for the DGX-2.
inline cluster dgx_a100_cluster(double efficiency = 0.5) {
  cluster c;
  c.name = "DGX A100";
  c.peak_flops = 312e12;
  c.efficiency = efficiency;
  c.tensor = {240e9, 5e-6};
  c.expert = c.tensor;
  c.sequence = c.tensor;
  c.data = {200e9 / 8, 20e-6};
  c.data_replica = c.data;
  return c;
}

// Message steps of one call of a ring (or pairwise) collective over n ranks.
constexpr double latency_steps(collective k, int n) {
  const double m = n > 1 ? n - 1 : 0;
  return k == collective::all_reduce ? 2 * m : m;
}

// Bytes one rank sends in a collective of its buffer S over n ranks.
constexpr double bytes_sent(collective k, int n, double buffer_bytes) {
  if (n <= 1) return 0;
  const double share = static_cast<double>(n - 1) / n * buffer_bytes;
  return k == collective::all_reduce ? 2 * share : share;
}

// The alpha-beta time of one collective of buffer S over n ranks on `l`.
constexpr double collective_seconds(collective k, int n, double buffer_bytes, const axis_link& l) {
  return latency_steps(k, n) * l.latency + bytes_sent(k, n, buffer_bytes) / l.bandwidth;
}

// What one mesh axis carries in a step.
struct axis_traffic {
  double bytes_sent = 0;
  double calls = 0;
  double seconds = 0;
  void add(collective k, int n, double buffer_bytes, double count, const axis_link& l) {
    if (n <= 1 || count <= 0) return;
    bytes_sent += count * zest::bytes_sent(k, n, buffer_bytes);
    calls += count;
    seconds += count * collective_seconds(k, n, buffer_bytes, l);
  }
  // A plan's figure: `sent` bytes over `count` calls of kind k.
  void add_sent(collective k, int n, double sent, double count, const axis_link& l) {
    if (n <= 1 || count <= 0) return;
    bytes_sent += sent;
    calls += count;
    seconds += count * latency_steps(k, n) * l.latency + sent / l.bandwidth;
  }
};

struct step_estimate {
  double flops = 0;            // per GPU, recomputation included
  double model_flops = 0;      // per GPU, without recomputation
  double compute_seconds = 0;  // the matrix products at efficiency x peak
  double memory_seconds = 0;   // the activations' traffic (cluster::memory_bandwidth)
  axis_traffic data, replica, tensor, expert, sequence;  // replica: hybrid sharding's dp_rep
  bool overlap = false;
  double global_tokens = 0;  // per step

  double communication_seconds() const {
    return data.seconds + replica.seconds + tensor.seconds + expert.seconds + sequence.seconds;
  }
  double total_seconds() const {
    return overlap ? std::max(compute_seconds + memory_seconds, communication_seconds())
                   : compute_seconds + memory_seconds + communication_seconds();
  }
  // Per GPU, counting the recomputed forward (what the device executes).
  double achieved_flops() const { return flops / total_seconds(); }
  double tokens_per_second() const { return global_tokens / total_seconds(); }
};

inline step_estimate estimate_step(const transformer_config& c, const parallel_layout& p,
                                   const cluster& cl,
                                   const training_precision& precision = mixed_precision_adam,
                                   bool overlap = false) {
  const transformer_memory plan = plan_transformer(c, p, precision);
  step_estimate out;
  out.overlap = overlap;
  const double t = static_cast<double>(p.tp) * p.sp;  // Ulysses splits the work as tp does
  const double b = static_cast<double>(p.micro_batch), s = static_cast<double>(c.sequence);
  const double h = static_cast<double>(c.hidden), l = static_cast<double>(c.layers);
  const double micro = static_cast<double>(p.accumulation);
  const double tokens = b * s * micro;  // of one data rank (dp x ep) per step
  out.global_tokens = tokens * p.dp_replicas * p.dp * p.ep;

  // Compute.
  const double dense =
      static_cast<double>(plan.active_matmul_parameters - plan.active_expert_matmul_parameters);
  const double experts =
      static_cast<double>(plan.active_expert_matmul_parameters) * c.capacity_factor;
  const double head = static_cast<double>(c.vocab) * h;
  const double attention = 12 * l * tokens * s * h;
  out.model_flops = (6 * (dense + experts) * tokens + attention) / t;
  double extra = 0;
  if (p.recompute == recomputation::full)
    extra = 2 * (dense - head + experts) * tokens + attention / 3;
  else if (p.recompute == recomputation::selective) extra = attention / 3;
  out.flops = out.model_flops + extra / t;
  out.compute_seconds = out.flops / (cl.peak_flops * cl.efficiency);
  if (cl.memory_bandwidth > 0) {
    parallel_layout kept = p;
    kept.recompute = recomputation::none;
    const double produced =
        transformer_activation_bytes(c, kept, static_cast<double>(precision.parameter_bytes))
            .total() *
        micro;
    const double passes = cl.activation_passes + (p.recompute == recomputation::full ? 1.0 : 0.0);
    out.memory_seconds = produced * passes / cl.memory_bandwidth;
  }

  // The collectives: the step's inventory (zest/zero/step_inventory.hpp), each line on the
  // link of its axis.
  const inventory_axes roles;  // the planner's mesh: "tp", "sp", "ep"
  const step_inventory inv = inventory_step(c, p, plan.states, precision, roles);
  for (const inventory_line& line : inv.lines()) {
    const auto data = std::find(plan.states.axes.begin(), plan.states.axes.end(), line.axis);
    axis_traffic* on = &out.tensor;
    const axis_link* link = &cl.tensor;
    int ranks = p.tp;
    if (data != plan.states.axes.end()) {
      const auto a = static_cast<std::size_t>(data - plan.states.axes.begin());
      const bool replica = (plan.states.replica_mask >> a & 1U) != 0;
      on = replica ? &out.replica : &out.data;
      link = replica ? &cl.data_replica : &cl.data;
      ranks = plan.states.axis_sizes[a];
    } else if (line.axis == roles.expert) {
      on = &out.expert;
      link = &cl.expert;
      ranks = p.ep;
    } else if (line.axis == roles.sequence) {
      on = &out.sequence;
      link = &cl.sequence;
      ranks = p.sp;
    }
    on->add_sent(line.kind, ranks, static_cast<double>(line.bytes), static_cast<double>(line.calls),
                 *link);
  }
  return out;
}

}  // namespace zest
