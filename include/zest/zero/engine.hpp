// zest/zero/engine.hpp — the runtime of a ZeRO training step.
//
//   zest::zero_engine<policy> engine(mesh, {.seed = 1});
//   model m(engine);                               // layers register their parameters
//   for (step ...) {
//     zest::autodiff::tape t;
//     auto loss = m.loss(t, inputs, targets);      // layers enter their groups: gathers
//     engine.backward(loss);                       // group hooks: regather, reduce-scatter
//     engine.step(schedule(step));                 // clip, AdamW, publish
//   }
//
// The engine schedules the transitions that the stage's layouts prescribe (zero/stage.hpp)
// for whole groups of parameters at once (a layer or a transformer block); the mover
// (zest/tensor/transition_group.hpp, what redistribute runs too) carries each out as one
// collective per transition and group over the data axes:
//
//   forward, entering a group      stored -> compute     stage 3: all-gather (coalesced);
//                                                        the next group's is prefetched
//   forward, leaving a group       stage 3: the gathered values are freed (hpZ: each keeps a
//                                  secondary copy split over the axes inside a node)
//   backward, before the group     stage 3: all-gather again (the previous group prefetched;
//                                  hpZ: from the secondary copies, inside the node)
//   backward, after the group      gradient -> buffer    stage 0: all-reduce; stage 1: add
//                                                        to the full buffer; stages 2, 3:
//                                                        reduce-scatter; in buckets, issued
//                                                        non-blocking while backward goes on
//   step                           stage 1: reduce-scatter the buffer; global norm, clip,
//                                  AdamW on the owned shard; stages 1, 2: all-gather the
//                                  updated shards (master -> stored)
//
// Under ZeRO++'s qwZ and qgZ (zero_stage<3>::with_quantized_weights<B>,
// ::with_quantized_gradients<B>) the gathers and the gradients' reduce-scatters of the table
// travel as int8 blocks (zest/layout/wire.hpp): the mover encodes and decodes, the engine
// only names the wire of each group transition.
//
// Activation recomputation (options().recompute, zest/autodiff/checkpoint.hpp): a layer
// checkpoints its body inside its group's scope, so the body's one backward step lies between
// the group's two hooks; backward gathers the group (stage 3), recomputes the body on those
// values, runs its steps, then reduces the gradients. The bytes per step are unchanged.
//
// At most `max_live_groups` groups are gathered at once (the one computing and the one
// prefetched). A group without parameters (a layer that has none) is entered like any other
// on every stage; it communicates nothing, never counts as gathered, and prefetches pass over
// it to the next group that holds parameters. Loss, norms and the loss scaler's agreement go over the mesh's world
// communicator, apart from the axis counters that the ZeRO formulas describe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/backend/host/host_backend.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/random.hpp"
#include "zest/core/source_site.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/optim/adamw.hpp"
#include "zest/optim/clip.hpp"
#include "zest/optim/loss_scaler.hpp"
#include "zest/zero/parameter.hpp"
#include "zest/zero/recomputation.hpp"
#include "zest/zero/setup_check.hpp"

namespace zest {

struct zero_options {
  std::uint64_t seed = 1;                                 // parameter initialisation
  std::size_t bucket_elements = default_bucket_elements;  // elements per gradient collective
  std::size_t max_live_groups = 2;                        // gathered groups at once (stage 3), >= 1
  bool prefetch = true;        // gather the next group while this one computes
  double max_grad_norm = 1.0;  // <= 0: no clipping
  adamw_config adam{};
  float initial_loss_scale = 65536.0F;   // float16 policies
  std::int64_t loss_scale_window = 200;  // good steps before the scale grows
  // What the layers recompute in backward instead of keeping (zest/zero/recomputation.hpp):
  // none, selective (the attention core) or full (each block from its input). A block's
  // recomputation runs after its backward gather under stage 3 and uses it: no second gather.
  recomputation recompute = recomputation::none;
};

// What one optimizer step did.
struct step_report {
  bool applied = true;   // false: skipped (inf/nan gradients under loss scaling)
  double grad_norm = 0;  // before clipping, unscaled
  double clip = 1;       // the factor applied to the gradients
  double lr = 0;
  float loss_scale = 1;
};

template <class P>
class zero_engine {
  using mesh_t = typename P::mesh_type;
  using slot = detail::parameter_slot<P>;
  using param_type = typename P::param_type;
  using grad_type = typename P::grad_type;
  using backend_t = backend_of<mesh_t>;
  static constexpr int stage = P::stage::stage;

