// zest/zero/planner.hpp — per-rank model-state memory and communication per step under a
// ZeRO stage, derived from the stage's layouts (zest/zero/stage.hpp).
//
//   zest::mesh_shape<"dp"> mesh({64});                         // no MPI, any size
//   auto p = zest::plan_zero<zest::zero_stage<2>>(zest::flat_model(7'500'000'000), mesh);
//   p.memory.total()  == 16'640'625'000   // 2Psi + (2+K)Psi/N_d bytes, K = 12
//   p.elements_sent() == 2 * 7.5e9 * 63 / 64
//
// Nothing here is a ZeRO formula. Memory is, per parameter, the elements this rank holds
// under each model state's layout (balanced blocks) times that state's element size.
// Communication is, per parameter and phase, the steps of the cheapest plan for the
// parameter's extents and the mesh's sizes (cheapest_plan), on the
// stage's data axes (as the engine moves a parameter: over them only), priced by
// the same ring model as explain() and the communicators' counters (detail::step_bytes),
// so a training run can compare its counters with this plan exactly. The ZeRO paper's
// closed forms (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models", section 5) are in zero_formula() only to check the derivation against
// them.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/comm/communicator.hpp"
#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/plan_cache.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"
#include "zest/layout/wire.hpp"
#include "zest/mesh/mesh_shape.hpp"
#include "zest/plan/explain.hpp"  // detail::step_bytes, detail::after_step, detail::local_elements
#include "zest/zero/stage.hpp"

