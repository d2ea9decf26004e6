// zest/zero/parameter.hpp — a trainable tensor whose ZeRO stage is part of its type.
//
//   using policy = zest::training_policy<zest::mesh<"dp">, zest::zero_stage<3>, zest::bfloat16>;
//   zest::parameter<policy, "mh"> w(engine, "fc.weight", {m, h}, zest::init::normal(0.02));
//
// A parameter is the set of its model states, each a shard of a layout that the stage
// chooses (zest/zero/stage.hpp): stored (the working copy between uses), compute (what
// einsums use: a tape variable, fp32), gradient (the dual of compute: partial over the data
// axes), gradient buffer (what the gradient costs between backward and the step), master and
// optimizer state (fp32; the optimizer updates the shard this rank owns). Only the compute
// value and the gradient are typed tensors (the tape's); the other states are buffers of
// the policy's element types, held by the dims-independent part (detail::parameter_slot),
// and typed tensors only where a caller asks for a copy (stored(), moment1(), ...).
//
//   stage 3, bf16:  stored   bfloat16 split(m:dp)      compute   float replicate
//                   gradient float partial(dp)         buffer    bfloat16 split(m:dp)
//                   master, adam m, v  float split(m:dp)
//
// The moves between these layouts are group transitions that the engine schedules
// (zest/zero/engine.hpp) and the mover runs (zest/tensor/transition_group.hpp), one
// collective per transition for a whole group of parameters; the parameter adds its shard
// with the plan between the two layouts and takes the result back. On mesh axes other than
// the data axes a parameter keeps the
// placement of its Base layout (e.g. split<'h', "tp"> for a Megatron column-parallel
// weight); its gradient there is the dual of that placement, reduced per parameter.
//
// The policy lives in zest/zero/training_policy.hpp, the initialisers in zest/zero/init.hpp.
// A checkpoint reads a parameter's states through visit_states (zest/train/checkpoint.hpp),
// so a parameter knows records (zest/io/tensor_record.hpp), not checkpoint files.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/backend/host/host_backend.hpp"
#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/memory.hpp"
#include "zest/io/tensor_record.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"
#include "zest/zero/init.hpp"
#include "zest/zero/stage.hpp"
#include "zest/zero/training_policy.hpp"

namespace zest {

namespace detail {

// dst[i] = src[i] converted through float (n elements in B's memory): the one copy between
// model states of different element types (a plain copy when the types agree).
template <class To, class From>
struct convert_fn {
  const From* src;
  To* dst;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    dst[i] = static_cast<To>(static_cast<float>(src[i]));
  }
};
template <class B, class To, class From>
void convert(std::span<const From> in, std::span<To> out) {
  if (in.empty()) return;
  if constexpr (std::is_same_v<To, From>) {
    B::copy_slices(in.data(), 1, 1, 0, out.data(), 1, 0, 1, in.size());
  } else {
    B::for_each(in.size(), convert_fn<To, From>{in.data(), out.data()});
  }
}
// acc[i] = acc[i] + add[i], summed in float and rounded once to Acc.
template <class Acc, class Add>
struct accumulate_fn {
  Acc* acc;
  const Add* add;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    acc[i] = static_cast<Acc>(static_cast<float>(acc[i]) + static_cast<float>(add[i]));
  }
};
template <class B, class Acc, class Add>
void accumulate(Acc* acc, const Add* add, std::size_t n) {
  if (n != 0) B::for_each(n, accumulate_fn<Acc, Add>{acc, add});
}

// `base` with the data axes' placements (`mask`) taken from `stage`. Where base splits the
// dim that the stage splits too (a bias "h" split<'h', "tp">), the data axes nest innermost:
// they split each rank's block of the other axes.
constexpr layout_value on_data_axes(layout_value base, layout_value stage, unsigned mask) {
  layout_value out = base;
  for (std::size_t a = 0; a < base.axis_count; ++a) {
    if ((mask >> a & 1U) == 0) continue;
    axis_placement p = stage.axes[a];
    if (p.kind == placement_kind::split)
      p.order = static_cast<std::uint8_t>(base.split_count(p.dim) + p.order);
    out.axes[a] = p;
  }
  return out;
}
// `g` with its pending sums on axes other than the data axes resolved to `kept`'s placement.
constexpr layout_value reduce_other_axes(layout_value g, layout_value kept, unsigned data_mask) {
  for (std::size_t a = 0; a < g.axis_count; ++a) {
    if ((data_mask >> a & 1U) == 0 && g.is_partial(a)) g.axes[a] = kept.axes[a];
  }
  return g;
}

