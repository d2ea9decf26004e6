// zest/zero/step_inventory.hpp — every collective of one training step of a transformer, per
// mesh axis: kind, calls and bytes this rank sends, derived from the model, the mesh and the
// ZeRO plan before anything runs.
//
//   zest::step_inventory inv = zest::inventory_step(config, layout, states, zest::fp32_adam);
//   std::cout << inv;                       // explain: one line per collective and axis
//   inv.total("tp", zest::collective::all_gather).bytes
//
// A training run records the same figures (train_step_result::traffic_by_axis), and they are
// equal: tests/train/train_gpt_checks.py compares them for every parallel shape train_gpt runs.
// The cost model (zest/zero/cost_model.hpp) prices these lines, so the planner's bytes are
// these.
//
// What a step of zest's GPT sends (per rank; A = b s h the activations of a micro-batch of
// this data rank, R = b s its rows, e the element bytes, L layers, n the axis's ranks; a
// gather's or reduce-scatter's bytes are (n-1)/n of the whole, an all-reduce's twice that, an
// all-to-all's (n-1)/n of this rank's buffer):
//   data axes  ZeRO's phases from the plan (plan_zero): per group of parameters (the
//              embeddings, each block, the head) one coalesced collective per axis and step,
//              the gradients' per bucket; stage 3's gathers and stages 2-3's reductions per
//              micro-batch, the rest per step.
//   tensor     Megatron: per micro-batch 4L + 2 all-reduces of A (attention and MLP outputs
//              forward, their inputs' gradients backward, the vocabulary-parallel embedding
//              and head), 2 more per layer under full recomputation; with sequence
//              parallelism each becomes an all-gather and a reduce-scatter of A, and the ids
//              and targets (int32, R each) and the position table's gradient (s h) are
//              all-gathered. The cross entropy's row maxima, sums and target logits (3 x R),
//              the loss's gradient (one value), and per micro-batch one all-reduce of each
//              weight replicated over tp (norms, row-parallel biases, positions, the router).
//   sequence   Ulysses: per layer and micro-batch 8 all-to-alls (q, k, v and the output,
//              forward and backward; 4 more under full recomputation) of A / (sp tp); per
//              micro-batch one all-reduce of every weight's gradient (the sequence is data
//              to the weights) and an all-gather of the position table's (s h).
//   expert     per expert layer and micro-batch 4 all-to-alls (dispatch and combine, forward
//              and backward; 2 more under full recomputation) of E b C h (C the capacity of
//              a sequence, the routing's group); dropless, an all-to-all of the E counts (int64) and 4 per
//              expert of this rank, whose bytes follow the routing (the line's bytes are the
//              most they can be).
//   weights    a weight's gradient is partial over each axis it is replicated on while the
//              tokens are split on it (tp: the weights whole on tp; sp: all; ep: all but the
//              experts), and goes to the weight's layout by the plan the layout search gives
//              its dims and extents: over one such axis an all-reduce per weight; over two, a
//              reduce-scatter, an all-reduce of the piece and an all-gather, or two
//              all-reduces (a 3-dim attention weight), whichever the search prices lower.
//   whole      zest's expert layers take whole sequences (their experts whole on every tp
//              rank): where the stream is split on the sequence (tp under Megatron's SP, sp
//              under Ulysses), forward its input brought whole, backward the output's
//              gradient brought whole and the input's (partial over those axes) back, each as
//              the layout search plans it; they are no tensor-parallel region (not counted
//              in the 4L + 2).
// An axis of one rank sends nothing and has no line. Not derived: experts split over tp,
// and experts under tp without sequence parallelism (the inventory says so in not_exact).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/comm/communicator.hpp"
#include "zest/core/error.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/plan_cache.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"
#include "zest/layout/wire.hpp"
#include "zest/plan/explain.hpp"
#include "zest/zero/expert_capacity.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/stage.hpp"
#include "zest/zero/transformer_plan.hpp"

namespace zest {

// One kind of collective over one axis: how many calls, and the bytes this rank sends in them.
struct inventory_line {
  std::string axis;
  collective kind = collective::all_reduce;
  std::uint64_t calls = 0;
  std::uint64_t bytes = 0;
  bool data_dependent = false;  // the bytes follow the routing (dropless experts): at most these
  std::string what;
};

struct collective_tally {
  std::uint64_t calls = 0;
  std::uint64_t bytes = 0;
  bool data_dependent = false;
  constexpr bool operator==(const collective_tally&) const = default;
};

class step_inventory {
 public:
  std::string model;
  std::string mesh;
  // Where the derivation does not follow zest's run exactly, what differs; empty when it does.
  std::string not_exact;