namespace zest {

// ---------------------------------------------------------------------------------------
// Precision: bytes per element of each model state.

struct training_precision {
  std::string_view name;
  std::size_t parameter_bytes = 2;  // the working copy the model computes with
  std::size_t gradient_bytes = 2;
  std::size_t master_bytes = 4;           // fp32 master copy; 0 when the parameters are fp32
  std::size_t optimizer_state_bytes = 8;  // Adam's m and v in fp32
  // ZeRO's K: optimizer-held bytes per parameter.
  constexpr std::size_t k() const { return master_bytes + optimizer_state_bytes; }
};

// Mixed-precision Adam as in the ZeRO paper: bf16/fp16 parameters and gradients, K = 12.
inline constexpr training_precision mixed_precision_adam{"mixed precision (bf16/fp16, fp32 Adam)",
                                                         2, 2, 4, 8};
// fp32 training: the parameters are their own master copy, so K = 8.
inline constexpr training_precision fp32_adam{"fp32 (fp32 Adam)", 4, 4, 0, 8};

// ---------------------------------------------------------------------------------------
// Models as lists of parameter shapes.

struct parameter_shape {
  std::string name;
  std::vector<std::size_t> extents;
  // The engine's group it belongs to (a layer, a block): the group's transitions travel as
  // one collective per axis and step (its gradients per bucket). Empty: a group of its own.
  std::string group = {};
  std::uint64_t elements() const {
    std::uint64_t n = 1;
    for (auto e : extents) n *= e;
    return n;
  }
};

struct model_shape {
  std::string name;
  std::vector<parameter_shape> parameters;
  std::uint64_t parameter_count() const {
    std::uint64_t n = 0;
    for (const auto& p : parameters) n += p.elements();
    return n;
  }
};

// The parameter list of a ZeRO engine (zest/zero/engine.hpp), in its groups: what a model's
// shape() gives the planner.
template <class Engine>
model_shape shape_of(const Engine& engine, std::string name) {
  model_shape m{std::move(name), {}};
  for (const auto* p : engine.parameters()) {
    m.parameters.push_back(
        {p->name(), p->global_extents(), engine.group_name(engine.group_of(*p))});
  }
  return m;
}

// One parameter of psi elements: the model the ZeRO paper's formulas assume (DeepSpeed
// flattens a rank's parameters into one buffer before partitioning).
inline model_shape flat_model(std::uint64_t psi, std::string name = "flat") {
  return {std::move(name), {{"flat", {static_cast<std::size_t>(psi)}}}};
}

struct gpt_config {
  std::size_t vocab = 50257;
  std::size_t context = 1024;
  std::size_t width = 768;
  std::size_t layers = 12;
  std::size_t mlp_ratio = 4;
  bool tied_output = true;  // the output projection reuses the token embedding (GPT-2)
};
inline constexpr gpt_config gpt2_small{};

// A GPT-2-style parameter list, weights [in, out]:
//   wte [vocab, m], wpe [context, m];
//   per layer: ln_1 (weight, bias) [m]; attn.qkv [m, 3m] + [3m]; attn.proj [m, m] + [m];
//              ln_2 [m] x 2; mlp.fc [m, rm] + [rm]; mlp.proj [rm, m] + [m];
//   ln_f [m] x 2; lm_head [m, vocab] unless tied.
// gpt2_small gives 124,439,808 parameters.
inline model_shape gpt_model(const gpt_config& c, std::string name = "gpt") {
  model_shape m{std::move(name), {}};
  const std::size_t w = c.width;
  const std::size_t h = c.mlp_ratio * w;
  std::string group = "embed";  // zest::gpt's groups: the embeddings, each block, the head
  auto add = [&](std::string n, std::vector<std::size_t> e) {
    m.parameters.push_back({std::move(n), std::move(e), group});
  };
  add("wte", {c.vocab, w});
  add("wpe", {c.context, w});
  for (std::size_t l = 0; l < c.layers; ++l) {
    const std::string p = detail::message("h", l, '.');
    group = detail::message("h", l);
    add(p + "ln_1.weight", {w});
    add(p + "ln_1.bias", {w});
    add(p + "attn.qkv.weight", {w, 3 * w});
    add(p + "attn.qkv.bias", {3 * w});
    add(p + "attn.proj.weight", {w, w});
    add(p + "attn.proj.bias", {w});
    add(p + "ln_2.weight", {w});
    add(p + "ln_2.bias", {w});
    add(p + "mlp.fc.weight", {w, h});
    add(p + "mlp.fc.bias", {h});
    add(p + "mlp.proj.weight", {h, w});
    add(p + "mlp.proj.bias", {w});
  }
  group = "head";
  add("ln_f.weight", {w});
  add("ln_f.bias", {w});
  if (!c.tied_output) add("lm_head", {w, c.vocab});
  return m;
}

// ---------------------------------------------------------------------------------------
// The plan.

// Bytes of model states one rank holds.
struct model_state_bytes {
  std::uint64_t parameters = 0;
  std::uint64_t gradients = 0;
  std::uint64_t master = 0;
  std::uint64_t optimizer_state = 0;
  constexpr std::uint64_t optimizer() const { return master + optimizer_state; }  // ZeRO's K part
  constexpr std::uint64_t total() const {
    return parameters + gradients + master + optimizer_state;
  }
  constexpr bool operator==(const model_state_bytes&) const = default;
};

// What one phase of a step sends from this rank, summed over the model's parameters.
struct phase_traffic {
  std::uint64_t bytes = 0;
  std::uint64_t elements = 0;  // in the communicated type
  std::array<std::uint64_t, collective_kinds> calls{};
  std::array<std::uint64_t, collective_kinds> bytes_by{};
  // By mesh axis and collective kind (what a cost model prices per link).
  std::array<std::array<std::uint64_t, collective_kinds>, max_axes> calls_on{}, bytes_on{};
  std::uint64_t collectives() const {
    std::uint64_t n = 0;
    for (auto c : calls) n += c;
    return n;
  }
};

struct zero_plan {
  int stage = 0;
  std::string model;
  std::string mesh;
  std::vector<std::string> axes;  // the mesh's axis names, in order
  std::vector<int> axis_sizes;    // their ranks
  unsigned replica_mask = 0;      // the stage's replica axes (bit a: axis a)
  int rank = 0;
  training_precision precision{};
  std::uint64_t parameter_count = 0;
  std::uint64_t data_parallel_size = 1;  // ranks the states are partitioned over (N)
  std::uint64_t replica_size = 1;        // ranks of the replica axes (HSDP's R)
  model_state_bytes memory{};
  // hpZ's secondary copies (with_secondary_over): not a model state, but held from each
  // group's forward to its backward, so all of them at the end of forward.
  std::uint64_t secondary_bytes = 0;
  std::array<phase_traffic, zero_phases.size()> traffic{};  // indexed by zero_phase