// One model state of a parameter as the mover sees it (zest/tensor/transition_group.hpp):
// its layout and this rank's block (extents, and offsets in the global tensor).
struct state_shard {
  layout_value layout{};
  shard_extents local{};
  shard_extents offsets{};
};

// What the engine needs of a parameter, whatever its dims: the type-erased side of
// zest::parameter. P is the training policy. Every move between the parameter's model
// states is a member of a group transition that the engine forms and runs
// (zest/tensor/transition_group.hpp): the parameter adds its shard with the plan between
// the two layouts and takes the result back. What only needs the shards' storage (the
// optimizer's element loops, the conversions) is implemented here, once per policy; the
// rest is virtual (compiled once per parameter type: bench/README.md, "Compile time and
// memory").
template <class P>
class parameter_slot {
 public:
  using param_type = typename P::param_type;
  using grad_type = typename P::grad_type;
  using mesh_type = typename P::mesh_type;
  using backend_t = backend_of<mesh_type>;
  template <class T>
  using buffer = typename backend_t::template buffer<T>;
  template <class T>
  using mover = transition_group<T, mesh_type, backend_t>;

  parameter_slot() = default;
  parameter_slot(const parameter_slot&) = delete;
  parameter_slot& operator=(const parameter_slot&) = delete;
  virtual ~parameter_slot() = default;

  const std::string& name() const { return name_; }
  bool decays() const { return decay_; }
  // Elements of the global tensor, and its extents.
  std::size_t size() const {
    std::size_t n = 1;
    for (std::size_t i = 0; i < dims_.size(); ++i) n *= global_[i];
    return n;
  }
  std::vector<std::size_t> global_extents() const {
    return {global_.begin(), global_.begin() + static_cast<std::ptrdiff_t>(dims_.size())};
  }
  // Elements this rank holds of the stored copy, and of the compute value (its block on the
  // mesh's other axes: what the data axes' collectives move).
  std::size_t stored_elements() const { return stored_data_.size(); }
  std::size_t compute_elements() const { return elements(compute_); }

  // ----- The transitions the engine runs in groups ---------------------------------------
  // Stage 3: the stored shard -> the compute value (all-gather over the data axes), read in
  // place; take_gathered makes the result the compute value (converted to fp32). Under hpZ
  // backward gathers from the secondary copy instead, over its axes alone.
  void add_gather(mover<param_type>& g, bool backward) const {
    if (backward && secondary_kept_) {
      g.add(dims_, secondary_.layout, regather_plan_, global_, secondary_.local,
            std::span<const param_type>(secondary_data_.data(), secondary_data_.size()));
    } else {
      g.add(dims_, stored_.layout, gather_plan_, global_, stored_.local,
            std::span<const param_type>(stored_data_.data(), stored_data_.size()));
    }
  }
  // hpZ: the forward gather's result -> the secondary copy (slices: no communication), read
  // in place; take_secondary keeps it until backward's gather, release_secondary frees it.
  void add_keep(mover<param_type>& g, std::span<const param_type> gathered) const {
    g.add(dims_, compute_.layout, keep_plan_, global_, compute_.local, gathered);
  }
  void take_secondary(buffer<param_type>&& b) {
    secondary_data_ = std::move(b);
    secondary_kept_ = true;  // on every rank alike, an empty block included
  }
  void release_secondary() {
    memory::release(secondary_data_);
    secondary_kept_ = false;
  }
  virtual void take_gathered(buffer<param_type>&& value) = 0;
  // Stages 0-2: the compute value from the stored copy (a conversion, no communication).
  virtual void compute_from_stored() = 0;
  // Makes the compute value a leaf of `t` (its storage as filled before).
  virtual void attach(autodiff::tape& t) = 0;
  // Frees the compute value's storage, keeping the variable (stage 3 between uses).
  virtual void free_compute() = 0;
  // Forgets the variable and its gradient.
  virtual void detach() = 0;