  struct group {
    std::string name;
    std::vector<slot*> params;
    // Stage 3: the group's gather (stored -> compute), issued by a prefetch or on entry.
    std::unique_ptr<typename slot::template mover<param_type>> gather;
    bool gather_backward = false;  // the gather is backward's (hpZ: from the secondary copies)
    bool live = false;             // the compute values are materialised
    bool in_scope = false;
    bool implicit = false;  // made by add() for a parameter registered outside any group
    bool gathering() const { return gather != nullptr; }
  };
  // A bucket of a group's gradients on its way to the buffers' layout.
  struct reduction {
    std::size_t group = 0;
    std::size_t first = 0, last = 0;  // params [first, last) of the group
    std::unique_ptr<typename slot::template mover<grad_type>> move;
  };

 public:
  zero_engine(const mesh_t& mesh, zero_options options = {})
      : mesh_(&mesh),
        options_(options),
        scaler_(options.initial_loss_scale, 2.0F, 0.5F, options.loss_scale_window) {
    if (options_.max_live_groups == 0) {
      throw shape_error("zest zero_engine: max_live_groups must be at least 1");
    }
  }
  zero_engine(const zero_engine&) = delete;
  zero_engine& operator=(const zero_engine&) = delete;

  const mesh_t& mesh() const { return *mesh_; }
  const zero_options& options() const { return options_; }
  zero_options& options() { return options_; }
  static constexpr int zero_stage() { return stage; }
  // What the layers recompute in backward (options().recompute).
  recomputation recompute() const { return options_.recompute; }

  // The initialisation seed of a parameter: the run's seed and the parameter's name.
  std::uint64_t seed_for(std::string_view name) const {
    std::uint64_t h = splitmix64(options_.seed);
    for (char c : name) h = splitmix64(h ^ static_cast<unsigned char>(c));
    return h;
  }

  // Parameters made between begin_group and end_group are gathered and reduced together.
  std::size_t begin_group(std::string name) {
    if (open_) throw std::logic_error("zest zero_engine: begin_group inside an open group");
    groups_.push_back({});
    groups_.back().name = std::move(name);
    open_ = true;
    return groups_.size() - 1;
  }
  void end_group() { open_ = false; }
  void add(slot& p) {
    for (const auto& g : groups_) {
      for (const slot* q : g.params) {
        if (q->name() == p.name()) {
          throw shape_error(detail::message("zest zero_engine: two parameters named '", p.name(),
                                            "'; parameter names are checkpoint keys"));
        }
      }
    }
    if (!open_) {
      begin_group(p.name());
      groups_.back().params.push_back(&p);
      groups_.back().implicit = true;
      end_group();
      return;
    }
    groups_.back().params.push_back(&p);
  }

