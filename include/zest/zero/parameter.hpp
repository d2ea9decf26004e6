// zest/zero/parameter.hpp — a trainable tensor whose ZeRO stage is part of its type.
//
//   using policy = zest::training_policy<zest::mesh<"dp">, zest::zero_stage<3>, zest::bfloat16>;
//   zest::parameter<policy, "mh"> w(engine, "fc.weight", {m, h}, zest::init::normal(0.02));
//
// A parameter is the set of its model states, each a typed sharded tensor whose layout the
// stage chooses (zest/zero/stage.hpp): stored (the working copy between uses), compute
// (what einsums use: a tape variable, fp32), gradient (the dual of compute: partial over the
// data axis), gradient buffer (what the gradient costs between backward and the step),
// master and optimizer state (fp32; the optimizer updates the shard this rank owns).
//
//   stage 3, bf16:  stored   bfloat16 split(m:dp)      compute   float replicate
//                   gradient float partial(dp)         buffer    bfloat16 split(m:dp)
//                   master, adam m, v  float split(m:dp)
//
// The collectives between these layouts run in the engine (zest/zero/engine.hpp), which
// coalesces a whole group of parameters into one collective per transition; the parameter
// provides the blocks. On mesh axes other than the data axis a parameter keeps the
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

// One parameter's local compute tensor seen as [outer][extent][inner] around the dim that
// the stage splits over the data axis; rank r of that axis owns rows block(r).
struct data_split {
  std::size_t outer = 1, extent = 1, inner = 1;
  std::size_t parts = 1;
  block_range block(std::size_t r) const { return balanced_block(extent, parts, r); }
  std::size_t count(std::size_t r) const { return outer * block(r).size * inner; }
  std::size_t total() const { return outer * extent * inner; }
};

// Whether the element loops below take their plain host form (Eigen-free loops that the
// compiler vectorises) or run as function objects on the backend (zest/backend/backend.hpp).
template <class B>
inline constexpr bool host_loops = std::is_same_v<B, host_backend>;

// dst[o * dst_stride + k] = src[o * src_stride + k] for o < outer, k < run, converted
// through float: the body of every copy between model states of different element types.
template <class To, class From>
struct convert_rows_fn {
  const From* src;
  To* dst;
  std::size_t run, src_stride, dst_stride;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t o = i / run, k = i % run;
    dst[o * dst_stride + k] = static_cast<To>(static_cast<float>(src[o * src_stride + k]));
  }
};
// acc[i] = acc[i] + add[i], summed in float and rounded once to Acc.
template <class Acc, class Add>
struct accumulate_fn {
  Acc* acc;
  const Add* add;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    acc[i] = static_cast<Acc>(static_cast<float>(acc[i]) + static_cast<float>(add[i]));
  }
};

// A [outer][run] walk with the given strides on backend B: a strided copy when the types
// agree, a conversion loop otherwise.
template <class B, class To, class From>
void copy_converted(const From* src, std::size_t src_stride, To* dst, std::size_t dst_stride,
                    std::size_t outer, std::size_t run) {
  if (outer == 0 || run == 0) return;
  if constexpr (std::is_same_v<To, From>) {
    B::copy_slices(src, outer, src_stride, 0, dst, dst_stride, 0, run, 1);
  } else {
    B::for_each(outer * run, convert_rows_fn<To, From>{src, dst, run, src_stride, dst_stride});
  }
}

// n elements from src to dst in B's memory (no conversion).
template <class B, class T>
void copy_elements(const T* src, std::size_t n, T* dst) {
  if constexpr (host_loops<B>) {
    std::copy_n(src, n, dst);
  } else {
    if (n != 0) B::copy_slices(src, 1, n, 0, dst, n, 0, n, 1);
  }
}

// A buffer of B of n elements (contents unspecified), reusing `b` when it has that size.
template <class B, class Buffer>
void resize_buffer(Buffer& b, std::size_t n) {
  if constexpr (host_loops<B>) {
    b.resize(n);
  } else {
    if (b.size() != n) b = Buffer(n);
  }
}

