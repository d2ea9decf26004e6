// zest/moe/moe_layer.hpp — GShard's Mixture-of-Experts feed-forward layer.
//
//   using policy = zest::training_policy<zest::mesh<"dp", "ep">, zest::zero_stage<3>>;
//   zest::moe::moe_layer<policy> ffn(engine, "h0.moe", width, hidden, /*experts=*/8,
//                                    {.top_k = 2, .capacity_factor = 1.25});
//   auto y = ffn(x);                                // x "btm" split<'b', "dp", "ep">
//   auto loss = nll + autodiff::scale(ffn.aux_loss(), 0.01F);
//
// A drop-in for zest::mlp: "btm" in, "btm" out, in x's layout. A sequence is a group:
//
//   x "btm" -> "gsm"                                   relabel (free)
//   logits  "gsm,me->gse"                              gate "me", fp32, no communication
//   routing moe::gating (top-k: 2 GShard, 1 Switch, any k; capacity C, or dropless)
//   dispatch "egcm"                                    dispatch_by_index, or the einsum
//                                                      "gsec,gsm->egcm" (index_path = false)
//   all-to-all to the experts                          g's ExpertAxis split moves to e
//   experts "egcm,emh->egch", GELU, "egch,ehm->egcm"   (+ biases "eh", "em")
//   all-to-all back, combine "gsm"                     combine_by_index, or "gsec,egcm->gsm"
//   "gsm" -> "btm"
//
// Parameters: the gate "me" is replicated (ZeRO partitions it over the data axis like any
// weight); the experts' weights "emh", "ehm" and biases "eh", "em" are split<'e', ExpertAxis>
// (each rank of the expert axis holds E / size experts) and ZeRO partitions a dim other than
// e over the data axis (m, h, h, m). Their gradients arrive partial over the data axis only.
//
// E must divide over the expert axis. Axis sizes are run-time values, so the constructor
// checks (zest::shape_error naming E and the size); with both Experts and ExpertAxisSize
// given as template arguments the check is a compile-time error, and the constructor checks
// that the mesh and E agree with them.
//
// With options.dropless the dispatch, experts and combine are moe::dropless_experts
// (zest/moe/dropless.hpp): each expert computes exactly its routed tokens, nothing is dropped,
// and the all-to-alls carry the per-expert counts first.
//
// With options.bias_update_rate > 0 the layer balances without an auxiliary loss
// (DeepSeek-V3): a bias per expert, added to the probabilities for the choice of experts only,
// starts at 0 and is updated by update_routing_bias() after each step (bias_e += rate *
// sign(mean load - load_e), the load of the last forward counted over all ranks, so the bias
// is the same on every rank). It is state: save routing_bias() with a checkpoint and give it
// back with set_routing_bias().
//
// Collectives never depend on the routing: the capacity fixes every shape, so a rank whose
// experts receive no token sends and receives its blocks like any other; the dropless path
// calls the same all-to-alls everywhere, with counts that differ. The aux loss, the
// z-loss and the statistics of the last forward are kept: the caller adds k · aux_loss().
//
// Every backend: the layer is gating, dispatch and combine (zest/moe/gating.hpp,
// zest/moe/dispatch.hpp: function objects on the device off the host backend, no host copy
// of the routing but its counts) and autodiff's einsums and elementwise operations.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/relabel.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/source_site.hpp"
#include "zest/layout/layout.hpp"
#include "zest/moe/dispatch.hpp"
#include "zest/moe/dropless.hpp"
#include "zest/moe/gating.hpp"
#include "zest/zero/engine.hpp"
#include "zest/zero/parameter.hpp"
#include "zest/zero/stage.hpp"