  std::size_t group_count() const { return groups_.size(); }
  // The group that holds parameter p (one of its own when p was made outside any group).
  std::size_t group_of(const slot& p) const {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      for (const slot* q : groups_[g].params) {
        if (q == &p) return g;
      }
    }
    throw std::logic_error(detail::message("zest zero_engine: parameter '", p.name(),
                                           "' is not registered with this engine"));
  }
  // Why parameter p is not usable now (it is used outside its group's scope), for the
  // parameter's error message. A parameter made before begin_group was called is a group of
  // its own; when a group begun after it is in scope, that is the slip of a class that
  // declares its group member after the sub-layers: members are constructed in declaration
  // order, whatever the order of the constructor's initialiser list.
  std::string out_of_scope_reason(const slot& p) const {
    const std::size_t own = group_of(p);
    if (groups_[own].implicit) {
      // The first explicit group after p's, with only parameters' own groups in between (the
      // slip's sub-layers): is it in scope?
      std::size_t g = own + 1;
      while (g < groups_.size() && groups_[g].implicit) ++g;
      if (g < groups_.size() && groups_[g].in_scope) {
        return detail::message(
            "; it was made before begin_group(\"", groups_[g].name,
            "\"), outside any group, so it is a group of its own and not in group '",
            groups_[g].name,
            "', which is in scope now. A class member that holds begin_group's result must be "
            "declared before the sub-layers it groups: members are constructed in declaration "
            "order, whatever the order of the initialiser list (-Wreorder warns where they "
            "differ). Fix: move the group member's declaration above the sub-layers' (or call "
            "begin_group in a base class or an earlier member)");
      }
      return detail::message(
          "; it was made outside begin_group/end_group, so it is a group of "
          "its own: enter it with engine.use(tape, engine.group_of(it))");
    }
    return detail::message("; enter its group '", groups_[own].name,
                           "' with engine.use(tape, group) first");
  }
  const std::string& group_name(std::size_t g) const { return groups_[g].name; }
  // The model states (stored copies, masters, Adam's moments) are being read by someone
  // else, an asynchronous checkpoint save (save_training_state_async): the next step, or
  // anything else that changes the states (a checkpoint load), first calls `release`, which
  // returns once they are no longer read. Not collective; several run in order.
  void hold_states(std::function<void()> release) { holds_.push_back(std::move(release)); }
  void release_states() {
    if (holds_.empty()) return;
    const auto start = std::chrono::steady_clock::now();
    auto holds = std::exchange(holds_, {});
    for (auto& release : holds) release();
    held_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // Seconds spent waiting in release_states since the last call: what the holders cost
  // the training (an asynchronous save's shard not yet written when the update came).
  double take_held_seconds() { return std::exchange(held_seconds_, 0.0); }
  std::vector<slot*> parameters() const {
    std::vector<slot*> all;
    for (const auto& g : groups_) all.insert(all.end(), g.params.begin(), g.params.end());
    return all;
  }
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for (const auto& g : groups_)
      for (const slot* p : g.params) n += p->size();
    return n;
  }
  // Gathered groups now, and the most at once since the last reset (stage 3's bound).
  std::size_t live_groups() const {
    return static_cast<std::size_t>(std::count_if(
        groups_.begin(), groups_.end(), [](const group& g) { return g.live || g.gathering(); }));
  }
  std::size_t peak_live_groups() const { return peak_live_; }

  // -------------------------------------------------------------------------------------
  // Forward: a scope per group.

  class scope {
   public:
    scope(zero_engine& e, autodiff::tape& t, std::size_t g) : e_(&e), t_(&t), g_(g) {
      e_->enter(t, g);
    }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() { e_->leave(*t_, g_); }

   private:
    zero_engine* e_;
    autodiff::tape* t_;
    std::size_t g_;
  };
  // The group's parameters are usable (their value()) while the scope lives.
  [[nodiscard]] scope use(autodiff::tape& t, std::size_t g,
                          source_site at = source_site::current()) {
    const user_call user(at);  // the group's gathers (ZeRO-3) and the start-up check
    return scope(*this, t, g);
  }

  // -------------------------------------------------------------------------------------
  // Backward and step.

  // Runs backward from the loss (scaled under float16) and completes the gradient
  // collectives.
  template <sharded_tensor L>
  void backward(const autodiff::variable<L>& loss, source_site at = source_site::current()) {
    const user_call user(at);
    if constexpr (P::loss_scaling) {
      autodiff::backward(
          autodiff::scale(loss, static_cast<typename L::value_type>(scaler_.scale())));
    } else {
      autodiff::backward(loss);
    }
    finish_backward();
  }

  // For a forward pass that is not followed by backward (evaluation, sampling): releases
  // what the forward holds, so that the next step starts clean.
  void discard_forward() {
    for (auto& g : groups_) {
      if (g.gathering()) {
        g.gather->wait();
        g.gather.reset();
      }
      for (slot* p : g.params) {
        p->free_compute();
        p->release_secondary();
        p->detach();
      }
      g.live = false;
      g.in_scope = false;
    }
  }