  const phase_traffic& of(zero_phase p) const { return traffic[static_cast<std::size_t>(p)]; }
  phase_traffic& of(zero_phase p) { return traffic[static_cast<std::size_t>(p)]; }
  std::uint64_t bytes_sent() const {
    std::uint64_t b = 0;
    for (const auto& t : traffic) b += t.bytes;
    return b;
  }
  std::uint64_t elements_sent() const {
    std::uint64_t n = 0;
    for (const auto& t : traffic) n += t.elements;
    return n;
  }
  std::uint64_t bytes_of(collective k) const {
    std::uint64_t b = 0;
    for (const auto& t : traffic) b += t.bytes_by[static_cast<std::size_t>(k)];
    return b;
  }
  // Bytes sent over mesh axis a, all phases.
  std::uint64_t bytes_on(std::size_t a) const {
    std::uint64_t b = 0;
    for (const auto& t : traffic) {
      for (std::uint64_t x : t.bytes_on[a]) b += x;
    }
    return b;
  }
  // Elements sent in units of Psi (N-1)/N: 2 for stages 0-2, 3 for stage 3.
  double psi_coefficient() const {
    if (data_parallel_size <= 1 || parameter_count == 0) return 0;
    const auto n = static_cast<double>(data_parallel_size);
    return static_cast<double>(elements_sent()) /
           (static_cast<double>(parameter_count) * (n - 1) / n);
  }
  // "reduce_scatter + all_gather"
  std::string collectives_summary() const {
    std::string out;
    for (auto p : zero_phases) {
      for (std::size_t k = 0; k < collective_kinds; ++k) {
        if (of(p).calls[k] == 0) continue;
        if (!out.empty()) out += " + ";
        out += name_of(static_cast<collective>(k));
      }
    }
    return out.empty() ? std::string("none") : out;
  }

  std::string str() const {
    std::ostringstream out;
    out << *this;
    return out.str();
  }
  friend std::ostream& operator<<(std::ostream& out, const zero_plan& p) {
    out << "ZeRO stage " << p.stage << " of " << p.model << " (" << p.parameter_count
        << " parameters) on " << p.mesh << ", rank " << p.rank << ", " << p.precision.name << '\n';
    out << "  model states  parameters " << format_decimal_bytes(p.memory.parameters)
        << ", gradients " << format_decimal_bytes(p.memory.gradients) << ", optimizer "
        << format_decimal_bytes(p.memory.optimizer()) << " (master "
        << format_decimal_bytes(p.memory.master) << ", Adam state "
        << format_decimal_bytes(p.memory.optimizer_state) << "), total "
        << format_decimal_bytes(p.memory.total()) << '\n';
    if (p.secondary_bytes != 0) {
      out << "  hpZ copies    " << format_decimal_bytes(p.secondary_bytes)
          << " from forward to backward\n";
    }
    for (auto phase : zero_phases) {
      const auto& t = p.of(phase);
      std::string line = "  " + std::string(name_of(phase));
      line.resize(22, ' ');
      if (t.collectives() == 0) {
        out << line << "nothing\n";
        continue;
      }
      std::string kinds;
      for (std::size_t k = 0; k < collective_kinds; ++k) {
        if (t.calls[k] == 0) continue;
        if (!kinds.empty()) kinds += ", ";
        kinds +=
            std::to_string(t.calls[k]) + " x " + std::string(name_of(static_cast<collective>(k)));
      }
      line += kinds;
      line.resize(std::max<std::size_t>(line.size() + 1, 48), ' ');
      out << line << format_decimal_bytes(t.bytes) << " sent by this rank\n";
    }
    out << "  total " << format_decimal_bytes(p.bytes_sent()) << " per step = " << std::fixed
        << std::setprecision(3) << p.psi_coefficient() << " Psi (N-1)/N elements\n";
    std::size_t carrying = 0;
    for (std::size_t a = 0; a < p.axes.size(); ++a) carrying += p.bytes_on(a) != 0 ? 1U : 0U;
    if (carrying > 1) {
      out << "  by axis";
      for (std::size_t a = 0; a < p.axes.size(); ++a) {
        if (p.bytes_on(a) != 0)
          out << ' ' << p.axes[a] << ' ' << format_decimal_bytes(p.bytes_on(a));
      }
      out << '\n';
    }
    return out;
  }