  // After the group's backward: the gradient backward left, reduced over the other mesh
  // axes (zeros when the parameter was not reached), handed to the group in the gradient
  // buffer's element type, towards the buffer's layout (all-reduce under stage 0,
  // reduce-scatter under 2 and 3); add_reduced adds the result into the buffer.
  virtual void add_gradient_reduction(mover<grad_type>& g) = 0;
  void add_reduced(buffer<grad_type>&& reduced) {
    accumulate<backend_t>(buffer_data_.data(), reduced.data(), buffer_data_.size());
  }
  // Stage 1: adds the whole gradient into the (partial) gradient buffer, without moving it.
  virtual void add_gradient_to_buffer() = 0;
  // Stage 1 at the step: the buffer's partial sums -> the kept shard (reduce-scatter), read
  // in place; take_kept keeps the result for the optimizer.
  void add_buffer_reduction(mover<grad_type>& g) const {
    g.add(dims_, buffer_.layout, buffer_plan_, global_, buffer_.local,
          std::span<const grad_type>(buffer_data_.data(), buffer_data_.size()));
  }
  void take_kept(buffer<grad_type>&& kept) { kept_.emplace(std::move(kept)); }

  // Persistent gradient buffer (gradient_buffer layout) and the kept gradient (what the
  // optimizer reads: kept_gradient layout).
  std::span<grad_type> gradient_buffer() { return {buffer_data_.data(), buffer_data_.size()}; }
  std::span<const grad_type> kept_gradient() const {
    if (kept_is_buffer_) return {buffer_data_.data(), buffer_data_.size()};
    return kept_ ? std::span<const grad_type>(kept_->data(), kept_->size())
                 : std::span<const grad_type>{};
  }
  bool kept_gradient_counted() const { return kept_counted_; }  // counts in a global norm
  void release_step_buffers() {
    kept_.reset();
    memory::release(scratch_);
  }
  // Hands `visit` each model state a checkpoint holds, as the record of this rank's block
  // (zest/io/tensor_record.hpp: what tensors of every dims and layout reduce to): the stored
  // copy ("name"), the fp32 master if separate ("name.master") and Adam's moments
  // ("name.adam_m", "name.adam_v"). Records view the shards: they live as long as this.
  void visit_states(const std::function<void(io::tensor_record)>& visit) {
    visit(record_of(name_, stored_, stored_data_));
    if constexpr (P::has_master) visit(record_of(name_ + ".master", master_, master_data_));
    visit(record_of(name_ + ".adam_m", optimizer_, m_data_));
    visit(record_of(name_ + ".adam_v", optimizer_, v_data_));
  }
  // The whole stored value on every rank, as floats (collective: for checks and reports).
  std::vector<float> whole_value() const {
    const layout_value whole = replicated_layout(mesh_type::axis_count);
    mover<param_type> g(*mesh_);
    g.add(dims_, stored_.layout,
          cached_transition_plan(stored_.layout, whole,
                                 make_transition_shape(dims_, global_, mesh_->sizes())),
          global_, stored_.local,
          std::span<const param_type>(stored_data_.data(), stored_data_.size()));
    g.run();
    const buffer<param_type> all = g.release(0);
    host_vector<param_type> host(all.size());
    backend_t::to_host(std::span<const param_type>(all.data(), all.size()), host.data());
    return std::vector<float>(host.begin(), host.end());
  }