  void finish_backward() {
    while (!pending_.empty()) complete_oldest();
    for (auto& g : groups_) {
      if (g.in_scope) {
        throw std::logic_error(detail::message("zest zero_engine: group '", g.name,
                                               "' is still in scope at the end of backward"));
      }
    }
  }

  // The optimizer step at learning rate lr. Last, the ranks compare the collectives each
  // communicator of the mesh issued (zest::check_schedule: one small collective per
  // communicator): a rank that issued other collectives than the others in this step, or
  // before it, ends the step with collective_mismatch on every rank.
  step_report step(double lr, source_site at = source_site::current()) {
    const user_call user(at);
    release_states();
    const step_report r = update(lr);
    check_schedule(*mesh_, detail::message("zero_engine::step, after ", steps_, " optimizer steps"),
                   at);
    return r;
  }

 private:
  step_report update(double lr) {
    step_report r;
    r.lr = lr;
    r.loss_scale = P::loss_scaling ? scaler_.scale() : 1.0F;
    const auto all = parameters();

    if constexpr (stage == 1) {
      // The full gradient buffers, reduce-scattered to the shards the optimizer owns.
      for (std::size_t g = 0; g < groups_.size(); ++g) reduce_buffers_of(g);
    }

    if constexpr (P::loss_scaling) {
      bool bad = false;
      for (slot* p : all)
        bad = bad || has_inf_or_nan<backend_t>(std::span<const grad_type>(p->kept_gradient()));
      const bool skip = any_rank(*mesh_, bad);
      if (!scaler_.update(skip)) {
        r.applied = false;
        r.grad_norm = std::numeric_limits<double>::infinity();
        clear_gradients(all);
        return r;
      }
    }

    std::vector<norm_term> terms;
    terms.reserve(all.size());
    for (slot* p : all) {
      terms.push_back({std::span<const grad_type>(p->kept_gradient()), p->kept_gradient_counted()});
    }
    r.grad_norm =
        global_norm(*mesh_, std::span<const norm_term>(terms)) / static_cast<double>(r.loss_scale);
    r.clip = clip_coefficient(r.grad_norm, options_.max_grad_norm);

    ++steps_;
    const float grad_scale = static_cast<float>(r.clip / static_cast<double>(r.loss_scale));
    for (slot* p : all) {
      adamw_update<backend_t>(p->master(), std::span<const grad_type>(p->kept_gradient()),
                              p->adam_m(), p->adam_v(), steps_, static_cast<float>(lr),
                              options_.adam, grad_scale, p->decays());
    }
    if constexpr (stage == 1 || stage == 2) {
      for (std::size_t g = 0; g < groups_.size(); ++g) publish(g);
    } else {
      for (slot* p : all) p->store_from_master();
    }
    clear_gradients(all);
    return r;
  }

 public:
  std::int64_t steps_taken() const { return steps_; }
  void set_steps_taken(std::int64_t s) { steps_ = s; }
  dynamic_loss_scaler& loss_scaler() { return scaler_; }
  const dynamic_loss_scaler& loss_scaler() const { return scaler_; }

  // The sum over all ranks of a per-rank value (a loss, a token count), over the world
  // communicator: scalar reductions stay apart from the parameter and gradient traffic.
  double sum_over_ranks(double local, source_site at = source_site::current()) const {
    const user_call user(at);
    mesh_->world().all_reduce(std::span<double>(&local, 1), reduce_op::sum);
    return local;
  }
  // The value of a scalar tensor on every rank: its pending sums added, each replica
  // counted once.
  template <sharded_tensor S>
  double scalar_value(const S& s, source_site at = source_site::current()) const {
    const user_call user(at);
    static_assert(S::rank == 0, "zest zero_engine::scalar_value takes a scalar (dims \"\")");
    bool counts = true;
    for (std::size_t a = 0; a < mesh_t::axis_count; ++a) {
      if (!S::layout.is_partial(a) && mesh_->coord(a) != 0) counts = false;
    }
    double value = 0;
    if (counts) value = static_cast<double>(s.local_to_host()[0]);
    return sum_over_ranks(value);
  }

