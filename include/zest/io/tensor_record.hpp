// zest/io/tensor_record.hpp — one rank's block of a named tensor, described as data.
//
//   zest::io::tensor_record r = zest::io::record("wte", wte);  // a view of wte's shard
//   r.dims;            // "vm"         r.global_extents;  // {50304, 768}
//   r.local_offsets;   // this rank's block in global index space, r.local_extents its size
//   r.bytes;           // the block, dense and row-major (host memory)
//
// What a checkpoint (zest/io/checkpoint.hpp) saves and loads into, and nothing of files: a
// record is what is left of a sharded tensor's type once its layout and mesh are read (its
// block, whether this rank writes it), so code that holds tensors of many types (a model's
// parameters, zest/zero/parameter.hpp) hands them to the checkpoint as records without
// knowing about manifests or shard files.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/backend/host/host_backend.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::io {

// One tensor to save or load: what it is, and this rank's block of it.
struct tensor_record {
  std::string name;
  std::string dims;  // one letter per dim, e.g. "vm"
  dtype type = dtype::f32;
  std::vector<std::size_t> global_extents, local_offsets, local_extents;
  std::string layout;  // to_string of the layout: saved for information
  // This rank writes this block on save: on every axis where the layout is replicate,
  // coordinate 0 only (the other coordinates hold copies).
  bool writes = false;
  // This rank's block, dense and row-major: read on save, written on load.
  std::span<std::byte> bytes;
  // Made from a const tensor: it can be saved, not loaded into.
  bool read_only = false;
  // A tensor outside host memory: `bytes` views `host_copy`, and after a load `write_back`
  // copies it into the tensor (empty for host tensors, whose records view their shards).
  std::shared_ptr<void> host_copy;
  std::function<void()> write_back;
};
namespace detail {

// The record from the tensor's figures: a function of no tensor type, so that it is compiled
// once, not once per tensor type (bench/README.md, "Compile time and memory").
inline tensor_record make_record_of(std::string name, std::string_view dims, dtype type,
                                    std::span<const std::size_t> global,
                                    std::span<const std::size_t> offsets,
                                    std::span<const std::size_t> local, std::string layout,
                                    bool writes, std::span<std::byte> bytes) {
  tensor_record r;
  r.name = std::move(name);
  r.dims = std::string(dims);
  r.type = type;
  r.global_extents.assign(global.begin(), global.end());
  r.local_offsets.assign(offsets.begin(), offsets.end());
  r.local_extents.assign(local.begin(), local.end());
  r.layout = std::move(layout);
  r.writes = writes;
  r.bytes = bytes;
  return r;
}

template <sharded_tensor X>
tensor_record make_record(std::string name, const X& tensor, std::span<std::byte> bytes) {
  using mesh_type = typename X::mesh_type;
  if constexpr (X::layout.any_partial()) {
    (void)tensor;
    (void)bytes;
    throw shape_error(zest::detail::message(
        "zest: io::record: tensor \"", name, "\" has layout ", layout_string<X>(),
        ", which is partial: its value is a pending sum over ranks; reduce it first "
        "(redistribute to a layout without partial axes)"));
  } else {
    bool writes = true;
    for (std::size_t a = 0; a < mesh_type::axis_count; ++a) {
      if (X::layout.is_replicate(a) && tensor.mesh().coord(a) != 0) writes = false;
    }
    return make_record_of(std::move(name), view_of<X::dims>, dtype_of<typename X::value_type>(),
                          tensor.extents(), tensor.local_offsets(), tensor.local_extents(),
                          layout_string<X>(), writes, bytes);
  }
}

// A host copy of a shard outside host memory, shared by the copies of its record.
template <sharded_tensor X>
std::shared_ptr<host_vector<typename X::value_type>> host_copy_of(const X& tensor) {
  return std::make_shared<host_vector<typename X::value_type>>(tensor.local_to_host());
}
}  // namespace detail

// The record of a tensor to save or load into (loading writes into its shard). Throws
// shape_error for a layout that is partial on some axis.
template <sharded_tensor X>
tensor_record record(std::string name, X& tensor) {
  if constexpr (std::is_same_v<typename X::backend_type, host_backend>) {
    return detail::make_record(std::move(name), std::as_const(tensor),
                               std::as_writable_bytes(tensor.local()));
  } else {
    using T = typename X::value_type;
    auto copy = detail::host_copy_of(tensor);
    tensor_record r = detail::make_record(std::move(name), std::as_const(tensor),
                                          std::as_writable_bytes(std::span<T>(*copy)));
    r.write_back = [&tensor, copy] {
      tensor.storage() = X::backend_type::template from_host<T>(std::span<const T>(*copy));
    };
    r.host_copy = std::move(copy);
    return r;
  }
}

// The record of a const tensor: for saving only (load_checkpoint refuses it).
template <sharded_tensor X>
tensor_record record(std::string name, const X& tensor) {
  if constexpr (!std::is_same_v<typename X::backend_type, host_backend>) {
    using T = typename X::value_type;
    auto copy = detail::host_copy_of(tensor);
    tensor_record r =
        detail::make_record(std::move(name), tensor, std::as_writable_bytes(std::span<T>(*copy)));
    r.host_copy = std::move(copy);
    r.read_only = true;
    return r;
  } else {
    const std::span<const std::byte> view = std::as_bytes(tensor.local());
    // Never written through: load_checkpoint refuses records marked read_only.
    tensor_record r = detail::make_record(
        std::move(name), tensor,
        std::span<std::byte>(const_cast<std::byte*>(view.data()), view.size()));  // NOLINT
    r.read_only = true;
    return r;
  }
}

// A temporary would be gone before the record is used.
template <sharded_tensor X>
requires(!std::is_reference_v<X>) tensor_record record(std::string name, X&& tensor)
= delete;

}  // namespace zest::io
