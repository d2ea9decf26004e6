// zest/io/tensor_record.hpp — one rank's block of a named tensor, described as data.
//
//   zest::io::tensor_record r = zest::io::record("wte", wte);  // a view of wte's shard
//   r.dims;            // "vm"         r.global_extents;  // {50304, 768}
//   r.local_offsets;   // this rank's block in global index space, r.local_extents its size
//   r.bytes;           // the block, dense and row-major (host memory)
//
// The block reaches host memory through the backend's host_staging
// (zest/backend/backend.hpp): a host tensor's record views its shard; a GPU's (or the emulated
// backend's) holds a host copy, which write_back puts into the shard after a load.
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

#include "zest/backend/backend.hpp"
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
  // The block as the tensor's backend stages it for the host, shared by the record's copies:
  // `bytes` views it. After a load `write_back` puts it into the tensor's shard (nothing to
  // do for a host tensor, whose record views the shard itself; empty for a read-only record).
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
                                    bool writes) {
  tensor_record r;
  r.name = std::move(name);
  r.dims = std::string(dims);
  r.type = type;
  r.global_extents.assign(global.begin(), global.end());
  r.local_offsets.assign(offsets.begin(), offsets.end());
  r.local_extents.assign(local.begin(), local.end());
  r.layout = std::move(layout);
  r.writes = writes;
  return r;
}

// The record's figures; its bytes are set by stage() below.
template <sharded_tensor X>
tensor_record make_record(std::string name, const X& tensor) {
  using mesh_type = typename X::mesh_type;
  if constexpr (X::layout.any_partial()) {
    (void)tensor;
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
                          layout_string<X>(), writes);
  }
}

// Gives r the shard `local` of a tensor of backend B as host memory (host_staging), kept alive
// by the record: `bytes` views it, `write_back` puts it into the shard after a load. A const
// shard's record is read-only. A function of the backend and element type only, not of the
// tensor's type.
template <class B, class T>
void stage(tensor_record& r, std::span<T> local) {
  auto staged = std::make_shared<host_staging<B, T>>(local);
  const std::span<const std::byte> view = std::as_bytes(staged->host());
  // A read-only record is never written through: load_checkpoint refuses it.
  r.bytes = std::span<std::byte>(const_cast<std::byte*>(view.data()), view.size());  // NOLINT
  if constexpr (std::is_const_v<T>) {
    r.read_only = true;
  } else {
    r.write_back = [staged] { staged->write_back(); };
  }
  r.host_copy = std::move(staged);
}
}  // namespace detail

// The record of a tensor to save or load into (loading writes into its shard). Throws
// shape_error for a layout that is partial on some axis.
template <sharded_tensor X>
tensor_record record(std::string name, X& tensor) {
  tensor_record r = detail::make_record(std::move(name), std::as_const(tensor));
  detail::stage<typename X::backend_type>(r, tensor.local());
  return r;
}

// The record of a const tensor: for saving only (load_checkpoint refuses it).
template <sharded_tensor X>
tensor_record record(std::string name, const X& tensor) {
  tensor_record r = detail::make_record(std::move(name), tensor);
  detail::stage<typename X::backend_type>(r, tensor.local());
  return r;
}

// A temporary would be gone before the record is used.
template <sharded_tensor X>
requires(!std::is_reference_v<X>) tensor_record record(std::string name, X&& tensor)
= delete;

}  // namespace zest::io
