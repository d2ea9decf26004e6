// zest/tensor/tensor.hpp — a sharded tensor: element type, dims and layout in the type.
//
//   using mesh_t = zest::mesh<"dp", "tp">;
//   using act_t  = zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "dp">>>;
//   act_t x = act_t::generate(m, {8, 128, 512}, [](auto i) { return float(i[0] + i[2]); });
//
// Global extents are run-time values; every rank holds the block its mesh coordinates
// select (zest/layout/shard.hpp), stored dense and row-major in the order of the dims.
// On an axis where the layout is partial, the value is the sum of the ranks' blocks.
//
// A tensor moved from (std::move(x) into another tensor) holds nothing: every accessor of
// it throws zest::shape_error naming the accessor, the tensor and the fix, rather than
// handing out an empty shard with its old extents (which einsum would read past). The
// check is one pointer compare per accessor call, never per element.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "zest/backend/backend.hpp"
#include "zest/backend/host/host_backend.hpp"
#include "zest/config.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/memory.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"

namespace zest {

namespace detail {
enum class dims_problem : std::uint8_t { none, too_many, bad_letter, repeated };

template <fixed_string Dims>
constexpr dims_problem check_dims() {
  if (Dims.size() > max_dims) return dims_problem::too_many;
  for (std::size_t i = 0; i < Dims.size(); ++i) {
    const char c = Dims[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return dims_problem::bad_letter;
    if (Dims.find(c) != i) return dims_problem::repeated;
  }
  return dims_problem::none;
}
}  // namespace detail

namespace detail {
// Out of line and one for all tensor types: the accessors' cold path.
[[noreturn]] inline void throw_moved_from(const char* accessor, std::string_view dims,
                                          layout_value layout,
                                          std::span<const std::string_view> axis_names) {
  throw shape_error(
      message("zest: tensor \"", dims, "\" ", to_string(layout, axis_names), ": ", accessor,
              " of a tensor that was moved from (std::move gave its storage to another tensor; it "
              "holds nothing now). Fix: use the tensor it was moved into, or assign it a new value "
              "first"));
}
[[noreturn]] inline void throw_shard_size(std::string_view dims, std::size_t have,
                                          std::size_t want) {
  throw shape_error(message("zest: tensor \"", dims, "\": local shard has ", have,
                            " elements, the layout gives this rank ", want));
}
}  // namespace detail

template <class T, class Mesh, fixed_string Dims, layout_key Layout>
class basic_tensor {
  static_assert(is_element_type_v<T>,
                "zest tensor: unsupported element type; use float, double, zest::bfloat16, "
                "zest::float16, int32_t, int64_t, uint8_t or uint16_t (a mask: uint8_t, not "
                "bool)");
  static_assert(detail::check_dims<Dims>() != detail::dims_problem::too_many,
                "zest tensor: too many dims; zest::max_dims (config.hpp) is the limit");
  static_assert(detail::check_dims<Dims>() != detail::dims_problem::bad_letter,
                "zest tensor: dims are letters a-z or A-Z, one per dim, e.g. \"bsm\"");
  static_assert(detail::check_dims<Dims>() != detail::dims_problem::repeated,
                "zest tensor: a dim letter appears twice; give every dim its own letter");

 public:
  using zest_tensor_tag = void;  // opts into the sharded_tensor concept
  using value_type = T;
  using mesh_type = Mesh;
  using backend_type = backend_of<Mesh>;
  using storage_type = typename backend_type::template buffer<T>;
  static constexpr fixed_string dims = Dims;
  static constexpr layout_value layout = to_layout(Layout);
  static constexpr std::size_t rank = Dims.size();
  using extents_type = std::array<std::size_t, rank>;

  static constexpr std::size_t dim_index(char d) { return Dims.find(d); }

  // A zero tensor with the given global extents.
  basic_tensor(const Mesh& mesh, const extents_type& extents) : mesh_(&mesh), extents_(extents) {
    locate();
    data_ = storage_type(local_count());
    backend_type::fill(data_.data(), data_.size(), T{});
  }

  // Storage of the right size, contents unspecified: for results that a kernel overwrites.
  struct uninitialized_t {};
  static constexpr uninitialized_t uninitialized{};
  basic_tensor(const Mesh& mesh, const extents_type& extents, uninitialized_t)
      : mesh_(&mesh), extents_(extents) {
    locate();
    data_ = storage_type(local_count());
  }

