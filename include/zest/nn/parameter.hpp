// zest/nn/parameter.hpp — a trainable tensor whose ZeRO stage is part of its type.
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
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/dual.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/float16.hpp"
#include "zest/core/random.hpp"
#include "zest/io/checkpoint.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"
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
  static constexpr std::size_t data_axis = detail::axis_index_of<Mesh>(Stage::data_axis);
  static_assert(data_axis < Mesh::axis_count,
                "zest training_policy: the mesh has no axis named like the stage's data axis. "
                "Fix: zero_stage<K, \"name\"> with one of the mesh's axis names.");
};

template <class P>
concept training_policy_type = requires {
  typename P::mesh_type;
  typename P::stage;
  typename P::param_type;
  P::data_axis;
};

// ---------------------------------------------------------------------------------------
// Initialisers: functions of the global index and a seed, so that every rank count and
// layout gives the same values.

namespace init {
// N(0, std) from (seed, global flat index): Box-Muller on two counter-based uniforms.
struct normal {
  double stddev = 0.02;
  double operator()(std::uint64_t seed, std::uint64_t index) const {
    const std::uint64_t a = splitmix64(seed ^ splitmix64(2 * index));
    const std::uint64_t b = splitmix64(seed ^ splitmix64(2 * index + 1));
    const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
    return stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
};
struct constant {
  double value = 0;
  double operator()(std::uint64_t, std::uint64_t) const { return value; }
};
}  // namespace init
using initializer = std::function<double(std::uint64_t seed, std::uint64_t index)>;

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
// zest::parameter. P is the training policy.
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
  virtual std::size_t size() const = 0;
  virtual std::vector<std::size_t> global_extents() const = 0;
  // The split over the data axis of this rank's compute block.
  virtual data_split split() const = 0;

  // Stage 3's gather: the stored block; then rank r's block into the compute value.
  virtual std::span<const param_type> stored_block() const = 0;
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
  virtual void gradient_block(std::size_t r, grad_type* out) const = 0;  // rows block(r)
  virtual void gradient_whole(grad_type* out) const = 0;
  // Stage 1: adds the whole gradient into the (partial) gradient buffer.
  virtual void add_gradient_to_buffer() = 0;
  virtual void drop_gradient() = 0;

  // Persistent gradient buffer (gradient_buffer layout) and the kept gradient (what the
  // optimizer reads: kept_gradient layout).
  virtual std::span<grad_type> gradient_buffer() = 0;
  virtual std::span<const grad_type> kept_gradient() const = 0;
  virtual std::span<grad_type> kept_gradient_storage() = 0;
  virtual bool kept_gradient_counted() const = 0;  // its elements count in a global norm
  virtual void release_step_buffers() = 0;
  // The states a checkpoint holds: the stored copy ("name"), the fp32 master if separate
  // ("name.master") and Adam's moments ("name.adam_m", "name.adam_v").
  virtual void checkpoint_records(std::vector<io::tensor_record>& out) = 0;
  // The whole stored value on every rank, as floats (collective: for checks and reports).
  virtual std::vector<float> whole_value() const = 0;

  // The fp32 values the optimizer updates (the master shard), Adam's m and v.
  virtual std::span<float> master() = 0;
  virtual std::span<float> adam_m() = 0;
  virtual std::span<float> adam_v() = 0;
  // After the update: the stored copy from the master (stages 0, 3), or the updated block
  // to all-gather (stages 1, 2) and the received blocks.
  virtual void store_from_master() = 0;
  virtual void published_block(param_type* out) const = 0;
  virtual void receive_published(std::size_t r, const param_type* block) = 0;

 protected:
  std::string name_;
  bool decay_ = true;
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
      : mesh_(&engine.mesh()),
        extents_(extents),
        stored_(*mesh_, extents, stored_tensor::uninitialized),
        buffer_(*mesh_, extents),
        m_(*mesh_, extents),
        v_(*mesh_, extents) {
    this->name_ = std::move(name);
    this->decay_ = decay;
    const std::uint64_t seed = engine.seed_for(this->name_);
    auto value = [&](const extents_type& i) {
      std::uint64_t flat = 0;
      for (std::size_t k = 0; k < Dims.size(); ++k) flat = flat * extents[k] + i[k];
      return init(seed, flat);
    };
    stored_ = stored_tensor::generate(*mesh_, extents, [&](const extents_type& i) {
      return static_cast<param_type>(static_cast<float>(value(i)));
    });
    if constexpr (P::has_master) {
      master_.emplace(state_tensor::generate(
          *mesh_, extents, [&](const extents_type& i) { return static_cast<float>(value(i)); }));
    }
    // The split over the data axis of the compute block.
    const std::size_t k = Dims.find(split_dim);
    for (std::size_t i = 0; i < Dims.size(); ++i) {
      const std::size_t local =
          dim_range(layouts.compute, Dims[i], extents[i], mesh_->sizes(), mesh_->coords()).size;
      if (i < k) split_.outer *= local;
      if (i == k) split_.extent = local;
      if (i > k) split_.inner *= local;
    }
    split_.parts = static_cast<std::size_t>(mesh_->size(data));
    engine.add(*this);
  }

  const extents_type& extents() const { return extents_; }
  std::size_t size() const override {
    std::size_t n = 1;
    for (auto e : extents_) n *= e;
    return n;
  }
  std::vector<std::size_t> global_extents() const override {
    return {extents_.begin(), extents_.end()};
  }
  detail::data_split split() const override { return split_; }