// Copies the rows [rows.offset, +rows.size) of a [outer][extent][inner] array to or from a
// dense [outer][rows.size][inner] block, converting element types; pointers into B's memory.
template <class B, class To, class From>
void copy_rows_out(const From* whole, const data_split& s, block_range rows, To* block) {
  const std::size_t run = rows.size * s.inner;
  if constexpr (host_loops<B>) {
    for (std::size_t o = 0; o < s.outer; ++o) {
      const From* src = whole + (o * s.extent + rows.offset) * s.inner;
      To* dst = block + o * run;
      for (std::size_t i = 0; i < run; ++i) dst[i] = static_cast<To>(static_cast<float>(src[i]));
    }
  } else {
    copy_converted<B>(whole + rows.offset * s.inner, s.extent * s.inner, block, run, s.outer, run);
  }
}
template <class B, class To, class From>
void copy_rows_in(const From* block, const data_split& s, block_range rows, To* whole) {
  const std::size_t run = rows.size * s.inner;
  if constexpr (host_loops<B>) {
    for (std::size_t o = 0; o < s.outer; ++o) {
      const From* src = block + o * run;
      To* dst = whole + (o * s.extent + rows.offset) * s.inner;
      for (std::size_t i = 0; i < run; ++i) dst[i] = static_cast<To>(static_cast<float>(src[i]));
    }
  } else {
    copy_converted<B>(block, run, whole + rows.offset * s.inner, s.extent * s.inner, s.outer, run);
  }
}
template <class B, class To, class From>
void convert(std::span<const From> in, std::span<To> out) {
  if constexpr (host_loops<B>) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = static_cast<To>(static_cast<float>(in[i]));
  } else {
    copy_converted<B>(in.data(), in.size(), out.data(), in.size(), 1, in.size());
  }
}
// acc += add elementwise (n elements), summed in float.
template <class B, class Acc, class Add>
void accumulate(Acc* acc, const Add* add, std::size_t n) {
  if constexpr (host_loops<B>) {
    for (std::size_t k = 0; k < n; ++k) {
      acc[k] = static_cast<Acc>(static_cast<float>(acc[k]) + static_cast<float>(add[k]));
    }
  } else {
    B::for_each(n, accumulate_fn<Acc, Add>{acc, add});
  }
}

// `base` with the data axis's placement taken from `stage`. Where base splits the dim that
// the stage splits too (a bias "h" split<'h', "tp">), the data axis nests innermost: it
// splits each rank's block of the other axes, which is the block data_split sees.
constexpr layout_value on_data_axis(layout_value base, const layout_value& stage, std::size_t a) {
  axis_placement p = stage.axes[a];
  if (p.kind == placement_kind::split) p.order = static_cast<std::uint8_t>(base.split_count(p.dim));
  base.axes[a] = p;
  return base;
}
// `g` with its pending sums on axes other than the data axis resolved to `kept`'s placement.
constexpr layout_value reduce_other_axes(layout_value g, const layout_value& kept,
                                         std::size_t data) {
  for (std::size_t a = 0; a < g.axis_count; ++a) {
    if (a != data && g.is_partial(a)) g.axes[a] = kept.axes[a];
  }
  return g;
}

// What the engine needs of a parameter, whatever its dims: the type-erased side of
// zest::parameter. P is the training policy. What only needs the shards' storage (the
// gradient's and optimizer's element loops, the published blocks) is implemented here, once
// per policy, on views of the derived parameter's tensors; the rest is virtual (compiled
// once per parameter type: bench/README.md, "Compile time and memory").
template <class P>
class parameter_slot {
 public:
  using param_type = typename P::param_type;
  using grad_type = typename P::grad_type;

  parameter_slot() = default;
  parameter_slot(const parameter_slot&) = delete;
  parameter_slot& operator=(const parameter_slot&) = delete;
  virtual ~parameter_slot() = default;

  const std::string& name() const { return name_; }
  bool decays() const { return decay_; }
  // Elements of the global tensor, and its extents.
  std::size_t size() const {
    std::size_t n = 1;
    for (auto e : global_) n *= e;
    return n;
  }
  std::vector<std::size_t> global_extents() const { return global_; }
  // The split over the data axis of this rank's compute block.
  data_split split() const { return split_; }

  // Stage 3's gather: the stored block; then rank r's block into the compute value.
  std::span<const param_type> stored_block() const {
    return {stored_view_->data(), stored_view_->size()};
  }
  virtual void receive_block(std::size_t r, const param_type* block) = 0;
  // Stages 0-2: the compute value from the stored copy (a conversion, no communication).
  virtual void compute_from_stored() = 0;
  // Makes the compute value a leaf of `t` (its storage as filled before).
  virtual void attach(autodiff::tape& t) = 0;
  // Frees the compute value's storage, keeping the variable (stage 3 between uses).
  virtual void free_compute() = 0;
  virtual void allocate_compute() = 0;
  // Forgets the variable and its gradient.
  virtual void detach() = 0;