  // Takes over a local shard that the caller computed (size must match the layout).
  basic_tensor(const Mesh& mesh, const extents_type& extents, storage_type&& local)
      : mesh_(&mesh), extents_(extents), data_(std::move(local)) {
    locate();
    if (data_.size() != local_count())
      detail::throw_shard_size(view_of<Dims>, data_.size(), local_count());
  }

  // Fills only this rank's shard: f(global_index) for each element it holds. On a partial
  // axis the value lives on coordinate 0 and the other ranks hold zeros.
  template <class F>
  static basic_tensor generate(const Mesh& mesh, const extents_type& extents, F&& f) {
    basic_tensor t(mesh, extents, uninitialized);
    if (!t.holds_partial_summand()) {
      backend_type::fill(t.data_.data(), t.data_.size(), T{});
      return t;
    }
    host_vector<T> values(t.local_count());
    extents_type index{};
    for (std::size_t flat = 0; flat < values.size(); ++flat) {
      std::size_t rest = flat;
      for (std::size_t i = rank; i-- > 0;) {
        index[i] = t.offsets_[i] + rest % t.local_extents_[i];
        rest /= t.local_extents_[i];
      }
      values[flat] = static_cast<T>(f(std::as_const(index)));
    }
    if constexpr (std::is_same_v<storage_type, host_vector<T>>) {
      t.data_ = std::move(values);
    } else {
      t.data_ =
          backend_type::template from_host<T>(std::span<const T>(values.data(), values.size()));
    }
    return t;
  }

  // Each rank copies its block out of a global row-major array (identical on every rank).
  static basic_tensor from_global(const Mesh& mesh, const extents_type& extents,
                                  std::span<const T> global) {
    std::size_t total = 1;
    for (auto e : extents) total *= e;
    if (global.size() != total) {
      throw shape_error(detail::message("zest: tensor \"", view_of<Dims>,
                                        "\"::from_global: the array has ", global.size(),
                                        " elements, the extents need ", total));
    }
    return generate(mesh, extents, [&](const extents_type& i) {
      std::size_t flat = 0;
      for (std::size_t k = 0; k < rank; ++k) flat = flat * extents[k] + i[k];
      return global[flat];
    });
  }

  basic_tensor(const basic_tensor&) = default;
  basic_tensor& operator=(const basic_tensor&) = default;
  // Moving leaves the source without a mesh: its accessors throw from then on. Assigning
  // to it makes it usable again.
  basic_tensor(basic_tensor&& other) noexcept(std::is_nothrow_move_constructible_v<storage_type>)
      : mesh_(std::exchange(other.mesh_, nullptr)),
        extents_(other.extents_),
        local_extents_(other.local_extents_),
        offsets_(other.offsets_),
        data_(std::move(other.data_)) {}
  basic_tensor& operator=(basic_tensor&& other) noexcept(
      std::is_nothrow_move_assignable_v<storage_type>) {
    if (this != &other) {
      mesh_ = std::exchange(other.mesh_, nullptr);
      extents_ = other.extents_;
      local_extents_ = other.local_extents_;
      offsets_ = other.offsets_;
      data_ = std::move(other.data_);
    }
    return *this;
  }
  ~basic_tensor() = default;

  // True after the tensor was moved from (and not assigned since): it holds nothing.
  bool is_moved_from() const { return mesh_ == nullptr; }

  const Mesh& mesh() const { return *usable("mesh()").mesh_; }
  const extents_type& extents() const { return usable("extents()").extents_; }
  std::size_t extent(char d) const { return usable("extent()").extents_[dim_index(d)]; }
  const extents_type& local_extents() const { return usable("local_extents()").local_extents_; }
  // Global index of this rank's first element along each dim.
  const extents_type& local_offsets() const { return usable("local_offsets()").offsets_; }
  std::size_t size() const {
    std::size_t n = 1;
    for (auto e : usable("size()").extents_) n *= e;
    return n;
  }
  std::size_t local_count() const {
    std::size_t n = 1;
    for (auto e : usable("local_count()").local_extents_) n *= e;
    return n;
  }