  // Decimal units, as the ZeRO paper counts: 1 GB = 1e9 bytes.
  static std::string format_decimal_bytes(std::uint64_t b) {
    std::ostringstream s;
    const auto x = static_cast<double>(b);
    s << std::fixed << std::setprecision(2);
    if (b < 1000) s << b << " B";
    else if (x < 1e6) s << x / 1e3 << " kB";
    else if (x < 1e9) s << x / 1e6 << " MB";
    else if (x < 1e12) s << x / 1e9 << " GB";
    else s << x / 1e12 << " TB";
    return s.str();
  }
};

namespace detail {

// One parameter's collectives in a phase, in order: the kind on the wire and the axis.
struct collective_step {
  collective kind;
  std::uint8_t axis;
};
using collective_steps = std::vector<collective_step>;
using parameter_collectives = std::array<collective_steps, zero_phases.size()>;

// "abc..." — the planner names a parameter's dims by position; split rules choose by
// position too (split_first_dim, split_last_dim).
template <std::size_t Rank>
constexpr fixed_string<Rank + 1> positional_dims() {
  fixed_string<Rank + 1> s;
  for (std::size_t i = 0; i < Rank; ++i) s.set(i, static_cast<char>('a' + i));
  return s;
}

// Ranks over the mesh axes that `axes` names (1 for none).
template <class Mesh, class Names>
std::uint64_t axes_size(const Mesh& mesh, const Names& axes) {
  std::uint64_t n = 1;
  for (std::string_view axis : axes) {
    const std::size_t a = axis_index_of<Mesh>(axis);
    if (a < Mesh::axis_names.size()) n *= static_cast<std::uint64_t>(mesh.size(a));
  }
  return n;
}

// One parameter's figures, its layouts given. The dims ("ab..." by position) are a run-time
// value: this is compiled once per mesh type, not once per stage and number of dims
// (bench/README.md, "Compile time and memory").
template <class Mesh>
parameter_collectives plan_parameter_layouts(zero_plan& plan, const parameter_shape& param,
                                             const Mesh& mesh, const zero_layouts& layouts,
                                             std::string_view dims, unsigned data_mask,
                                             unsigned replica_mask) {
  const std::vector<std::size_t>& global = param.extents;
  const auto coords = mesh.coords();
  auto held = [&](layout_value v) -> std::uint64_t {
    std::size_t n = 1;
    for (std::size_t i = 0; i < dims.size(); ++i)
      n *= dim_range(v, dims[i], global[i], mesh.sizes(), coords).size;
    return n;
  };

  const training_precision& pr = plan.precision;
  plan.memory.parameters += held(layouts.stored) * pr.parameter_bytes;
  plan.memory.gradients += held(layouts.gradient_buffer) * pr.gradient_bytes;
  plan.memory.master += held(layouts.master) * pr.master_bytes;
  plan.memory.optimizer_state += held(layouts.optimizer_state) * pr.optimizer_state_bytes;
  if (layouts.secondary.axis_count != 0)
    plan.secondary_bytes += held(layouts.secondary) * pr.parameter_bytes;

  const transition_shape shape = zero_transition_shape(dims, global, mesh.sizes(), replica_mask);
  mesh_coords here{};
  for (std::size_t a = 0; a < coords.size(); ++a) here[a] = coords[a];
  parameter_collectives out;
  for (std::size_t i = 0; i < zero_phases.size(); ++i) {
    const zero_transfer x = transfer_of(layouts, zero_phases[i]);
    const std::size_t element = x.carries_gradient ? pr.gradient_bytes : pr.parameter_bytes;
    phase_traffic& t = plan.traffic[i];
    layout_value v = x.from;
    // The search may use only the data axes, as the engine's (parameter_slot::plan_between):
    // its collectives never run through another axis' ranks. What transition_plan_for and
    // step_bytes compute, from the run-time shape.
    const transition_plan steps = cached_transition_plan(x.from, x.to, shape, data_mask);
    for (const auto& s : steps) {
      if (is_collective(s.kind)) {
        // On a quantized wire (qwZ, qgZ) the bytes are the wire's, and a reduce-scatter is
        // an all-to-all; `elements` stays the elements the step moves.
        const std::uint64_t b = step_wire_bytes(s, v, shape, here, x.wire, element);
        const auto k = static_cast<std::size_t>(
            x.wire.collective_for(s.kind, static_cast<std::size_t>(shape.sizes[s.axis])));
        out[i].push_back({static_cast<collective>(k), s.axis});
        t.bytes_by[k] += b;
        t.bytes_on[s.axis][k] += b;
        t.bytes += b;
        t.elements += step_elements(s, v, shape, here);
      }
      v = after_step(v, s);
    }
  }
  return out;
}

// The calls of one phase for a run of parameters that move together (a group, or one bucket
// of its gradients): the mover's coalescing (zest/tensor/transition_group.hpp) replayed on
// their collective steps. Each call takes the first parameter's next step and every other
// parameter whose next step is the same collective over the same axis.
inline void count_coalesced(phase_traffic& t, std::span<const collective_steps* const> members) {
  std::vector<std::size_t> next(members.size(), 0);
  for (;;) {
    const collective_step* lead = nullptr;
    for (std::size_t m = 0; m < members.size(); ++m) {
      if (next[m] == members[m]->size()) continue;
      const collective_step& s = (*members[m])[next[m]];
      if (lead == nullptr) lead = &s;
      if (s.kind == lead->kind && s.axis == lead->axis) ++next[m];
    }
    if (lead == nullptr) return;
    const auto k = static_cast<std::size_t>(lead->kind);
    t.calls[k] += 1;
    t.calls_on[lead->axis][k] += 1;
  }
}

template <class Stage, fixed_string Dims, class Mesh>
parameter_collectives plan_zero_parameter(zero_plan& plan, const parameter_shape& param,
                                          const Mesh& mesh) {
  static constexpr zero_layouts layouts = Stage::template layouts<Mesh, Dims>;
  return plan_parameter_layouts(plan, param, mesh, layouts, view_of<Dims>,
                                Stage::template data_mask<Mesh>,
                                Stage::template replica_mask<Mesh>);
}

template <class Stage, class Mesh, std::size_t... R>
parameter_collectives plan_zero_parameter_any_rank(zero_plan& plan, const parameter_shape& param,
                                                   const Mesh& mesh, std::index_sequence<R...>) {
  const std::size_t rank = param.extents.size();
  parameter_collectives steps;
  const bool planned =
      ((rank == R + 1
            ? (steps = plan_zero_parameter<Stage, positional_dims<R + 1>()>(plan, param, mesh),
               true)
            : false) ||
       ...);
  if (!planned) {
    throw shape_error(message("zest: plan_zero: parameter '", param.name, "' has ", rank,
                              " dims; the planner takes 1 to ", max_dims,
                              " (give a scalar the extents {1})"));
  }
  return steps;
}

// The calls of every phase: per group (consecutive parameters of one group name; an unnamed
// one alone), its gradients' phase per bucket of at most `bucket_elements` elements, as the
// engine issues them (zero_engine::buckets_of).
inline void count_group_calls(zero_plan& plan, const model_shape& model,
                              std::span<const parameter_collectives> steps,
                              std::size_t bucket_elements) {
  const auto& ps = model.parameters;
  std::size_t first = 0;
  while (first < ps.size()) {
    std::size_t end = first + 1;
    if (!ps[first].group.empty()) {
      while (end < ps.size() && ps[end].group == ps[first].group) ++end;
    }
    for (std::size_t i = 0; i < zero_phases.size(); ++i) {
      const bool bucketed = zero_phases[i] == zero_phase::gradient_reduction;
      std::size_t from = first;
      while (from < end) {
        std::size_t to = from, elements = 0;
        while (to < end &&
               (!bucketed || to == from || elements + ps[to].elements() <= bucket_elements)) {
          elements += ps[to].elements();
          ++to;
        }
        std::vector<const collective_steps*> members;
        for (std::size_t k = from; k < to; ++k) members.push_back(&steps[k][i]);
        count_coalesced(plan.traffic[i], members);
        from = to;
      }
    }
    first = end;
  }
}

}  // namespace detail

// The per-rank plan of one training step of `model` under Stage, for the rank at the
// mesh's coordinates. Mesh is anything with axis_names, sizes(), coords(), size(a) and
// coord(a): a mesh_shape for sizes beyond this machine, or the training run's own mesh.
// With balanced blocks the first ranks hold the most, so rank 0 is the peak of memory.
template <zero_stage_policy Stage, class Mesh>
zero_plan plan_zero(const model_shape& model, const Mesh& mesh,
                    const training_precision& precision = mixed_precision_adam,
                    std::size_t bucket_elements = default_bucket_elements) {
  zero_plan plan;
  plan.stage = Stage::stage;
  plan.model = model.name;
  plan.mesh = mesh.describe();
  for (std::size_t a = 0; a < Mesh::axis_names.size(); ++a) {
    plan.axes.emplace_back(Mesh::axis_names[a]);
    plan.axis_sizes.push_back(mesh.size(a));
  }
  plan.replica_mask = Stage::template replica_mask<Mesh>;
  int rank = 0;
  for (std::size_t a = 0; a < Mesh::axis_names.size(); ++a)
    rank = rank * mesh.size(a) + mesh.coord(a);
  plan.rank = rank;
  plan.precision = precision;
  plan.parameter_count = model.parameter_count();
  plan.data_parallel_size = detail::axes_size(mesh, Stage::shard_axes);
  plan.replica_size = detail::axes_size(mesh, Stage::replica_axes);
  std::vector<detail::parameter_collectives> steps;
  steps.reserve(model.parameters.size());
  for (const auto& p : model.parameters) {
    steps.push_back(detail::plan_zero_parameter_any_rank<Stage>(
        plan, p, mesh, std::make_index_sequence<max_dims>{}));
  }
  detail::count_group_calls(plan, model, steps, bucket_elements);
  return plan;
}

// The same with the stage chosen at run time (over "dp" unless told).
template <fixed_string DataAxis = "dp", zero_split_rule SplitRule = split_first_dim,
          fixed_string ReplicaAxes = "", class Mesh>
zero_plan plan_zero(int stage, const model_shape& model, const Mesh& mesh,
                    const training_precision& precision = mixed_precision_adam,
                    std::size_t bucket_elements = default_bucket_elements) {
  return with_zero_stage<DataAxis, SplitRule, ReplicaAxes>(stage, [&](auto s) {
    return plan_zero<decltype(s)>(model, mesh, precision, bucket_elements);
  });
}

// ---------------------------------------------------------------------------------------
// The ZeRO paper's closed forms, for checking the derivation (and for printing beside it).
// With P, G = parameter and gradient bytes and K the optimizer's:
//   stage 0 (P+G+K)Psi   1 (P+G)Psi + K Psi/N   2 P Psi + (G+K)Psi/N   3 (P+G+K)Psi/N
//   elements sent per step: 2 Psi (N-1)/N for stages 0-2, 3 Psi (N-1)/N for stage 3.
struct zero_formula_values {
  double memory_bytes = 0;
  double elements_sent = 0;
};

constexpr zero_formula_values zero_formula(int stage, double psi, double n,
                                           const training_precision& pr = mixed_precision_adam) {
  const auto p = static_cast<double>(pr.parameter_bytes);
  const auto g = static_cast<double>(pr.gradient_bytes);
  const auto k = static_cast<double>(pr.k());
  zero_formula_values f;
  switch (stage) {
    case 0: f.memory_bytes = (p + g + k) * psi; break;
    case 1: f.memory_bytes = (p + g) * psi + k * psi / n; break;
    case 2: f.memory_bytes = p * psi + (g + k) * psi / n; break;
    default: f.memory_bytes = (p + g + k) * psi / n; break;
  }
  f.elements_sent = (stage == 3 ? 3.0 : 2.0) * psi * (n - 1) / n;
  return f;
}

// Hybrid sharding (zero_stage<K, shard>::replicated_over<replica>): the states partitioned
// over n ranks and replicated over r. Memory is zero_formula's for n; the shard axes carry
// zero_formula's elements for n, and the replica axes the all-reduce of each rank's reduced
// gradient shard, 2 (Psi/n) (r-1)/r (the plan reduce-scatters over the shard axes first:
// the cheaper order).
struct hsdp_formula_values {
  double memory_bytes = 0;
  double elements_sent_shard = 0;    // over the shard axes
  double elements_sent_replica = 0;  // over the replica axes
};
constexpr hsdp_formula_values hsdp_formula(int stage, double psi, double n, double r,
                                           const training_precision& pr = mixed_precision_adam) {
  const zero_formula_values z = zero_formula(stage, psi, n, pr);
  return {z.memory_bytes, z.elements_sent, 2.0 * psi / n * (r - 1) / r};
}

// ZeRO++'s quantized wires on stage 3 over n ranks (zero_stage<3>::with_quantized_weights<Bw>
// ::with_quantized_gradients<Bg>; a block of 0 is the exact wire): bytes sent per step and
// rank. The forward and backward all-gathers move 2 Psi (n-1)/n elements, the gradients'
// reduce-scatter (an all-to-all under qgZ) Psi (n-1)/n; an element costs 1 + 4/B bytes on a
// wire of blocks B (int8 and one fp32 scale per block: zest/layout/wire.hpp), its own size on
// an exact one. Exact where every parameter's part per rank is a multiple of B and of 4; else
// each part rounds up to whole blocks and to 4 bytes.
struct zeropp_formula_values {
  double gather_bytes = 0;
  double gradient_bytes = 0;
  constexpr double total() const { return gather_bytes + gradient_bytes; }
};
constexpr zeropp_formula_values zeropp_formula(
    double psi, double n, std::uint32_t weight_block, std::uint32_t gradient_block,
    const training_precision& pr = mixed_precision_adam) {
  const auto per_element = [](std::uint32_t block, std::size_t exact) {
    return block == 0 ? static_cast<double>(exact) : 1.0 + 4.0 / static_cast<double>(block);
  };
  const double moved = psi * (n - 1) / n;
  return {2 * moved * per_element(weight_block, pr.parameter_bytes),
          moved * per_element(gradient_block, pr.gradient_bytes)};
}

}  // namespace zest