  // The gradient backward left, reduced over the other mesh axes; empty when the
  // parameter was not reached (then zeros are reduced).
  virtual void take_gradient() = 0;
  void gradient_block(std::size_t r, grad_type* out) const {  // rows block(r)
    copy_rows_out<backend_t>(gradient_.data(), split_, split_.block(r), out);
  }
  void gradient_whole(grad_type* out) const {
    convert<backend_t>(gradient_, std::span<grad_type>(out, gradient_.size()));
  }
  // Stage 1: adds the whole gradient into the (partial) gradient buffer.
  void add_gradient_to_buffer() {
    accumulate<backend_t>(buffer_view_->data(), gradient_.data(), buffer_view_->size());
  }
  virtual void drop_gradient() = 0;

  // Persistent gradient buffer (gradient_buffer layout) and the kept gradient (what the
  // optimizer reads: kept_gradient layout).
  std::span<grad_type> gradient_buffer() { return {buffer_view_->data(), buffer_view_->size()}; }
  std::span<const grad_type> kept_gradient() const {
    if (kept_is_buffer_) return {buffer_view_->data(), buffer_view_->size()};
    return kept_ ? std::span<const grad_type>(kept_->data(), kept_->size())
                 : std::span<const grad_type>{};
  }
  std::span<grad_type> kept_gradient_storage() {
    if (kept_is_buffer_) return gradient_buffer();
    if (!kept_) kept_.emplace(kept_count_);
    return {kept_->data(), kept_->size()};
  }
  bool kept_gradient_counted() const { return kept_counted_; }  // counts in a global norm
  void release_step_buffers() {
    kept_.reset();
    memory::release(scratch_);
  }
  // Hands `visit` each model state a checkpoint holds, as the record of this rank's block
  // (zest/io/tensor_record.hpp: what tensors of every dims and layout reduce to): the stored
  // copy ("name"), the fp32 master if separate ("name.master") and Adam's moments
  // ("name.adam_m", "name.adam_v"). Records view the tensors: they live as long as this.
  virtual void visit_states(const std::function<void(io::tensor_record)>& visit) = 0;
  // The whole stored value on every rank, as floats (collective: for checks and reports).
  virtual std::vector<float> whole_value() const = 0;

  // The fp32 values the optimizer updates (the master shard), Adam's m and v.
  std::span<float> master() {
    if constexpr (P::has_master) {
      return {master_view_->data(), master_view_->size()};
    } else if (master_is_stored_) {
      return {stored_view_->data(), stored_view_->size()};  // fp32: the stored copy is the master
    } else {
      // fp32 under stages 1, 2: the master is this rank's block of the replicated copy,
      // extracted for the update and published back by the all-gather.
      resize_buffer<backend_t>(scratch_, split_.count(data_coord_));
      copy_rows_out<backend_t>(stored_view_->data(), split_, split_.block(data_coord_),
                               scratch_.data());
      return {scratch_.data(), scratch_.size()};
    }
  }
  std::span<float> adam_m() { return {m_view_->data(), m_view_->size()}; }
  std::span<float> adam_v() { return {v_view_->data(), v_view_->size()}; }
  // After the update: the stored copy from the master (stages 0, 3), or the updated block
  // to all-gather (stages 1, 2) and the received blocks.
  void store_from_master() {
    if constexpr (P::has_master) {
      convert<backend_t>(std::span<const float>(master_view_->data(), master_view_->size()),
                         std::span<param_type>(stored_view_->data(), stored_view_->size()));
    }
  }
  void published_block(param_type* out) const {
    if constexpr (P::has_master) {
      convert<backend_t>(std::span<const float>(master_view_->data(), master_view_->size()),
                         std::span<param_type>(out, master_view_->size()));
    } else {
      copy_elements<backend_t>(scratch_.data(), scratch_.size(), out);
    }
  }
  void receive_published(std::size_t r, const param_type* block) {
    copy_rows_in<backend_t>(block, split_, split_.block(r), stored_view_->data());
  }

 protected:
  using backend_t = backend_of<typename P::mesh_type>;
  template <class T>
  using buffer = typename backend_t::template buffer<T>;