  // The fp32 values the optimizer updates (the master shard), Adam's m and v.
  std::span<float> master() {
    if constexpr (P::has_master) {
      return {master_data_.data(), master_data_.size()};
    } else if (master_is_stored_) {
      return {stored_data_.data(), stored_data_.size()};  // fp32: the stored copy is the master
    } else {
      // fp32 under stages 1, 2: the master is this rank's block of the replicated copy (a
      // slice, no communication), updated and then published back by the all-gather.
      mover<float> g(*mesh_);
      g.add(dims_, stored_.layout, master_plan_, global_, stored_.local,
            std::span<const float>(stored_data_.data(), stored_data_.size()));
      g.run();
      scratch_ = g.release(0);
      return {scratch_.data(), scratch_.size()};
    }
  }
  std::span<float> adam_m() { return {m_data_.data(), m_data_.size()}; }
  std::span<float> adam_v() { return {v_data_.data(), v_data_.size()}; }
  // Stages 0, 3 after the update: the stored copy from the master.
  void store_from_master() {
    if constexpr (P::has_master) {
      convert<backend_t>(std::span<const float>(master_data_.data(), master_data_.size()),
                         std::span<param_type>(stored_data_.data(), stored_data_.size()));
    }
  }
  // Stages 1, 2 after the update: the updated shard (the master's layout, in the parameter's
  // element type) -> the stored copy (all-gather over the data axes); take_published makes
  // the result the stored copy.
  void add_publish(mover<param_type>& g) {
    if constexpr (P::has_master) {
      buffer<param_type> shard(master_data_.size());
      convert<backend_t>(std::span<const float>(master_data_.data(), master_data_.size()),
                         std::span<param_type>(shard.data(), shard.size()));
      g.add(dims_, master_.layout, publish_plan_, global_, master_.local, std::move(shard));
    } else {
      g.add(dims_, master_.layout, publish_plan_, global_, master_.local, std::move(scratch_));
    }
  }
  void take_published(buffer<param_type>&& stored) { stored_data_ = std::move(stored); }