namespace zest::moe {

namespace layer_error {
using zest::detail::always_false;
// Instantiated with E and the expert axis size, shown above the message.
template <std::size_t Experts, std::size_t ExpertAxisSize>
struct experts_not_divisible {
  static_assert(always_false<std::integral_constant<std::size_t, Experts>,
                             std::integral_constant<std::size_t, ExpertAxisSize>>,
                "zest moe_layer: the number of experts is not divisible by the expert axis size "
                "(experts_not_divisible<E, size> above); each rank of the expert axis holds E / "
                "size experts. Fix: make E a multiple of the expert axis size.");
};
template <class Mesh, fixed_string ExpertAxis>
struct no_expert_axis {
  static_assert(
      always_false<Mesh>,
      "zest moe_layer: the mesh has no axis named like ExpertAxis (both shown above). "
      "Fix: moe_layer<P, \"ep\"> with one of the mesh's axes, e.g. mesh<\"dp\", \"ep\">.");
};
template <class Mesh, fixed_string ExpertAxis>
struct expert_axis_is_data_axis {
  static_assert(always_false<Mesh>,
                "zest moe_layer: the expert axis is one of the ZeRO stage's data axes (shown "
                "above); experts are split over their own axis, and ZeRO partitions them over "
                "the data axes. Fix: a mesh with a separate expert axis, e.g. "
                "mesh<\"dp\", \"ep\">.");
};
}  // namespace layer_error

namespace detail {
template <class Mesh, fixed_string ExpertAxis, unsigned DataMask, std::size_t Experts,
          std::size_t ExpertAxisSize>
constexpr bool check_layer() {
  constexpr std::size_t axis = axis_index_of<Mesh>(view_of<ExpertAxis>);
  if constexpr (axis == Mesh::axis_count) {
    (void)layer_error::no_expert_axis<Mesh, ExpertAxis>{};
    return false;
  } else if constexpr ((DataMask >> axis & 1U) != 0) {
    (void)layer_error::expert_axis_is_data_axis<Mesh, ExpertAxis>{};
    return false;
  } else if constexpr (Experts != 0 && ExpertAxisSize != 0 &&
                       Experts % (ExpertAxisSize == 0 ? 1 : ExpertAxisSize) != 0) {
    // (The divisor is guarded again: nvcc warns of % 0 even where && skips it.)
    (void)layer_error::experts_not_divisible<Experts, ExpertAxisSize>{};
    return false;
  } else {
    return true;
  }
}

// A scalar pending on every mesh axis: where a loss of any token layout can be kept (going
// there from replicate keeps the value on coordinate 0 — no communication either way).
constexpr layout_value pending_everywhere(std::size_t axes) {
  layout_value v = replicated_layout(axes);
  for (std::size_t a = 0; a < axes; ++a) v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
  return v;
}

// x as a variable of type Y: itself if it is one, else redistributed (on the tape).
template <class Y, sharded_tensor X>
autodiff::variable<Y> conform(autodiff::variable<X> x) {
  if constexpr (std::is_same_v<X, Y>) {
    return x;
  } else {
    return autodiff::redistribute<Y::layout>(x);
  }
}
}  // namespace detail

template <training_policy_type P, fixed_string ExpertAxis = P::roles::expert,
          std::size_t Experts = 0, std::size_t ExpertAxisSize = 0>
class moe_layer {
  using mesh_t = typename P::mesh_type;
  static_assert(detail::check_layer<mesh_t, ExpertAxis, P::data_mask, Experts, ExpertAxisSize>());
  static constexpr std::size_t expert_axis = detail::axis_index_of<mesh_t>(view_of<ExpertAxis>);
  using expert_base = layout<split<'e', ExpertAxis>>;
  static constexpr layout_value scalar_layout = detail::pending_everywhere(mesh_t::axis_count);

 public:
  using gate_type = parameter<P, "me">;
  using in_weight_type = parameter<P, "emh", expert_base, split_dim_named<'m'>>;
  using in_bias_type = parameter<P, "eh", expert_base, split_dim_named<'h'>>;
  using out_weight_type = parameter<P, "ehm", expert_base, split_dim_named<'h'>>;
  using out_bias_type = parameter<P, "em", expert_base, split_dim_named<'m'>>;
  // The aux loss and z-loss of the last forward: float scalars pending on every axis (add
  // them to a loss of any layout; a sum's pending axes meet with no communication).
  using scalar_tensor = basic_tensor<float, mesh_t, autodiff::detail::no_dims, scalar_layout>;
  using scalar_variable = autodiff::variable<scalar_tensor>;

  // Gate and expert weights ~ N(0, 0.02) (the experts' output ~ N(0, residual_std)), biases 0.
  moe_layer(zero_engine<P>& engine, const std::string& name, std::size_t width, std::size_t hidden,
            std::size_t experts, const gating_options& options = {}, bool index_path = true,
            bool expert_biases = true, double residual_std = 0.02)
      : experts_(checked_experts(engine.mesh(), name, experts)),
        mesh_(&engine.mesh()),
        name_(name),
        options_(options),
        index_path_(index_path),
        gate_(engine, name + ".gate.weight", {width, experts}, init::normal{0.02}),
        w_in_(engine, name + ".experts.fc.weight", {experts, width, hidden}, init::normal{0.02}),
        w_out_(engine, name + ".experts.proj.weight", {experts, hidden, width},
               init::normal{residual_std}) {
    if (expert_biases) {
      b_in_.emplace(engine, name + ".experts.fc.bias",
                    typename in_bias_type::extents_type{experts, hidden}, init::constant{0.0},
                    /*decay=*/false);
      b_out_.emplace(engine, name + ".experts.proj.bias",
                     typename out_bias_type::extents_type{experts, width}, init::constant{0.0},
                     /*decay=*/false);
    }
  }
  moe_layer(const moe_layer&) = delete;
  moe_layer& operator=(const moe_layer&) = delete;