  std::string name_;
  bool decay_ = true;
  // Set by the parameter's constructor: its extents and split, its data-axis coordinate,
  // what its layouts imply, and views of its tensors' storage (members of the parameter).
  std::vector<std::size_t> global_;
  data_split split_;
  std::size_t data_coord_ = 0;
  bool kept_is_buffer_ = true;    // kept_gradient and gradient_buffer layouts agree
  bool kept_counted_ = true;      // this rank's kept block counts in a global norm
  bool master_is_stored_ = true;  // fp32: master and stored layouts agree
  std::size_t kept_count_ = 0;    // elements of the kept block (when not the buffer)
  buffer<param_type>* stored_view_ = nullptr;
  buffer<grad_type>* buffer_view_ = nullptr;
  buffer<float>*m_view_ = nullptr, *v_view_ = nullptr;
  buffer<float>* master_view_ = nullptr;  // 16-bit policies
  std::span<const float> gradient_;       // the taken gradient (take_gradient to drop_gradient)
  std::optional<buffer<grad_type>> kept_;
  // fp32 stages 1, 2: this rank's block of the stored copy during a step (backend memory).
  // Uncounted std::vector on the host, as before the backends; a buffer of B elsewhere.
  std::conditional_t<host_loops<backend_t>, std::vector<float>, buffer<float>> scratch_;
};

}  // namespace detail

template <class P>
class zero_engine;

// A parameter of dims Dims under policy P; Base gives its placement on the mesh's other axes,
// SplitRule the dim the stage splits over the data axis (the policy's rule by default).
template <training_policy_type P, fixed_string Dims, class Base = layout<>,
          zero_split_rule SplitRule = typename P::stage::split_rule>
class parameter final : public detail::parameter_slot<P> {
  using mesh_t = typename P::mesh_type;
  using backend_t = backend_of<mesh_t>;
  using stage_t = typename P::stage::template with_split_rule<SplitRule>;
  static constexpr std::size_t data = P::data_axis;
  static constexpr layout_value base = layout_value_of<mesh_t, Dims, Base>;
  static constexpr zero_layouts z = stage_t::template layouts<mesh_t, Dims>;
  static constexpr char split_dim = stage_t::template split_dim<Dims>;
  static_assert(base.is_replicate(data),
                "zest parameter: the Base layout places the parameter on the data axis; the "
                "ZeRO stage does that. Fix: leave the data axis out of Base.");