 protected:
  std::size_t elements(const state_shard& s) const {
    std::size_t n = 1;
    for (std::size_t i = 0; i < dims_.size(); ++i) n *= s.local[i];
    return n;
  }
  // This rank's block of `layout` for the parameter's dims.
  state_shard shard_of(layout_value layout) const {
    state_shard out{layout, {}, {}};
    for (std::size_t i = 0; i < dims_.size(); ++i) {
      const block_range r =
          dim_range(layout, dims_[i], global_[i], mesh_->sizes(), mesh_->coords());
      out.local[i] = r.size;
      out.offsets[i] = r.offset;
    }
    return out;
  }
  // A zero shard of `s`, and one holding the initial values init(seed, global index) (zeros
  // on the ranks that hold no summand of a partial axis, as basic_tensor::generate).
  template <class T>
  buffer<T> zeros(const state_shard& s) const {
    buffer<T> out(elements(s));
    backend_t::fill(out.data(), out.size(), T{});
    return out;
  }
  template <class T>
  buffer<T> initial(const state_shard& s, std::uint64_t seed, const initializer& init) const {
    for (std::size_t a = 0; a < mesh_type::axis_count; ++a) {
      if (s.layout.is_partial(a) && mesh_->coord(a) != 0) return zeros<T>(s);
    }
    auto values = initial_values<T>(dims_.size(), global_.data(), s.offsets.data(), s.local.data(),
                                    seed, init);
    if constexpr (std::is_same_v<buffer<T>, host_vector<T>>) {
      return values;
    } else {
      return backend_t::template from_host<T>(std::span<const T>(values.data(), values.size()));
    }
  }
  // The checkpoint record of state `s` (never partial: the stage's stored, master and
  // optimizer layouts are not), viewing `data`.
  template <class T>
  io::tensor_record record_of(std::string name, const state_shard& s, buffer<T>& data) const {
    bool writes = true;
    for (std::size_t a = 0; a < mesh_type::axis_count; ++a) {
      if (s.layout.is_replicate(a) && mesh_->coord(a) != 0) writes = false;
    }
    const std::size_t rank = dims_.size();
    io::tensor_record r = io::detail::make_record_of(
        std::move(name), dims_, dtype_of<T>(), std::span<const std::size_t>(global_.data(), rank),
        std::span<const std::size_t>(s.offsets.data(), rank),
        std::span<const std::size_t>(s.local.data(), rank),
        to_string(s.layout, std::span<const std::string_view>(mesh_type::axis_names)), writes);
    io::detail::stage<backend_t>(r, std::span<T>(data.data(), data.size()));
    return r;
  }
  // The cheapest plan over the data axes alone, the axes whose placements the stage's
  // layouts change (searched over every axis, a stage-0 all-reduce could go through the
  // tensor-parallel replicas; the ZeRO formulas and the planner count the data axes' steps:
  // docs/design-notes.md, "Transition order").
  transition_plan plan_between(const state_shard& from, const state_shard& to) const {
    return cached_transition_plan(
        from.layout, to.layout,
        zero_transition_shape(dims_, global_, mesh_->sizes(), P::replica_mask), P::data_mask);
  }
  // Called by the parameter's constructor, after dims_, global_ and mesh_: the states'
  // layouts and the plans between them; the stored copy and the master hold their initial
  // values, the gradient buffer and Adam's moments zeros.
  void create_states(const zero_layouts& l, layout_value reduced_gradient, std::uint64_t seed,
                     const initializer& init) {
    if (l.secondary.axis_count != 0) {
      secondary_ = shard_of(l.secondary);
      keep_plan_ = plan_between(shard_of(l.compute), secondary_);
      regather_plan_ = plan_between(secondary_, shard_of(l.compute));
    }
    stored_ = shard_of(l.stored);
    compute_ = shard_of(l.compute);
    reduced_gradient_ = shard_of(reduced_gradient);
    buffer_ = shard_of(l.gradient_buffer);
    const state_shard kept = shard_of(l.kept_gradient);
    master_ = shard_of(l.master);
    optimizer_ = shard_of(l.optimizer_state);
    gather_plan_ = plan_between(stored_, compute_);
    reduce_plan_ = plan_between(reduced_gradient_, buffer_);
    buffer_plan_ = plan_between(buffer_, kept);
    publish_plan_ = plan_between(master_, stored_);
    master_plan_ = plan_between(stored_, master_);
    kept_is_buffer_ = l.kept_gradient == l.gradient_buffer;
    master_is_stored_ = l.master == l.stored;
    stored_data_ = initial<param_type>(stored_, seed, init);
    if constexpr (P::has_master) master_data_ = initial<float>(master_, seed, init);
    buffer_data_ = zeros<grad_type>(buffer_);
    m_data_ = zeros<float>(optimizer_);
    v_data_ = zeros<float>(optimizer_);
    // Each element of the global gradient counts once in a norm: on every axis where the
    // kept layout is replicated, only coordinate 0 counts.
    for (std::size_t a = 0; a < mesh_type::axis_count; ++a) {
      if (l.kept_gradient.is_replicate(a) && mesh_->coord(a) != 0) kept_counted_ = false;
    }
  }

  std::string name_;
  bool decay_ = true;
  const mesh_type* mesh_ = nullptr;
  std::string_view dims_;
  shard_extents global_{};
  state_shard stored_, compute_, reduced_gradient_, buffer_, master_, optimizer_;
  transition_plan gather_plan_{}, reduce_plan_{}, buffer_plan_{}, publish_plan_{}, master_plan_{};
  // hpZ: the secondary copy's layout, its plans from and to the compute value, its data
  // between a group's forward and backward.
  state_shard secondary_;
  transition_plan keep_plan_{}, regather_plan_{};
  buffer<param_type> secondary_data_;
  bool secondary_kept_ = false;
  bool kept_is_buffer_ = true;    // kept_gradient and gradient_buffer layouts agree
  bool kept_counted_ = true;      // this rank's kept block counts in a global norm
  bool master_is_stored_ = true;  // fp32: master and stored layouts agree
  // The states' shards: the stored copy, the gradient buffer, Adam's moments, the fp32
  // master (16-bit policies).
  buffer<param_type> stored_data_;
  buffer<grad_type> buffer_data_;
  buffer<float> m_data_, v_data_;
  buffer<float> master_data_;
  std::optional<buffer<grad_type>> kept_;
  // fp32 stages 1, 2: this rank's block of the stored copy during a step.
  buffer<float> scratch_;
};

}  // namespace detail