 private:
  // ----- the start-up check -------------------------------------------------------------
  // Before the first collective (the first group entered), the ranks compare what decides
  // their collectives (zest/zero/setup_check.hpp): ranks started with other flags or
  // binaries stop here with collective_mismatch naming the first field that differs.
  void agree_on_setup() {
    setup_agreed_ = true;
    auto& world = mesh_->world();
    detail::words_exchange exchange;
    if constexpr (requires { world.exchange_words(std::span<const std::uint64_t>{}, ""); }) {
      exchange = [&](std::span<const std::uint64_t> mine) {
        return world.exchange_words(mine, "zero_engine's start-up check");
      };
    } else if constexpr (requires {
                           world.mpi()->exchange_words(std::span<const std::uint64_t>{}, "");
                         }) {
      if (world.mpi() == nullptr) return;  // one rank without MPI
      exchange = [&](std::span<const std::uint64_t> mine) {
        return world.mpi()->exchange_words(mine, "zero_engine's start-up check");
      };
    } else {
      return;  // one process: nothing to compare
    }
    const auto axes = [&](unsigned mask) {
      std::string out;
      for (std::size_t a = 0; a < mesh_t::axis_count; ++a) {
        if ((mask >> a & 1U) == 0) continue;
        out += out.empty() ? "" : ",";
        out += mesh_t::axis_names[a];
      }
      return out.empty() ? std::string("-") : out;
    };
    const auto role = [&](std::size_t a) {
      return a < mesh_t::axis_count ? std::string(mesh_t::axis_names[a]) : std::string("-");
    };
    const detail::setup_field fields[] = {
        {"the zest version", version, 0},
        {"the mesh", mesh_->describe(), 0},
        {"the ZeRO policy",
         detail::message(
             "zero_stage<", stage, "> sharded over ", axes(P::shard_mask), ", replicated over ",
             axes(P::replica_mask), ", parameters ", name_of(dtype_of<param_type>()),
             ", gradients ", name_of(dtype_of<grad_type>()), ", weights' wire ",
             P::stage::gather_wire.block, ", gradients' wire ", P::stage::gradient_wire.block,
             ", hpZ ", P::stage::hierarchical ? "on" : "off", ", tensor axis ",
             role(P::tensor_axis), ", sequence axis ", role(P::sequence_axis), ", expert axis ",
             role(P::expert_axis)),
         detail::setup_hash(typeid(P).name())},
        {"the engine's options",
         detail::message("bucket_elements ", options_.bucket_elements, ", max_live_groups ",
                         options_.max_live_groups, ", prefetch ", options_.prefetch ? "on" : "off",
                         ", recompute ", name_of(options_.recompute)),
         0},
    };
    std::vector<std::string> params;
    for (const slot* p : parameters()) {
      std::string text = p->name() + " [";
      const auto extents = p->global_extents();
      for (std::size_t i = 0; i < extents.size(); ++i) {
        text += detail::message(i == 0 ? "" : ", ", extents[i]);
      }
      params.push_back(text + "]");
    }
    detail::agree_on_setup(exchange, fields, params);
  }

  // ----- forward / backward hooks --------------------------------------------------------
  void enter(autodiff::tape& t, std::size_t g) {
    if (!setup_agreed_) agree_on_setup();
    if (g >= groups_.size()) {
      throw std::out_of_range(detail::message("zest zero_engine: group ", g, " does not exist (",
                                              groups_.size(), " groups)"));
    }
    group& gr = groups_[g];
    if (t.region_depth() > 0) {
      // Its backward hooks would be dropped with the function's steps, and the recomputation
      // would enter the group a second time (a second gather under stage 3).
      throw std::logic_error(detail::message(
          "zest zero_engine: group '", gr.name,
          "' entered inside a checkpointed function (autodiff::checkpoint). Fix: enter the "
          "group's scope (engine.use) outside the checkpoint and checkpoint the body inside it; "
          "the recomputation then uses the group's backward gather"));
    }
    if (gr.in_scope) {
      throw std::logic_error(
          detail::message("zest zero_engine: group '", gr.name, "' entered twice in one step"));
    }
    gr.in_scope = true;
    if constexpr (stage == 3) {
      materialise(g, /*backward=*/false);
      if (options_.prefetch) {
        const std::size_t next = holding_parameters(g + 1, +1);
        if (next < groups_.size()) start_gather(next, /*backward=*/false);
      }
    } else {
      for (slot* p : gr.params) p->compute_from_stored();
      gr.live = !gr.params.empty();
    }
    note_live();
    for (slot* p : gr.params) p->attach(t);
    // Runs after the group's backward steps (recorded before them).
    t.record([this, g] { after_backward(g); });
  }