  // The compute value during a step (after the engine gathered it): use it in einsums.
  const variable_type& value() const {
    if (!var_) {
      throw std::logic_error(detail::message(
          "zest parameter '", this->name_,
          "': used outside its group's scope; enter the group with the engine first"));
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

  // --- parameter_slot ---------------------------------------------------------------------
  std::span<const param_type> stored_block() const override { return stored_.local(); }
  void receive_block(std::size_t r, const param_type* block) override {
    detail::copy_rows_in<backend_t>(block, split_, split_.block(r), compute_storage().data());
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
    grad_.reset();
  }

  void take_gradient() override {
    if (!var_ || !var_->has_gradient()) {
      grad_.emplace(*mesh_, extents_);  // not reached: a zero gradient
      return;
    }
    // Pending sums over other axes (a weight replicated over a tensor-parallel axis) are
    // reduced here; the data axis is the engine's, coalesced over the group.
    grad_.emplace(redistribute_to<reduced_gradient>(std::move(*var_->node()->grad)));
    var_->zero_grad();
  }
  void gradient_block(std::size_t r, grad_type* out) const override {
    detail::copy_rows_out<backend_t>(grad_->local().data(), split_, split_.block(r), out);
  }
  void gradient_whole(grad_type* out) const override {
    detail::convert<backend_t>(std::span<const float>(grad_->local()),
                               std::span<grad_type>(out, grad_->local_count()));
  }
  void add_gradient_to_buffer() override {
    const auto g = std::as_const(*grad_).local();
    auto b = buffer_.local();
    detail::accumulate<backend_t>(b.data(), g.data(), b.size());
  }
  void drop_gradient() override { grad_.reset(); }
  void release_step_buffers() override {
    kept_.reset();
    memory::release(scratch_);
  }

  std::span<grad_type> gradient_buffer() override { return buffer_.local(); }
  std::span<const grad_type> kept_gradient() const override {
    if constexpr (layouts.kept_gradient == layouts.gradient_buffer) {
      return buffer_.local();
    } else {
      return kept_ ? kept_->local() : std::span<const grad_type>{};
    }
  }
  std::span<grad_type> kept_gradient_storage() override {
    if constexpr (layouts.kept_gradient == layouts.gradient_buffer) {
      return buffer_.local();
    } else {
      if (!kept_) kept_.emplace(*mesh_, extents_, kept_tensor::uninitialized);
      return kept_->local();
    }
  }
  bool kept_gradient_counted() const override {
    // Each element of the global gradient counts once: on every axis where the kept layout
    // is replicated, only coordinate 0 counts.
    for (std::size_t a = 0; a < mesh_t::axis_count; ++a) {
      if (layouts.kept_gradient.is_replicate(a) && mesh_->coord(a) != 0) return false;
    }
    return true;
  }

  std::span<float> master() override {
    if constexpr (P::has_master) {
      return master_->local();
    } else if constexpr (layouts.master == layouts.stored) {
      return stored_.local();  // fp32: the stored copy is the master
    } else {
      // fp32 under stages 1, 2: the master is this rank's block of the replicated copy,
      // extracted for the update and published back by the all-gather.
      const std::size_t me = static_cast<std::size_t>(mesh_->coord(data));
      detail::resize_buffer<backend_t>(scratch_, split_.count(me));
      detail::copy_rows_out<backend_t>(stored_.local().data(), split_, split_.block(me),
                                       scratch_.data());
      return {scratch_.data(), scratch_.size()};
    }
  }
  void checkpoint_records(std::vector<io::tensor_record>& out) override {
    out.push_back(io::record(this->name_, stored_));
    if constexpr (P::has_master) out.push_back(io::record(this->name_ + ".master", *master_));
    out.push_back(io::record(this->name_ + ".adam_m", m_));
    out.push_back(io::record(this->name_ + ".adam_v", v_));
  }

  std::vector<float> whole_value() const override {
    const auto all = to_global(stored_);
    return std::vector<float>(all.begin(), all.end());
  }

  std::span<float> adam_m() override { return m_.local(); }
  std::span<float> adam_v() override { return v_.local(); }

  void store_from_master() override {
    if constexpr (P::has_master) {
      detail::convert<backend_t>(std::span<const float>(master_->local()), stored_.local());
    }
  }
  void published_block(param_type* out) const override {
    if constexpr (P::has_master) {
      detail::convert<backend_t>(std::span<const float>(master_->local()),
                                 std::span<param_type>(out, master_->local_count()));
    } else {
      detail::copy_elements<backend_t>(scratch_.data(), scratch_.size(), out);
    }
  }
  void receive_published(std::size_t r, const param_type* block) override {
    detail::copy_rows_in<backend_t>(block, split_, split_.block(r), stored_.local().data());
  }

 private:
  std::span<float> compute_storage() {
    if (pending_) return pending_->local();
    return var_->node()->value.local();
  }

  const mesh_t* mesh_;
  extents_type extents_;
  stored_tensor stored_;
  buffer_tensor buffer_;
  state_tensor m_, v_;
  std::optional<state_tensor> master_;
  std::optional<kept_tensor> kept_;
  std::optional<compute_tensor> pending_;
  std::optional<variable_type> var_;
  std::optional<reduced_gradient_tensor> grad_;
  // fp32 stages 1, 2: this rank's block of the stored copy during a step (backend memory).
  // Uncounted std::vector on the host, as before the backends; a buffer of B elsewhere.
  std::conditional_t<detail::host_loops<backend_t>, std::vector<float>,
                     typename backend_t::template buffer<float>>
      scratch_;
  detail::data_split split_;
};

}  // namespace zest