  // x "btm" (any three dims: batch, time, model) -> the same type. The routing's random
  // draws use options().seed; the second overload sets it for this call (vary it per step).
  template <sharded_tensor X>
  autodiff::variable<X> operator()(const autodiff::variable<X>& x,
                                   source_site at = source_site::current()) const {
    const user_call user(at);
    return forward(x, options_);
  }
  template <sharded_tensor X>
  autodiff::variable<X> operator()(const autodiff::variable<X>& x, std::uint64_t seed,
                                   source_site at = source_site::current()) const {
    const user_call user(at);
    gating_options o = options_;
    o.seed = seed;
    return forward(x, o);
  }

  // The last forward's aux loss (1 at perfect balance; add k · aux_loss() to the loss) and
  // router z-loss (weighted by options().z_loss_weight if the caller uses it).
  const scalar_variable& aux_loss() const { return last("aux_loss", aux_); }
  const scalar_variable& z_loss() const { return last("z_loss", z_); }
  // The last forward's routing counts on this rank, capacity, and all-to-all bytes per rank
  // (all_to_all_bytes(): what the expert axis' counters add over its forward and backward).
  const routing_stats& stats() const { return stats_; }
  std::size_t capacity() const { return capacity_; }
  const all_to_all_volume& last_all_to_all() const { return volume_; }

  // Balancing without an auxiliary loss: the bias per expert added to the routing scores
  // (empty: none). update_routing_bias() sums the last forward's routed assignments per expert
  // over all ranks (one all-reduce of E numbers on every rank, a collective) and moves each
  // bias by options().bias_update_rate towards the mean load; returns the load.
  const std::vector<double>& routing_bias() const { return routing_bias_; }
  void set_routing_bias(std::vector<double> bias) {
    if (!bias.empty() && bias.size() != experts_) {
      throw shape_error(zest::detail::message("zest: moe_layer '", name_, "': set_routing_bias: ",
                                              bias.size(), " values for ", experts_, " experts"));
    }
    routing_bias_ = std::move(bias);
  }
  std::vector<std::int64_t> update_routing_bias(source_site at = source_site::current()) {
    const user_call user(at);
    if (stats_.routed_per_expert.size() != experts_) {
      throw std::logic_error(zest::detail::message(
          "zest moe_layer '", name_, "': update_routing_bias() before the first forward"));
    }
    std::vector<double> load(stats_.routed_per_expert.begin(), stats_.routed_per_expert.end());
    mesh_->world().all_reduce(std::span<double>(load), reduce_op::sum);
    std::vector<std::int64_t> out(experts_);
    double total = 0;
    for (std::size_t e = 0; e < experts_; ++e) {
      out[e] = std::llround(load[e]);
      total += static_cast<double>(out[e]);
    }
    const double rate = options_.bias_update_rate;
    if (rate > 0) {
      if (routing_bias_.empty()) routing_bias_.assign(experts_, 0.0);
      const double mean = total / static_cast<double>(experts_);
      for (std::size_t e = 0; e < experts_; ++e) {
        const double gap = mean - static_cast<double>(out[e]);
        routing_bias_[e] += gap > 0 ? rate : gap < 0 ? -rate : 0.0;
      }
    }
    return out;
  }

  std::size_t experts() const { return experts_; }
  bool index_path() const { return index_path_; }
  void set_index_path(bool on) { index_path_ = on; }
  const gating_options& options() const { return options_; }
  gating_options& options() { return options_; }

  const gate_type& gate() const { return gate_; }
  const in_weight_type& in_weight() const { return w_in_; }
  const out_weight_type& out_weight() const { return w_out_; }
  bool has_biases() const { return b_in_.has_value(); }
  const in_bias_type& in_bias() const { return *b_in_; }
  const out_bias_type& out_bias() const { return *b_out_; }