 public:
  using typename detail::parameter_slot<P>::param_type;
  using typename detail::parameter_slot<P>::grad_type;
  static constexpr fixed_string dims = Dims;
  static constexpr zero_layouts layouts{detail::on_data_axis(base, z.stored, data),
                                        base,
                                        autodiff::dual(base),
                                        detail::on_data_axis(base, z.kept_gradient, data),
                                        detail::on_data_axis(base, z.gradient_buffer, data),
                                        detail::on_data_axis(base, z.optimizer_state, data),
                                        detail::on_data_axis(base, z.master, data)};
  static constexpr layout_value reduced_gradient =
      detail::reduce_other_axes(layouts.gradient, layouts.kept_gradient, data);

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
      : engine_(&engine),
        mesh_(&engine.mesh()),
        extents_(extents),
        stored_(*mesh_, extents, stored_tensor::uninitialized),
        buffer_(*mesh_, extents),
        m_(*mesh_, extents),
        v_(*mesh_, extents) {
    this->name_ = std::move(name);
    this->decay_ = decay;
    const std::uint64_t seed = engine.seed_for(this->name_);
    detail::initialise(stored_, seed, init);
    if constexpr (P::has_master) {
      master_.emplace(*mesh_, extents, state_tensor::uninitialized);
      detail::initialise(*master_, seed, init);
      this->master_view_ = &master_->storage();
    }
    this->stored_view_ = &stored_.storage();
    this->buffer_view_ = &buffer_.storage();
    this->m_view_ = &m_.storage();
    this->v_view_ = &v_.storage();
    this->global_.assign(extents.begin(), extents.end());
    // The split over the data axis of the compute block.
    auto& split = this->split_;
    const std::size_t k = Dims.find(split_dim);
    const auto coords = mesh_->coords();
    std::size_t kept = 1;
    for (std::size_t i = 0; i < Dims.size(); ++i) {
      const std::size_t local =
          dim_range(layouts.compute, Dims[i], extents[i], mesh_->sizes(), coords).size;
      if (i < k) split.outer *= local;
      if (i == k) split.extent = local;
      if (i > k) split.inner *= local;
      kept *= dim_range(layouts.kept_gradient, Dims[i], extents[i], mesh_->sizes(), coords).size;
    }
    split.parts = static_cast<std::size_t>(mesh_->size(data));
    this->data_coord_ = static_cast<std::size_t>(mesh_->coord(data));
    this->kept_is_buffer_ = layouts.kept_gradient == layouts.gradient_buffer;
    this->kept_count_ = kept;
    this->master_is_stored_ = layouts.master == layouts.stored;
    // Each element of the global gradient counts once in a norm: on every axis where the
    // kept layout is replicated, only coordinate 0 counts.
    for (std::size_t a = 0; a < mesh_t::axis_count; ++a) {
      if (layouts.kept_gradient.is_replicate(a) && mesh_->coord(a) != 0) {
        this->kept_counted_ = false;
      }
    }
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

  const stored_tensor& stored() const { return stored_; }
  stored_tensor& stored() { return stored_; }
  const buffer_tensor& gradient_buffer_tensor() const { return buffer_; }
  buffer_tensor& gradient_buffer_tensor() { return buffer_; }
  const state_tensor& moment1() const { return m_; }
  const state_tensor& moment2() const { return v_; }
  state_tensor& moment1() { return m_; }
  state_tensor& moment2() { return v_; }
  // fp32 master weights (16-bit policies only).
  state_tensor& master_tensor() requires(P::has_master) { return *master_; }
  const state_tensor& master_tensor() const requires(P::has_master) { return *master_; }

  // --- parameter_slot: what depends on the tensors' types --------------------------------
  void receive_block(std::size_t r, const param_type* block) override {
    const auto& split = this->split_;
    detail::copy_rows_in<backend_t>(block, split, split.block(r), compute_storage().data());
  }
  void compute_from_stored() override {
    // Stored and compute differ only in the data axis placement (replicate for stages 0-2).
    allocate_compute();
    detail::convert<backend_t>(std::span<const param_type>(stored_.local()), compute_storage());
  }
  void allocate_compute() override {
    if (var_) {
      auto& v = var_->node()->value;
      if constexpr (detail::host_loops<backend_t>) {
        v.storage().resize(v.local_count());
      } else {
        v.storage() = typename compute_tensor::storage_type(v.local_count());
      }
    } else {
      pending_.emplace(*mesh_, extents_, compute_tensor::uninitialized);
    }
  }
  void attach(autodiff::tape& t) override {
    var_.emplace(t.parameter(std::move(*pending_)));
    pending_.reset();
  }
  void free_compute() override {
    if (var_) {
      auto& s = var_->node()->value.storage();
      if constexpr (detail::host_loops<backend_t>) {
        s.clear();
        s.shrink_to_fit();
      } else {
        s = typename compute_tensor::storage_type{};
      }
    }
  }
  void detach() override {
    var_.reset();
    pending_.reset();
    drop_gradient();
  }

  void take_gradient() override {
    if (!var_ || !var_->has_gradient()) {
      grad_.emplace(*mesh_, extents_);  // not reached: a zero gradient
    } else {
      // Pending sums over other axes (a weight replicated over a tensor-parallel axis) are
      // reduced here; the data axis is the engine's, coalesced over the group.
      grad_.emplace(redistribute_to<reduced_gradient>(std::move(*var_->node()->grad)));
      var_->zero_grad();
    }
    this->gradient_ = std::as_const(*grad_).local();
  }
  void drop_gradient() override {
    grad_.reset();
    this->gradient_ = {};
  }

  // f(name, tensor) for each model state a checkpoint holds, with its own type (what
  // visit_states hands on as records).
  template <class F>
  void for_each_state(F&& f) {
    f(this->name_, stored_);
    if constexpr (P::has_master) f(this->name_ + ".master", *master_);
    f(this->name_ + ".adam_m", m_);
    f(this->name_ + ".adam_v", v_);
  }
  void visit_states(const std::function<void(io::tensor_record)>& visit) override {
    for_each_state([&](std::string name, auto& t) { visit(io::record(std::move(name), t)); });
  }

  std::vector<float> whole_value() const override {
    const auto all = to_global(stored_);
    return std::vector<float>(all.begin(), all.end());
  }

 private:
  std::span<float> compute_storage() {
    if (pending_) return pending_->local();
    return var_->node()->value.local();
  }

  const zero_engine<P>* engine_;
  const mesh_t* mesh_;
  extents_type extents_;
  stored_tensor stored_;
  buffer_tensor buffer_;
  state_tensor m_, v_;
  std::optional<state_tensor> master_;
  std::optional<compute_tensor> pending_;
  std::optional<variable_type> var_;
  std::optional<reduced_gradient_tensor> grad_;
};

}  // namespace zest