template <class P>
class zero_engine;

// A parameter of dims Dims under policy P; Base gives its placement on the mesh's other axes,
// SplitRule the dim the stage splits over its shard axes (the policy's rule by default).
template <training_policy_type P, fixed_string Dims, class Base = layout<>,
          zero_split_rule SplitRule = typename P::stage::split_rule>
class parameter final : public detail::parameter_slot<P> {
  using mesh_t = typename P::mesh_type;
  using backend_t = backend_of<mesh_t>;
  using stage_t = typename P::stage::template with_split_rule<SplitRule>;
  static constexpr unsigned data = P::data_mask;
  static constexpr layout_value base = layout_value_of<mesh_t, Dims, Base>;
  static constexpr zero_layouts z = stage_t::template layouts<mesh_t, Dims>;
  static constexpr char split_dim = stage_t::template split_dim<Dims>;
  static_assert(base == detail::on_data_axes(base, replicated_layout(mesh_t::axis_count), data),
                "zest parameter: the Base layout places the parameter on a data axis; the "
                "ZeRO stage does that. Fix: leave the stage's data axes out of Base.");

 public:
  using typename detail::parameter_slot<P>::param_type;
  using typename detail::parameter_slot<P>::grad_type;
  template <class T>
  using mover = typename detail::parameter_slot<P>::template mover<T>;
  template <class T>
  using buffer = typename detail::parameter_slot<P>::template buffer<T>;
  static constexpr fixed_string dims = Dims;
  static constexpr zero_layouts layouts{
      detail::on_data_axes(base, z.stored, data),
      base,
      autodiff::dual(base),
      detail::on_data_axes(base, z.kept_gradient, data),
      detail::on_data_axes(base, z.gradient_buffer, data),
      detail::on_data_axes(base, z.optimizer_state, data),
      detail::on_data_axes(base, z.master, data),
      z.secondary.axis_count != 0 ? detail::on_data_axes(base, z.secondary, data) : layout_value{},
      z.gather_wire,
      z.gradient_wire};
  static constexpr layout_value reduced_gradient =
      detail::reduce_other_axes(layouts.gradient, layouts.kept_gradient, data);

  // The states as typed tensors (copies: stored(), gradient_buffer_tensor(), ...).
  using stored_tensor = basic_tensor<param_type, mesh_t, Dims, layouts.stored>;
  using compute_tensor = basic_tensor<float, mesh_t, Dims, layouts.compute>;
  using gradient_tensor = basic_tensor<float, mesh_t, Dims, layouts.gradient>;
  using reduced_gradient_tensor = basic_tensor<float, mesh_t, Dims, reduced_gradient>;
  using buffer_tensor = basic_tensor<grad_type, mesh_t, Dims, layouts.gradient_buffer>;
  using kept_tensor = basic_tensor<grad_type, mesh_t, Dims, layouts.kept_gradient>;
  using state_tensor = basic_tensor<float, mesh_t, Dims, layouts.optimizer_state>;
  using extents_type = typename compute_tensor::extents_type;
  using variable_type = autodiff::variable<compute_tensor>;

  // Registers itself with the engine's current group.
  parameter(zero_engine<P>& engine, std::string name, const extents_type& extents,
            const initializer& init, bool decay = true)
      : engine_(&engine), extents_(extents) {
    this->name_ = std::move(name);
    this->decay_ = decay;
    this->mesh_ = &engine.mesh();
    this->dims_ = view_of<Dims>;
    this->global_ = detail::to_shard_extents(extents);
    this->create_states(layouts, reduced_gradient, engine.seed_for(this->name_), init);
    engine.add(*this);
  }

  const extents_type& extents() const { return extents_; }

  // The compute value during a step (after the engine gathered it): use it in einsums.
  const variable_type& value() const {
    if (!var_) {
      // The engine says why: which group, and whether the layer made it too late.
      throw std::logic_error(detail::message("zest parameter '", this->name_,
                                             "': used outside its group's scope",
                                             engine_->out_of_scope_reason(*this)));
    }
    return *var_;
  }
  operator const variable_type&() const { return value(); }  // NOLINT: reads like the value