  // Adds a line; none for an axis of one rank or for no calls.
  void add(std::string axis, int ranks, collective kind, std::uint64_t calls, std::uint64_t bytes,
           std::string what, bool data_dependent = false) {
    if (ranks <= 1 || calls == 0) return;
    lines_.push_back({std::move(axis), kind, calls, bytes, data_dependent, std::move(what)});
  }
  const std::vector<inventory_line>& lines() const { return lines_; }

  // The axes with lines, in the order they first appear.
  std::vector<std::string> axes() const {
    std::vector<std::string> out;
    for (const auto& l : lines_) {
      if (std::find(out.begin(), out.end(), l.axis) == out.end()) out.push_back(l.axis);
    }
    return out;
  }
  collective_tally total(std::string_view axis, collective kind) const {
    collective_tally t;
    for (const auto& l : lines_) {
      if (l.axis != axis || l.kind != kind) continue;
      t.calls += l.calls;
      t.bytes += l.bytes;
      t.data_dependent = t.data_dependent || l.data_dependent;
    }
    return t;
  }
  std::uint64_t bytes() const {
    std::uint64_t b = 0;
    for (const auto& l : lines_) b += l.bytes;
    return b;
  }
  std::uint64_t calls() const {
    std::uint64_t n = 0;
    for (const auto& l : lines_) n += l.calls;
    return n;
  }

  std::string str() const {
    std::ostringstream out;
    out << *this;
    return out.str();
  }
  // explain: per axis, each collective's kind, calls and bytes, what it carries, and the
  // axis's totals by kind.
  friend std::ostream& operator<<(std::ostream& out, const step_inventory& inv) {
    out << "collectives of one training step of " << inv.model << " on " << inv.mesh
        << " (bytes this rank sends)\n";
    if (!inv.not_exact.empty()) out << "  not exact: " << inv.not_exact << '\n';
    if (inv.lines_.empty()) out << "  none: every axis has one rank\n";
    for (const std::string& axis : inv.axes()) {
      out << "  " << axis << '\n';
      for (const auto& l : inv.lines_) {
        if (l.axis != axis) continue;
        std::ostringstream row;
        row << "    " << std::left << std::setw(15) << name_of(l.kind) << std::right << std::setw(6)
            << l.calls << " x  " << std::setw(12)
            << (l.data_dependent ? "<= " : "") + std::to_string(l.bytes) << " B  " << l.what;
        out << row.str() << '\n';
      }
      for (std::size_t k = 0; k < collective_kinds; ++k) {
        const collective_tally t = inv.total(axis, static_cast<collective>(k));
        if (t.calls == 0) continue;
        out << "    = " << std::left << std::setw(13) << name_of(static_cast<collective>(k))
            << std::right << std::setw(6) << t.calls << " calls " << std::setw(12)
            << (t.data_dependent ? "<= " : "") + std::to_string(t.bytes) << " B\n";
      }
    }
    return out;
  }