  std::span<T> local() {
    (void)usable("local()");
    return {data_.data(), data_.size()};
  }
  std::span<const T> local() const { return {usable("local()").data_.data(), data_.size()}; }
  storage_type& storage() {
    (void)usable("storage()");
    return data_;
  }
  const storage_type& storage() const { return usable("storage()").data_; }
  // The local shard copied to host memory (for any backend).
  host_vector<T> local_to_host() const {
    (void)usable("local_to_host()");
    host_vector<T> out(data_.size());
    backend_type::to_host(std::span<const T>(data_.data(), data_.size()), out.data());
    return out;
  }

  // The local shard as an Eigen matrix, no copy: rows = all dims but the last, cols = last.
  auto local_matrix() requires(
      (std::is_same_v<T, float> ||
       std::is_same_v<T, double>)&&std::is_same_v<backend_type, host_backend>) {
    (void)usable("local_matrix()");
    return Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
        data_.data(), static_cast<Eigen::Index>(matrix_rows()),
        static_cast<Eigen::Index>(matrix_cols()));
  }
  auto local_matrix() const
      requires((std::is_same_v<T, float> ||
                std::is_same_v<T, double>)&&std::is_same_v<backend_type, host_backend>) {
    (void)usable("local_matrix()");
    return Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
        data_.data(), static_cast<Eigen::Index>(matrix_rows()),
        static_cast<Eigen::Index>(matrix_cols()));
  }

  // Whether this rank's block carries (part of) the value: false on the ranks that hold
  // zeros of a partial axis created from a replicated value.
  bool holds_partial_summand() const {
    (void)usable("holds_partial_summand()");
    for (std::size_t a = 0; a < Mesh::axis_count; ++a) {
      if (layout.is_partial(a) && mesh_->coord(a) != 0) return false;
    }
    return true;
  }

 private:
  // Every accessor's check: *this, or a shape_error when the tensor was moved from.
  const basic_tensor& usable(const char* accessor) const {
    if (mesh_ == nullptr) [[unlikely]] {
      detail::throw_moved_from(accessor, view_of<Dims>, layout,
                               std::span<const std::string_view>(Mesh::axis_names));
    }
    return *this;
  }
  std::size_t matrix_cols() const { return rank == 0 ? 1 : local_extents_[rank - 1]; }
  std::size_t matrix_rows() const {
    std::size_t n = 1;
    for (std::size_t i = 0; i + 1 < rank; ++i) n *= local_extents_[i];
    return n;
  }
  void locate() {
    locate_block(layout, view_of<Dims>, extents_.data(), mesh_->sizes(), mesh_->coords(),
                 offsets_.data(), local_extents_.data());
  }

  const Mesh* mesh_;
  extents_type extents_{};
  extents_type local_extents_{};
  extents_type offsets_{};
  storage_type data_;
};

// The spelling users write: zest::tensor<float, mesh_t, "bsm", layout<split<'b', "dp">>>.
template <class T, class Mesh, fixed_string Dims, class Layout = layout<>>
using tensor = basic_tensor<T, Mesh, Dims, layout_value_of<Mesh, Dims, Layout>>;

template <class X>
concept sharded_tensor = requires {
  typename std::remove_cvref_t<X>::zest_tensor_tag;
};

// True when tensor type X has layout L (written as users write layouts):
//   static_assert(zest::has_layout<decltype(y), zest::layout<zest::split<'b', "dp">>>);
template <sharded_tensor X, class L>
inline constexpr bool has_layout = X::layout == layout_value_of<typename X::mesh_type, X::dims, L>;

// The same tensor type with another layout: with_layout<X, L>, or with_layout_for<X, L>::type
// in a template where L is computed from a dependent type (with_layout<X, dual(X::layout)>):
// g++ 12 crashes on an alias template given a dependent call as a class-type argument, and
// not on a class template. zest's own templates spell "X laid out as L" with the class; the
// other types computed from a dependent layout (layout_type_for, moe::routing_for) are
// classes for the same reason.
template <sharded_tensor X, layout_key L>
struct with_layout_for {
  using type = basic_tensor<typename X::value_type, typename X::mesh_type, X::dims, L>;
};
template <sharded_tensor X, layout_key L>
using with_layout = typename with_layout_for<X, L>::type;

// "split(b:dp) partial(tp)"
template <sharded_tensor X>
std::string layout_string() {
  return to_string(X::layout, X::mesh_type::axis_names);
}

}  // namespace zest