  void leave(autodiff::tape& t, std::size_t g) {
    group& gr = groups_[g];
    if constexpr (stage == 3) {
      for (slot* p : gr.params) p->free_compute();
      gr.live = false;
    }
    // Runs before the group's backward steps.
    t.record([this, g] { before_backward(g); });
  }

  void before_backward(std::size_t g) {
    if constexpr (stage == 3) {
      materialise(g, /*backward=*/true);
      if (options_.prefetch && g > 0) {
        const std::size_t previous = holding_parameters(g - 1, -1);
        if (previous < groups_.size() && groups_[previous].in_scope)
          start_gather(previous, /*backward=*/true);
      }
      note_live();
    }
  }

  void after_backward(std::size_t g) {
    group& gr = groups_[g];
    for (slot* p : gr.params) {
      p->free_compute();
      p->release_secondary();
    }
    gr.live = false;
    if constexpr (stage == 1) {
      // Accumulated into the full-size buffer, reduced at the step.
      for (slot* p : gr.params) p->add_gradient_to_buffer();
    } else {
      for (const auto& [first, last] : buckets_of(gr)) start_reduction(g, first, last);
    }
    for (slot* p : gr.params) p->detach();
    gr.in_scope = false;
  }

  // ----- stage 3 gathers -----------------------------------------------------------------
  // The first group from g on, stepping by `step` (+1 or -1), that holds parameters
  // (groups_.size() if none): what a prefetch gathers, passing over empty groups.
  std::size_t holding_parameters(std::size_t g, int step) const {
    while (g < groups_.size() && groups_[g].params.empty()) {
      if (step < 0 && g == 0) return groups_.size();
      g = step > 0 ? g + 1 : g - 1;
    }
    return g < groups_.size() ? g : groups_.size();
  }

  // The group's stored shards (backward under hpZ: secondary copies) -> compute values, one
  // all-gather for the group, issued non-blocking. A prefetch (needed_now false) waits for
  // room under max_live_groups; a group needed now is gathered regardless. A group without
  // parameters has nothing to gather: no collective (every rank has the same groups), and it
  // never counts as live.
  void start_gather(std::size_t g, bool backward, bool needed_now = false) {
    group& gr = groups_[g];
    if (gr.gathering() || gr.live || gr.params.empty()) return;
    if (!needed_now && live_groups() >= options_.max_live_groups) return;
    gr.gather =
        std::make_unique<typename slot::template mover<param_type>>(*mesh_, P::stage::gather_wire);
    gr.gather_backward = backward;
    for (slot* p : gr.params) p->add_gather(*gr.gather, backward);
    gr.gather->start();
  }

  // The group's compute values, from its gather (started now if not prefetched). Under hpZ a
  // forward gather also leaves each parameter its secondary copy, cut from the gathered
  // value by the mover (slices: no communication).
  void materialise(std::size_t g, bool backward) {
    group& gr = groups_[g];
    if (gr.live || gr.params.empty()) return;
    if (!gr.gathering()) start_gather(g, backward, /*needed_now=*/true);
    gr.gather->wait();
    bool taken = false;
    if constexpr (P::stage::hierarchical) {
      if (!gr.gather_backward) {
        take_keeping_secondaries(gr);
        taken = true;
      }
    }
    for (std::size_t k = 0; !taken && k < gr.params.size(); ++k)
      gr.params[k]->take_gathered(gr.gather->release(k));
    gr.gather.reset();
    gr.live = true;
  }