  // Copies of the states as typed tensors, for inspection (compiled only where called).
  stored_tensor stored() const { return copy_as<stored_tensor>(this->stored_data_); }
  buffer_tensor gradient_buffer_tensor() const {
    return copy_as<buffer_tensor>(this->buffer_data_);
  }
  state_tensor moment1() const { return copy_as<state_tensor>(this->m_data_); }
  state_tensor moment2() const { return copy_as<state_tensor>(this->v_data_); }
  // fp32 master weights (16-bit policies only).
  state_tensor master_tensor() const requires(P::has_master) {
    return copy_as<state_tensor>(this->master_data_);
  }

  // --- parameter_slot: what depends on the tensors' types --------------------------------
  void take_gathered(buffer<param_type>&& value) override {
    if constexpr (std::is_same_v<param_type, float>) {
      set_compute(std::move(value));  // the gathered copy is the compute value
    } else {
      typename compute_tensor::storage_type v(value.size());
      detail::convert<backend_t>(std::span<const param_type>(value.data(), value.size()),
                                 std::span<float>(v.data(), v.size()));
      memory::release(value);
      set_compute(std::move(v));
    }
  }
  void compute_from_stored() override {
    // Stored and compute differ only on the data axes (replicate for stages 0-2).
    const auto& stored = this->stored_data_;
    typename compute_tensor::storage_type v(stored.size());
    detail::convert<backend_t>(std::span<const param_type>(stored.data(), stored.size()),
                               std::span<float>(v.data(), v.size()));
    set_compute(std::move(v));
  }
  void attach(autodiff::tape& t) override {
    var_.emplace(t.parameter(std::move(*pending_)));
    pending_.reset();
  }
  void free_compute() override {
    if (var_) memory::release(var_->node()->value.storage());
  }
  void detach() override {
    var_.reset();
    pending_.reset();
    grad_.reset();
  }

  void add_gradient_reduction(mover<grad_type>& g) override {
    take_gradient();
    const auto& from = this->reduced_gradient_;
    if constexpr (std::is_same_v<grad_type, float>) {
      g.add(this->dims_, from.layout, this->reduce_plan_, this->global_, from.local,
            std::move(grad_->storage()));
    } else {
      buffer<grad_type> send(grad_->local_count());
      detail::convert<backend_t>(std::span<const float>(std::as_const(*grad_).local()),
                                 std::span<grad_type>(send.data(), send.size()));
      g.add(this->dims_, from.layout, this->reduce_plan_, this->global_, from.local,
            std::move(send));
    }
    grad_.reset();
  }
  void add_gradient_to_buffer() override {
    take_gradient();
    detail::accumulate<backend_t>(this->buffer_data_.data(), std::as_const(*grad_).local().data(),
                                  this->buffer_data_.size());
    grad_.reset();
  }

 private:
  template <class Tensor, class Buffer>
  Tensor copy_as(const Buffer& data) const {
    return Tensor(*this->mesh_, extents_, typename Tensor::storage_type(data));
  }
  // The compute value from storage of its local size: the pending value before the tape
  // holds it (forward), the variable's value after (backward's regather, stage 3).
  void set_compute(typename compute_tensor::storage_type&& v) {
    if (var_) {
      var_->node()->value.storage() = std::move(v);
    } else {
      pending_.emplace(*this->mesh_, extents_, std::move(v));
    }
  }
  // The gradient backward left, its pending sums over the other axes reduced (a weight
  // replicated over a tensor-parallel axis); zeros when the parameter was not reached.
  void take_gradient() {
    if (!var_ || !var_->has_gradient()) {
      grad_.emplace(*this->mesh_, extents_);
    } else {
      grad_.emplace(redistribute_to<reduced_gradient>(std::move(*var_->node()->grad)));
      var_->zero_grad();
    }
  }

  const zero_engine<P>* engine_;
  extents_type extents_;
  std::optional<compute_tensor> pending_;
  std::optional<variable_type> var_;
  std::optional<reduced_gradient_tensor> grad_;
};

}  // namespace zest