 private:
  std::vector<inventory_line> lines_;
};

// The names of the mesh axes that play each role (the ZeRO plan names its own data axes).
struct inventory_axes {
  std::string tensor = "tp";
  std::string sequence = "sp";
  std::string expert = "ep";
};

namespace detail {

// Bytes one rank sends: a gather or reduce-scatter of `whole` elements, an all-reduce of
// them, an all-to-all of a buffer of `held` (communicator.hpp's model).
constexpr std::uint64_t gathered_bytes(std::uint64_t whole, int n, std::uint64_t e) {
  return n <= 1 ? 0 : whole * static_cast<std::uint64_t>(n - 1) / static_cast<std::uint64_t>(n) * e;
}
constexpr std::uint64_t all_reduced_bytes(std::uint64_t whole, int n, std::uint64_t e) {
  return 2 * gathered_bytes(whole, n, e);
}

}  // namespace detail

// The collectives of one optimizer step (p.accumulation micro-batches of p.micro_batch
// sequences on each data rank) of model `c` laid out as `p`, for the rank the ZeRO plan
// `states` was made for (its mesh, stage and blocks: plan_zero on the run's own mesh and
// model shape, or plan_transformer's). `precision` gives the element sizes of what the
// activation collectives move (parameter_bytes: activations, the cross entropy's
// statistics) and of the weights' gradients on the tape (gradient_bytes); zest's tape holds
// float whatever the policy, so a zest run's inventory takes fp32_adam here (the ZeRO plan
// keeps the run's own precision), while the planner's GPU model keeps 2-byte activations.
// Sequences split unevenly over tp or sp are not derived (not_exact).
inline step_inventory inventory_step(const transformer_config& c, const parallel_layout& p,
                                     const zero_plan& states,
                                     const training_precision& precision = mixed_precision_adam,
                                     const inventory_axes& names = {}) {
  check_transformer(c, p);
  step_inventory inv;
  inv.model = c.name;
  inv.mesh = states.mesh;
  using enum collective;
  const std::uint64_t micro = p.accumulation;
  const auto e = static_cast<std::uint64_t>(precision.parameter_bytes);
  const auto g = static_cast<std::uint64_t>(precision.gradient_bytes);
  const std::uint64_t L = c.layers, h = c.hidden, s = c.sequence, b = p.micro_batch;
  const std::uint64_t rows = b * s, A = rows * h;
  const bool full = p.recompute == recomputation::full;
  const auto seq_ranks = static_cast<std::uint64_t>((p.sequence_parallel ? p.tp : 1) * p.sp);
  if (s % seq_ranks != 0) {
    inv.not_exact = detail::message("the sequence (", s, ") does not divide over the ", seq_ranks,
                                    " ranks that split it: uneven blocks are not derived");
  }

  // Data axes: ZeRO's phases.
  for (zero_phase phase : zero_phases) {
    const phase_traffic& t = states.of(phase);
    const bool per_micro = phase == zero_phase::forward_gather ||
                           phase == zero_phase::backward_gather ||
                           (phase == zero_phase::gradient_reduction && states.stage >= 2);
    const std::uint64_t times = per_micro ? micro : 1;
    for (std::size_t a = 0; a < states.axes.size(); ++a) {
      for (std::size_t k = 0; k < collective_kinds; ++k) {
        inv.add(states.axes[a], states.axis_sizes[a], static_cast<collective>(k),
                times * t.calls_on[a][k], times * t.bytes_on[a][k],
                std::string("ZeRO ") + std::string(name_of(phase)));
      }
    }
  }

  // The weights of this rank's blocks over tp and ep, by what their gradients need.
  const transformer_plan_mesh placed({1, p.tp, p.ep});
  const std::vector<placed_weight> weights = place_weights(c, placed);

  // Tensor parallel (Megatron), sequence parallel between its regions or not, on the part of
  // the sequence that Ulysses leaves this rank.
  const std::string& tp = names.tensor;
  const auto ulysses = static_cast<std::uint64_t>(p.sp);
  const std::uint64_t activations = (4 * L + 2 + (full ? 2 * L : 0)) * micro;
  // Expert layers whose experts are whole on every tp rank are no tensor-parallel region:
  // they take whole sequences (below), so they are not counted as MLPs here.
  const bool whole_experts = c.experts > 0 && !c.experts_split_over_tp;
  const std::uint64_t regions =
      activations - (whole_experts && p.sequence_parallel ? 2 * c.moe_layers() * micro : 0);
  if (p.sequence_parallel) {
    inv.add(tp, p.tp, all_gather, regions, regions * detail::gathered_bytes(A / ulysses, p.tp, e),
            "activations into the tensor-parallel regions (forward; recomputed)");
    inv.add(tp, p.tp, reduce_scatter, regions,
            regions * detail::gathered_bytes(A / ulysses, p.tp, e),
            "activations out of them (forward), gradients into them (backward)");
    inv.add(tp, p.tp, all_gather, 2 * micro,
            2 * micro * detail::gathered_bytes(rows / ulysses, p.tp, 4),
            "the ids and the targets (int32)");
  } else {
    inv.add(tp, p.tp, all_reduce, activations,
            activations * detail::all_reduced_bytes(A / ulysses, p.tp, e),
            "the regions' outputs (forward) and inputs' gradients (backward)");
  }
  inv.add(tp, p.tp, all_reduce, 3 * micro,
          3 * micro * detail::all_reduced_bytes(rows / ulysses, p.tp, e),
          "cross entropy over the split vocabulary: row maxima, sums, target logits");
  // The loss's gradient, one value: rank 0 holds it (a balanced block of 1), the others send.
  inv.add(tp, p.tp, all_reduce, micro, 0, "the loss's gradient (one value, held by rank 0)");
  // The layout search plans on the run's own mesh (its choices depend on every axis, those
  // of one rank included): the ZeRO plan's axes, then any role's axis they lack.
  std::vector<std::string> mesh_axes = states.axes;
  std::vector<int> mesh_sizes = states.axis_sizes;
  const auto axis_of = [&](const std::string& name, int ranks) {
    const auto at = std::find(mesh_axes.begin(), mesh_axes.end(), name);
    if (at != mesh_axes.end()) return static_cast<std::size_t>(at - mesh_axes.begin());
    mesh_axes.push_back(name);
    mesh_sizes.push_back(ranks);
    return mesh_axes.size() - 1;
  };
  const std::array<std::size_t, 3> role_axis{axis_of(names.expert, c.experts > 0 ? p.ep : 1),
                                             axis_of(names.tensor, p.tp),
                                             axis_of(names.sequence, p.sp)};
  const std::array<int, 3> role_sizes{c.experts > 0 ? p.ep : 1, p.tp, p.sp};
  if (mesh_axes.size() > max_axes) {
    throw shape_error(detail::message("zest: inventory_step: ", mesh_axes.size(),
                                      " mesh axes; the layout search takes ", max_axes));
  }
  // Each axis's tally of one kind of transition, added as lines (`what`) at the end.
  std::vector<std::array<collective_tally, collective_kinds>> tally(mesh_axes.size());
  const auto plan_into = [&](layout_value from, layout_value to, const transition_shape& shape,
                             std::uint64_t times, std::uint64_t element) {
    layout_value v = from;
    for (const transition_step& st : detail::cached_transition_plan(from, to, shape)) {
      if (is_collective(st.kind)) {
        collective_tally& t = tally[st.axis][static_cast<std::size_t>(st.kind)];
        t.calls += times;
        t.bytes += times * detail::step_wire_bytes(st, v, shape, detail::mesh_coords{},
                                                   wire_format{}, element);
      }
      v = detail::after_step(v, st);
    }
  };
  const auto add_tally = [&](const char* what) {
    for (std::size_t a = 0; a < mesh_axes.size(); ++a) {
      for (std::size_t k = 0; k < collective_kinds; ++k) {
        inv.add(mesh_axes[a], mesh_sizes[a], static_cast<collective>(k), tally[a][k].calls,
                tally[a][k].bytes, what);
        tally[a][k] = {};
      }
    }
  };

  // The weights' gradients: partial over each axis the weight is replicated on while the
  // tokens are split on it (tp for the weights whole on tp, sp for all, ep for all but the
  // experts), brought to the weight's own layout by the plan the layout search picks for its
  // dims and extents (what redistribute runs): over one axis an all-reduce; over two, a
  // reduce-scatter, an all-reduce of the piece and an all-gather back, or two all-reduces,
  // as the shape makes cheaper.
  for (const placed_weight& w : weights) {
    const std::array<bool, 3> partial{w.kind != weight_kind::expert, w.replicated_over_tp, true};
    layout_value own = replicated_layout(mesh_axes.size());
    if (w.ep_dim >= 0)
      own.axes[role_axis[0]] = {placement_kind::split, static_cast<char>('a' + w.ep_dim), 0};
    if (w.tp_dim >= 0)
      own.axes[role_axis[1]] = {placement_kind::split, static_cast<char>('a' + w.tp_dim), 0};
    layout_value summed = own;
    bool any = false;
    for (std::size_t r = 0; r < 3; ++r) {
      if (role_sizes[r] > 1 && partial[r]) {
        summed.axes[role_axis[r]] = {placement_kind::partial, 0, 0};
        any = true;
      }
    }
    if (!any) continue;
    std::string dims;
    for (std::size_t i = 0; i < w.global.extents.size(); ++i) dims += static_cast<char>('a' + i);
    plan_into(summed, own, make_transition_shape(dims, w.global.extents, mesh_sizes), micro, g);
  }
  add_tally("gradients of the weights replicated over it (each weight's plan)");
  if (p.sequence_parallel && c.position_table) {
    inv.add(tp, p.tp, all_gather, micro, micro * detail::gathered_bytes(s * h / ulysses, p.tp, g),
            "the position table's gradient, whole");
  }

  // Ulysses: the attention's heads against the sequence.
  const std::string& sp = names.sequence;
  if (p.sp > 1) {
    const std::uint64_t calls = (8 + (full ? 4 : 0)) * L * micro;
    const std::uint64_t held = A / static_cast<std::uint64_t>(p.sp * p.tp);
    inv.add(sp, p.sp, all_to_all, calls, calls * detail::gathered_bytes(held, p.sp, e),
            "q, k, v and the attention's output between sequence and heads");
    if (c.position_table) {
      inv.add(sp, p.sp, all_gather, micro, micro * detail::gathered_bytes(s * h, p.sp, g),
              "the position table's gradient, whole");
    }
  }

  // The expert layers' whole sequences, where the stream is split on the sequence (over tp
  // under Megatron's SP, over sp under Ulysses): forward the input brought whole, backward
  // the output's gradient brought whole from this rank's slice and the input's gradient,
  // partial over those axes (every rank ran the experts on the same tokens), back to the
  // stream's layout; each by the plan the layout search gives "btm" [b, s, h] (b this data
  // rank's sequences).
  const bool split_stream = p.sequence_parallel || p.sp > 1;
  if (whole_experts && split_stream) {
    layout_value stream = replicated_layout(mesh_axes.size());
    layout_value whole = stream, summed = stream;
    std::uint8_t order = 0;
    for (std::size_t r : {std::size_t{2}, std::size_t{1}}) {  // tp nested inside sp on t
      if (role_sizes[r] > 1 && (r == 2 || p.sequence_parallel)) {
        stream.axes[role_axis[r]] = {placement_kind::split, 't', order++};
        summed.axes[role_axis[r]] = {placement_kind::partial, 0, 0};
      }
    }
    const transition_shape shape = make_transition_shape(
        std::string_view("btm"), std::array<std::size_t, 3>{b, s, h}, mesh_sizes);
    const std::uint64_t moe = c.moe_layers() * micro;
    plan_into(stream, whole, shape, 2 * moe, e);  // the input forward, the output's gradient
    plan_into(summed, stream, shape, moe, e);     // the input's gradient backward
    add_tally("the expert layers' whole sequences (forward) and their gradients (backward)");
  }

  // Experts.
  const std::string& ep = names.expert;
  if (c.experts > 0) {
    if (p.tp > 1 && !p.sequence_parallel) {
      inv.not_exact = "expert layers under tp without sequence parallelism are not derived";
    } else if (p.tp > 1 && c.experts_split_over_tp) {
      inv.not_exact =
          "experts split over tp (Megatron's expert tensor parallelism) are not derived";
    }
    const std::uint64_t E = c.experts, moe = c.moe_layers();
    const std::uint64_t tokens = rows, local = E / static_cast<std::uint64_t>(p.ep);
    // Each sequence is a group of the routing (its capacity counted over its s tokens).
    if (c.dropless) {
      inv.add(ep, p.ep, all_to_all, moe * micro, moe * micro * detail::gathered_bytes(E, p.ep, 8),
              "dropless: tokens per expert (int64)");
      // Dispatch and combine, each one call per expert of this rank, forward and backward.
      const std::uint64_t calls = (4 + (full ? 2 : 0)) * local * moe * micro;
      // At most every routed token goes to other ranks: k tokens' h values and their weights.
      const std::uint64_t most = c.top_k * tokens * (h * e + 2 * 4);
      inv.add(ep, p.ep, all_to_all, calls, calls * most,
              "dropless: the routed tokens and their weights, out and back", true);
    } else {
      const std::uint64_t C = expert_capacity(s, E, static_cast<int>(c.top_k), c.capacity_factor);
      const std::uint64_t calls = (4 + (full ? 2 : 0)) * moe * micro;
      inv.add(ep, p.ep, all_to_all, calls, calls * detail::gathered_bytes(E * b * C * h, p.ep, e),
              "dispatch and combine of E x C slots per sequence (forward and backward)");
    }
  }
  return inv;
}

}  // namespace zest