 private:
  static std::size_t checked_experts(const mesh_t& mesh, const std::string& name,
                                     std::size_t experts) {
    const auto size = static_cast<std::size_t>(mesh.size(expert_axis));
    const std::string at = zest::detail::message("zest: moe_layer '", name, "': ");
    if (experts == 0) throw shape_error(at + "needs at least one expert");
    if (Experts != 0 && experts != Experts) {
      throw shape_error(zest::detail::message(at, "E = ", experts,
                                              " experts, but the layer's type says ", Experts));
    }
    if (ExpertAxisSize != 0 && size != ExpertAxisSize) {
      throw shape_error(zest::detail::message(at, "the expert axis '", view_of<ExpertAxis>,
                                              "' has size ", size, ", but the layer's type says ",
                                              ExpertAxisSize));
    }
    if (experts % size != 0) {
      throw shape_error(zest::detail::message(
          at, "E = ", experts, " experts do not divide over the expert axis '", view_of<ExpertAxis>,
          "' of size ", size, "; each rank of the axis holds E / size experts. Fix: a multiple of ",
          size, " experts, or another mesh shape"));
    }
    return experts;
  }

  const scalar_variable& last(const char* what, const std::optional<scalar_variable>& v) const {
    if (!v) {
      throw std::logic_error(
          zest::detail::message("zest moe_layer: ", what, "() before the first forward"));
    }
    return *v;
  }

  template <sharded_tensor X>
  autodiff::variable<X> forward(const autodiff::variable<X>& x, const gating_options& o) const {
    static_assert(X::rank == 3,
                  "zest moe_layer: the input has three dims, batch, time and model (\"btm\"); a "
                  "sequence is a group of tokens. Fix: relabel or reshape to three dims.");
    auto xg = autodiff::relabel<"gsm">(x);
    using tokens_t = typename decltype(xg)::tensor_type;
    using dispatched_t = basic_tensor<typename X::value_type, mesh_t, "egcm", tokens_t::layout>;
    auto logits = autodiff::einsum<"gsm,me->gse">(xg, gate_.value());
    gating_options routing_options = o;
    // The index path and the dropless one need no one-hot tensors.
    routing_options.one_hot = !index_path_ && !o.dropless;
    if (!routing_bias_.empty()) routing_options.routing_bias = routing_bias_;
    auto r = gating(logits, routing_options);
    const std::size_t capacity = r.capacity;
    if (o.dropless) {
      all_to_all_volume volume;
      auto z = b_in_ ? dropless_experts<ExpertAxis>(xg, r.weight, r.expert_index, r.slot_index,
                                                    w_in_.value(), b_in_->value(), w_out_.value(),
                                                    b_out_->value(), &volume)
                     : dropless_experts<ExpertAxis>(xg, r.weight, r.expert_index, r.slot_index,
                                                    w_in_.value(), w_out_.value(), &volume);
      aux_.emplace(detail::conform<scalar_tensor>(r.aux_loss));
      z_.emplace(detail::conform<scalar_tensor>(r.z_loss));
      stats_ = std::move(r.stats);
      capacity_ = capacity;
      volume_ = volume;
      return autodiff::relabel<X::dims>(z);
    }

    auto dispatched = index_path_
                          ? dispatch_by_index(xg, r.expert_index, r.slot_index, experts_, capacity)
                          : detail::conform<dispatched_t>(autodiff::einsum<"gsec,gsm->egcm">(
                                xg.owner().constant(std::move(r.dispatch)), xg));
    auto h = to_expert_layout<ExpertAxis>(dispatched);
    auto f = b_in_ ? expert_feed_forward(h, w_in_.value(), b_in_->value(), w_out_.value(),
                                         b_out_->value())
                   : expert_feed_forward(h, w_in_.value(), w_out_.value());
    auto y = to_token_layout<dispatched_t::layout>(f);
    auto z = index_path_
                 ? combine_by_index(y, r.weight, r.expert_index, r.slot_index)
                 : detail::conform<tokens_t>(autodiff::einsum<"gsec,egcm->gsm">(r.combine, y));

    aux_.emplace(detail::conform<scalar_tensor>(r.aux_loss));
    z_.emplace(detail::conform<scalar_tensor>(r.z_loss));
    stats_ = std::move(r.stats);
    capacity_ = capacity;
    volume_ = all_to_all_bytes<ExpertAxis>(dispatched.value());
    return autodiff::relabel<X::dims>(z);
  }

  std::size_t experts_;
  const mesh_t* mesh_;
  std::string name_;
  gating_options options_;
  std::vector<double> routing_bias_;
  bool index_path_;
  gate_type gate_;
  in_weight_type w_in_;
  out_weight_type w_out_;
  std::optional<in_bias_type> b_in_;
  std::optional<out_bias_type> b_out_;
  mutable std::optional<scalar_variable> aux_, z_;
  mutable routing_stats stats_;
  mutable std::size_t capacity_ = 0;
  mutable all_to_all_volume volume_;
};

}  // namespace zest::moe