  // hpZ after a forward gather: each parameter's secondary copy, cut from its gathered value
  // by the mover (slices, no communication) before take_gathered converts the value.
  void take_keeping_secondaries(group& gr) {
    std::vector<typename backend_t::template buffer<param_type>> gathered;
    gathered.reserve(gr.params.size());
    for (std::size_t k = 0; k < gr.params.size(); ++k) gathered.push_back(gr.gather->release(k));
    typename slot::template mover<param_type> keep(*mesh_);
    for (std::size_t k = 0; k < gr.params.size(); ++k) {
      gr.params[k]->add_keep(keep,
                             std::span<const param_type>(gathered[k].data(), gathered[k].size()));
    }
    keep.run();
    for (std::size_t k = 0; k < gr.params.size(); ++k) {
      gr.params[k]->take_secondary(keep.release(k));
      gr.params[k]->take_gathered(std::move(gathered[k]));
    }
  }

  void note_live() { peak_live_ = std::max(peak_live_, live_groups()); }

  // ----- gradient collectives ------------------------------------------------------------
  // The group's parameters in runs [first, last) of at most bucket_elements elements (a
  // parameter larger than that is a bucket of its own): one collective each.
  std::vector<std::pair<std::size_t, std::size_t>> buckets_of(const group& gr) const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    std::size_t first = 0;
    while (first < gr.params.size()) {
      std::size_t last = first, elements = 0;
      while (last < gr.params.size() &&
             (last == first || elements + gr.params[last]->size() <= options_.bucket_elements)) {
        elements += gr.params[last]->size();
        ++last;
      }
      out.emplace_back(first, last);
      first = last;
    }
    return out;
  }

  // A bucket's gradients -> the gradient buffers' layout (all-reduce under stage 0,
  // reduce-scatter under 2 and 3), one collective issued non-blocking; at most two buckets
  // in flight.
  void start_reduction(std::size_t g, std::size_t first, std::size_t last) {
    if (pending_.size() >= 2) complete_oldest();
    group& gr = groups_[g];
    auto red = std::make_unique<reduction>();
    red->group = g;
    red->first = first;
    red->last = last;
    red->move =
        std::make_unique<typename slot::template mover<grad_type>>(*mesh_, P::stage::gradient_wire);
    for (std::size_t i = first; i < last; ++i) gr.params[i]->add_gradient_reduction(*red->move);
    red->move->start();
    pending_.push_back(std::move(red));
  }

  void complete_oldest() {
    auto red = std::move(pending_.front());
    pending_.pop_front();
    red->move->wait();
    group& gr = groups_[red->group];
    for (std::size_t i = red->first; i < red->last; ++i) {
      gr.params[i]->add_reduced(red->move->release(i - red->first));
    }
  }

  // Stage 1 at the step: buffer (partial) -> kept shard (split), a reduce-scatter per bucket.
  void reduce_buffers_of(std::size_t g) {
    group& gr = groups_[g];
    for (const auto& [first, last] : buckets_of(gr)) {
      typename slot::template mover<grad_type> move(*mesh_, P::stage::gradient_wire);
      for (std::size_t i = first; i < last; ++i) gr.params[i]->add_buffer_reduction(move);
      move.run();
      for (std::size_t i = first; i < last; ++i) gr.params[i]->take_kept(move.release(i - first));
    }
  }

  // Stages 1, 2 after the update: each rank's updated shard to every rank (master -> stored).
  void publish(std::size_t g) {
    group& gr = groups_[g];
    if (gr.params.empty()) return;
    typename slot::template mover<param_type> move(*mesh_);
    for (slot* p : gr.params) p->add_publish(move);
    move.run();
    for (std::size_t k = 0; k < gr.params.size(); ++k) {
      gr.params[k]->take_published(move.release(k));
    }
  }

  void clear_gradients(const std::vector<slot*>& all) {
    for (slot* p : all) {
      auto b = p->gradient_buffer();
      backend_t::fill(b.data(), b.size(), grad_type{});
      p->release_step_buffers();
    }
  }

  const mesh_t* mesh_;
  zero_options options_;
  dynamic_loss_scaler scaler_;
  std::vector<group> groups_;
  bool open_ = false;
  bool setup_agreed_ = false;
  std::deque<std::unique_ptr<reduction>> pending_;
  std::vector<std::function<void()>> holds_;  // hold_states
  double held_seconds_ = 0;
  std::size_t peak_live_ = 0;
  std::int64_t steps_ = 0;
};

}  // namespace zest
