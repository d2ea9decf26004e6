// zest/io/checkpoint.hpp — sharded checkpoints of named tensors that load onto another mesh.
//
//   std::vector<zest::io::tensor_record> recs{zest::io::record("wte", wte),
//                                             zest::io::record("adam.m.wte", m_wte)};
//   zest::io::checkpoint_info info;
//   info.step = 100;
//   info.metadata = config;                         // any JSON: config, ZeRO stage, rng...
//   zest::io::save_checkpoint("ckpt", mesh, recs, info);
//   ...                                                   // later, any mesh, any layouts:
//   zest::io::checkpoint_info info = zest::io::read_checkpoint_info("ckpt");  // no MPI
//   zest::io::load_checkpoint("ckpt", other_mesh, other_recs);
//
// A checkpoint is a folder:
//
//   manifest.json                                  written last, by rank 0: what is where
//   step-00000100.gen-3f9a0c2d5e4b1a07.rank-0000.bin   one shard file per rank that holds
//   step-00000100.gen-3f9a0c2d5e4b1a07.rank-0001.bin   data: its blocks back to back, raw
//                                                  elements in the host's byte order
//
// Every rank writes the block it holds of each tensor, except that of the ranks holding
// the same block (replicas along the axes where the layout is replicate) only coordinate
// 0 writes it. The manifest lists, per tensor, its dims, dtype, global extents and the
// layout it was saved with (for information), and its blocks as boxes in global index
// space: { file, offset in the file, box_offsets, box_extents, bytes, checksum (XXH64,
// zest/io/checksum.hpp) }, plus each shard file's size, and last "manifest_checksum": the
// XXH64 of the manifest's canonical text (compact json::dump of everything else), so that
// a changed digit anywhere (step, world_size, a scale in the metadata) is refused. Loading
// does not care about the saving mesh or layout: each rank reads the parts of the saved
// boxes that overlap its own block, whatever layout and mesh it loads with.
//
// Safety: every save is atomic, the same step again included, whatever fails on any rank
// at any point (a crash, an I/O error, a full disk): afterwards the folder holds the old
// checkpoint or the new one, never neither and never a mix.
// - Each save is a new generation: rank 0 draws a random 64-bit id that every rank puts in
//   its shard's name, so a save never writes a file that an earlier manifest names;
// - every file is written to a temporary name, flushed (fsync), renamed and its folder
//   flushed (zest/core/files.hpp). Rank 0 writes the manifest only after every rank has
//   reported its shard durable, and the manifest's rename is the one commit point: before
//   it the old manifest names the old files, which are intact; after it the new one names
//   the new files, which are on disk;
// - only after the commit, agreed by every rank, does rank 0 remove what the new manifest
//   does not name: the older generations, and the leftovers of saves that failed;
// - a failure on any rank is thrown on every rank (checkpoint_error with the failing
//   rank's message, or shape_error for a misuse), never a hang. A failure after the rename
//   (the folder's flush) throws although the new checkpoint is in place;
// - loading checks the manifest's own checksum, the manifest against the model (names,
//   dims, dtypes, extents), the size of every shard file it reads (truncation) and the
//   checksum of every block it reads (the whole block), into temporary buffers; the ranks
//   agree before any target tensor is written, so a failure anywhere leaves every target
//   as it was. load_checkpoint's `accept` lets the caller refuse the checkpoint from its
//   manifest (a metadata check), before any data is read;
// - save and load are collective over mesh.world(). Every rank takes part in every
//   collective whatever happened locally.
// One save at a time per folder: two jobs saving into the same folder at once are not
// supported (each would remove the other's files).
//
// The folder must be visible to every rank (a shared file system across nodes). Records
// are views: the tensors must outlive the call and keep their storage. A tensor of another
// backend (device memory) is staged: its record views a host copy made when the record is,
// and a load copies the block back into the tensor once every rank has read its part.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zest/backend/host/host_backend.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/json.hpp"
#include "zest/io/checksum.hpp"
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

struct checkpoint_info {
  std::int64_t step = 0;
  json::value metadata;  // free-form: config, ZeRO stage, precision, rng, loss scaler...
  std::string mesh;      // the saving mesh, "mesh<dp=4>" (set by save, read back by load)
  int world_size = 0;    // ranks of the saving mesh (set by save)
};

inline constexpr std::string_view manifest_file_name = "manifest.json";
inline constexpr std::string_view checkpoint_format_name = "zest checkpoint";
// Version 2: generations in shard names, the manifest's own checksum.
inline constexpr std::int64_t checkpoint_format_version = 2;

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

namespace detail {

inline std::size_t element_size(dtype t) {
  switch (t) {
    case dtype::f32: return sizeof(float);
    case dtype::f64: return sizeof(double);
    case dtype::bf16: return sizeof(bfloat16);
    case dtype::f16: return sizeof(float16);
    case dtype::i32: return sizeof(std::int32_t);
    case dtype::i64: return sizeof(std::int64_t);
    case dtype::u8: return sizeof(std::uint8_t);
    case dtype::u16: return sizeof(std::uint16_t);
  }
  return 0;
}

// "step-00000100.gen-3f9a0c2d5e4b1a07.rank-0001.bin": the step for people, the save's
// generation (a random id drawn by rank 0) so that no two saves share a file name.
inline std::string shard_file_name(std::int64_t step, std::uint64_t generation, int rank) {
  std::array<char, 96> buf{};
  std::snprintf(buf.data(), buf.size(), "step-%08lld.gen-%016llx.rank-%04d.bin",
                static_cast<long long>(step), static_cast<unsigned long long>(generation), rank);
  return buf.data();
}

// The names save_checkpoint gives shard files: "step-<digits>.gen-<hex>.rank-<digits>.bin",
// and "step-<digits>.rank-<digits>.bin" of format version 1 (removed as stale).
inline bool is_shard_file_name(std::string_view name) {
  auto run = [&](std::string_view prefix, std::string_view allowed) {
    if (name.substr(0, prefix.size()) != prefix) return false;
    name.remove_prefix(prefix.size());
    std::size_t n = 0;
    while (n < name.size() && allowed.find(name[n]) != std::string_view::npos) ++n;
    if (n == 0) return false;
    name.remove_prefix(n);
    return true;
  };
  constexpr std::string_view digits = "0123456789", hex = "0123456789abcdef";
  if (!run("step-", digits)) return false;
  if (name.substr(0, 5) == ".gen-" && !run(".gen-", hex)) return false;
  return run(".rank-", digits) && name == ".bin";
}

// A file name the manifest may use: no folders, nothing hidden, printable ASCII.
inline bool is_plain_file_name(std::string_view name) {
  if (name.empty() || name.front() == '.' || name.size() > 255) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return c > ' ' && c < 127 && c != '/' && c != '\\'; });
}

inline std::string join_extents(std::span<const std::size_t> e) {
  std::string s = "[";
  for (std::size_t k = 0; k < e.size(); ++k) {
    if (k) s += ", ";
    s += std::to_string(e[k]);
  }
  return s + "]";
}

inline std::size_t volume(std::span<const std::size_t> extents) {
  std::size_t n = 1;
  for (const std::size_t e : extents) n *= e;
  return n;
}

[[noreturn]] inline void throw_io(std::string_view op, std::string_view what,
                                  const std::filesystem::path& path, int err) {
  throw checkpoint_error(zest::detail::message("zest: ", op, ": ", what, " ", path, ": ",
                                               std::generic_category().message(err)));
}

// -----------------------------------------------------------------------------------------
// Agreement between ranks.

enum class failure : std::int64_t { none = 0, shape = 1, checkpoint = 2 };

struct outcome {
  failure kind = failure::none;
  std::string message;
};

// Runs f, turning an exception into an outcome (so that this rank still reaches the next
// collective). Messages that are not zest's get the operation's name in front.
template <class F>
outcome attempt(std::string_view op, F&& f) {
  auto wrap = [&](failure kind, std::string what) {
    if (what.rfind("zest:", 0) != 0) what = zest::detail::message("zest: ", op, ": ", what);
    return outcome{kind, std::move(what)};
  };
  try {
    std::forward<F>(f)();
    return {};
  } catch (const shape_error& e) {
    return wrap(failure::shape, e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    // zest/core/files.hpp's errors read "zest: <op>: ..." after the library's prefix.
    std::string what = e.what();
    if (const std::size_t at = what.find("zest: "); at != std::string::npos) what.erase(0, at);
    return wrap(failure::checkpoint, std::move(what));
  } catch (const std::exception& e) {
    return wrap(failure::checkpoint, e.what());
  } catch (...) {
    return wrap(failure::checkpoint, "unknown exception");
  }
}

// Collective: returns when every rank succeeded; otherwise throws, on every rank, the
// error of the lowest failing rank (its message, and which ranks failed).
template <class Comm>
void agree(Comm& comm, const outcome& mine) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::array<std::int64_t, 2> word{
      static_cast<std::int64_t>(mine.kind),
      static_cast<std::int64_t>(mine.kind == failure::none ? 0 : mine.message.size())};
  std::vector<std::int64_t> all(2 * n);
  comm.template all_gather<std::int64_t>(std::span<const std::int64_t>(word),
                                         std::span<std::int64_t>(all));
  std::vector<std::size_t> counts(n);
  std::size_t first = n, failed = 0, total = 0;
  for (std::size_t r = 0; r < n; ++r) {
    counts[r] = static_cast<std::size_t>(all[2 * r + 1]);
    total += counts[r];
    if (all[2 * r] != 0) {
      ++failed;
      if (first == n) first = r;
    }
  }
  if (failed == 0) return;
  std::vector<std::uint8_t> text(total);
  const std::string_view own = mine.kind == failure::none ? std::string_view() : mine.message;
  comm.template all_gather<std::uint8_t>(
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(own.data()), own.size()),
      std::span<std::uint8_t>(text), std::span<const std::size_t>(counts));
  std::size_t at = 0;
  for (std::size_t r = 0; r < first; ++r) at += counts[r];
  std::string what(reinterpret_cast<const char*>(text.data() + at), counts[first]);
  if (n > 1) {
    what += zest::detail::message(" [on rank ", first);
    if (failed > 1) {
      what +=
          zest::detail::message(" and ", failed - 1, failed == 2 ? " other rank" : " other ranks");
    }
    what += ']';
  }
  if (static_cast<failure>(all[2 * first]) == failure::shape) throw shape_error(what);
  throw checkpoint_error(what);
}

// A canonical text of the tensor list: one line per record.
inline std::string describe_records(std::span<const tensor_record> tensors) {
  std::string s;
  for (const auto& t : tensors) {
    s += zest::detail::message("\"", t.name, "\" ", t.dims, " ", name_of(t.type), " ",
                               join_extents(t.global_extents), "\n");
  }
  return s;
}

// Collective: throws shape_error on every rank unless all ranks pass the same list.
template <class Comm>
void agree_on_list(Comm& comm, std::string_view op, std::span<const tensor_record> tensors) {
  const std::string mine = describe_records(tensors);
  const auto n = static_cast<std::size_t>(comm.size());
  const std::array<std::int64_t, 2> word{
      std::bit_cast<std::int64_t>(xxh64(std::as_bytes(std::span(mine.data(), mine.size())))),
      static_cast<std::int64_t>(mine.size())};
  std::vector<std::int64_t> all(2 * n);
  comm.template all_gather<std::int64_t>(std::span<const std::int64_t>(word),
                                         std::span<std::int64_t>(all));
  std::size_t differs = n;
  for (std::size_t r = 1; r < n && differs == n; ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differs = r;
  }
  if (differs == n) return;
  // Everyone saw the mismatch: gather the lists to say what differs.
  std::vector<std::size_t> counts(n);
  std::size_t total = 0;
  for (std::size_t r = 0; r < n; ++r) total += counts[r] = static_cast<std::size_t>(all[2 * r + 1]);
  std::vector<std::uint8_t> text(total);
  comm.template all_gather<std::uint8_t>(
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(mine.data()),
                                    mine.size()),
      std::span<std::uint8_t>(text), std::span<const std::size_t>(counts));
  auto lines_of = [&](std::size_t r) {
    std::size_t at = 0;
    for (std::size_t q = 0; q < r; ++q) at += counts[q];
    std::vector<std::string> lines;
    std::string line;
    for (std::size_t i = 0; i < counts[r]; ++i) {
      const char c = static_cast<char>(text[at + i]);
      if (c == '\n') {
        lines.push_back(std::move(line));
        line.clear();
      } else {
        line += c;
      }
    }
    return lines;
  };
  const auto a = lines_of(0), b = lines_of(differs);
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const std::string left = i < a.size() ? a[i] : std::string("absent");
  const std::string right = i < b.size() ? b[i] : std::string("absent");
  throw shape_error(zest::detail::message(
      "zest: ", op, ": the ranks pass different tensor lists: rank 0 has ", a.size(),
      " tensors, rank ", differs, " has ", b.size(), "; tensor #", i, " is ", left,
      " on rank 0 and ", right, " on rank ", differs, "; every rank must pass the same list"));
}

// Checks the records themselves (not against other ranks).
inline void check_records(std::string_view op, std::span<const tensor_record> tensors,
                          bool loading) {
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    auto fail = [&](auto&&... parts) {
      throw shape_error(
          zest::detail::message("zest: ", op, ": tensor \"", t.name, "\": ", parts...));
    };
    if (t.name.empty()) fail("a tensor needs a name");
    if (!names.insert(t.name).second) fail("the name appears twice in the list");
    const std::size_t n = t.dims.size();
    if (t.global_extents.size() != n || t.local_offsets.size() != n ||
        t.local_extents.size() != n) {
      fail("dims \"", t.dims, "\" but ", t.global_extents.size(), " global extents, ",
           t.local_offsets.size(), " local offsets and ", t.local_extents.size(), " local extents");
    }
    for (std::size_t k = 0; k < n; ++k) {
      if (t.local_offsets[k] + t.local_extents[k] > t.global_extents[k]) {
        fail("the local block ", join_extents(t.local_offsets), " + ",
             join_extents(t.local_extents), " does not fit the extents ",
             join_extents(t.global_extents));
      }
    }
    const std::size_t want = volume(t.local_extents) * element_size(t.type);
    if (t.bytes.size() != want) {
      fail("the local block has ", t.bytes.size(), " bytes, its extents ",
           join_extents(t.local_extents), " of ", name_of(t.type), " need ", want);
    }
    if (loading && t.read_only) {
      fail("recorded from a const tensor; loading writes into it, so record a non-const one");
    }
  }
}

// -----------------------------------------------------------------------------------------
// Files.

// A file open for reading at offsets.
class input_file {
 public:
  input_file(std::filesystem::path path, std::string_view op) : path_(std::move(path)), op_(op) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw_io(op_, "cannot open", path_, errno);
  }
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;
  ~input_file() { ::close(fd_); }

  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_io(op_, "cannot stat", path_, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }
  // Exactly out.size() bytes from `offset`; throws if the file ends first.
  void read_at(std::uint64_t offset, std::span<std::byte> out) const {
    while (!out.empty()) {
      const ssize_t n = ::pread(fd_, out.data(), out.size(), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_io(op_, "cannot read", path_, errno);
      }
      if (n == 0) {
        throw checkpoint_error(zest::detail::message("zest: ", op_, ": ", path_, " ends at byte ",
                                                     offset, ", before the ", out.size(),
                                                     " bytes the manifest promises"));
      }
      offset += static_cast<std::uint64_t>(n);
      out = out.subspan(static_cast<std::size_t>(n));
    }
  }

 private:
  std::filesystem::path path_;
  std::string_view op_;
  int fd_ = -1;
};

// Bytes per read when loading; small values let tests cross block pieces everywhere.
inline std::size_t& read_chunk_bytes() {
  static std::size_t bytes = std::size_t{8} << 20U;
  return bytes;
}
// Bytes per write when saving: each piece is checksummed, then written while it is still
// in cache.
inline constexpr std::size_t write_chunk_bytes = std::size_t{4} << 20U;

// -----------------------------------------------------------------------------------------
// The manifest.

struct saved_block {
  std::string file;
  std::uint64_t offset = 0, bytes = 0, checksum = 0;
  std::vector<std::size_t> box_offsets, box_extents;
};

struct saved_tensor {
  std::string name, dims, dtype_name, layout;
  std::size_t element_bytes = 0;
  std::vector<std::size_t> extents;
  std::vector<saved_block> blocks;
};

struct manifest {
  checkpoint_info info;
  std::vector<saved_tensor> tensors;
  std::map<std::string, std::uint64_t, std::less<>> file_sizes;
};

inline std::string_view native_byte_order() {
  return std::endian::native == std::endian::little ? "little" : "big";
}

inline json::value extents_json(std::span<const std::size_t> e) {
  json::value v = json::array{};
  for (const std::size_t x : e) v.push_back(x);
  return v;
}

inline constexpr std::string_view manifest_checksum_key = "manifest_checksum";

// A manifest's own checksum: XXH64 of the compact json::dump of its members other than
// "manifest_checksum", in their order. Parsing and dumping again gives the same text (dump
// writes the shortest double that parses back), so the loader recomputes it from the values.
inline std::uint64_t manifest_checksum(const json::value& root) {
  json::object content;
  for (const auto& [key, v] : root.as_object()) {
    if (key != manifest_checksum_key) content.emplace_back(key, v);
  }
  const std::string text = json::dump(json::value(std::move(content)));
  return xxh64(std::as_bytes(std::span(text.data(), text.size())));
}

// Reads a manifest's JSON into a manifest, checking everything a loader relies on.
// `where` names the file in messages.
class manifest_reader {
 public:
  manifest_reader(std::string op, std::string where)
      : op_(std::move(op)), where_(std::move(where)) {}

  manifest read(std::string_view text) const {
    json::value root;
    try {
      root = json::parse(text);
    } catch (const json::error& e) {
      fail("", zest::detail::message("is not valid JSON (", e.what(),
                                     "); the file is truncated or corrupt"));
    }
    if (!root.is_object()) fail("", "is not a JSON object");
    manifest m;
    const std::string format = string_at(root, "format", "");
    if (format != checkpoint_format_name) {
      fail("format",
           zest::detail::message("is \"", format, "\", expected \"", checkpoint_format_name, "\""));
    }
    // The checksum first (a changed "version" is corruption, not a newer format), then the
    // version (a version-1 manifest has no checksum: say which version it is).
    const json::value* sealed = root.find(manifest_checksum_key);
    if (sealed != nullptr) {
      std::uint64_t want = 0;
      if (!sealed->is_string() || !parse_checksum(sealed->as_string(), want)) {
        fail(std::string(manifest_checksum_key), "is not \"xxh64:\" and 16 hex digits");
      }
      if (const std::uint64_t got = manifest_checksum(root); got != want) {
        fail(std::string(manifest_checksum_key),
             zest::detail::message("is ", format_checksum(want), ", the manifest's content gives ",
                                   format_checksum(got),
                                   ": the manifest was changed or is corrupt"));
      }
    }
    const std::int64_t version = int_at(root, "version", "");
    if (version != checkpoint_format_version) {
      fail("version", zest::detail::message("is ", version, "; this build reads version ",
                                            checkpoint_format_version));
    }
    if (sealed == nullptr) fail(std::string(manifest_checksum_key), "is missing");
    const std::string order = string_at(root, "byte_order", "");
    if (order != native_byte_order()) {
      fail("byte_order", zest::detail::message("is \"", order, "\", this host is ",
                                               native_byte_order(), "-endian"));
    }
    if (string_at(root, "checksum", "") != "xxh64") fail("checksum", "is not \"xxh64\"");
    m.info.step = int_at(root, "step", "");
    if (m.info.step < 0) fail("step", "is negative");
    m.info.mesh = string_at(root, "mesh", "");
    const std::int64_t world = int_at(root, "world_size", "");
    if (world < 1 || world > (std::int64_t{1} << 30)) fail("world_size", "is out of range");
    m.info.world_size = static_cast<int>(world);
    m.info.metadata = member(root, "metadata", "");

    const json::value& files = member(root, "files", "");
    if (!files.is_array()) fail("files", "is not an array");
    for (std::size_t i = 0; i < files.size(); ++i) {
      const std::string at = zest::detail::message("files[", i, "]");
      const std::string name = string_at(files[i], "file", at);
      if (!is_plain_file_name(name)) fail(at, "names a file outside the checkpoint's folder");
      const std::int64_t bytes = int_at(files[i], "bytes", at);
      if (bytes < 0) fail(at + ".bytes", "is negative");
      if (!m.file_sizes.emplace(name, static_cast<std::uint64_t>(bytes)).second) {
        fail(at, "lists a file twice");
      }
    }

    const json::value& tensors = member(root, "tensors", "");
    if (!tensors.is_array()) fail("tensors", "is not an array");
    std::set<std::string, std::less<>> names;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::string at = zest::detail::message("tensors[", i, "]");
      m.tensors.push_back(read_tensor(tensors[i], at, m));
      if (!names.insert(m.tensors.back().name).second) fail(at, "repeats a tensor name");
    }
    return m;
  }

 private:
  [[noreturn]] void fail(const std::string& at, const std::string& problem) const {
    throw checkpoint_error(zest::detail::message(
        "zest: ", op_, ": ", where_, ": ", at.empty() ? "" : at, at.empty() ? "" : " ", problem));
  }
  static std::string path_of(const std::string& at, std::string_view key) {
    return at.empty() ? std::string(key) : zest::detail::message(at, ".", key);
  }
  const json::value& member(const json::value& obj, std::string_view key,
                            const std::string& at) const {
    if (!obj.is_object()) fail(at, "is not a JSON object");
    const json::value* v = obj.find(key);
    if (v == nullptr) fail(path_of(at, key), "is missing");
    return *v;
  }
  std::string string_at(const json::value& obj, std::string_view key, const std::string& at) const {
    const json::value& v = member(obj, key, at);
    if (!v.is_string())
      fail(path_of(at, key), zest::detail::message("is ", v.type_name(), ", expected a string"));
    return v.as_string();
  }
  std::int64_t int_at(const json::value& obj, std::string_view key, const std::string& at) const {
    return as_integer(member(obj, key, at), path_of(at, key));
  }
  std::int64_t as_integer(const json::value& v, const std::string& at) const {
    if (!v.is_integer())
      fail(at, zest::detail::message("is ", v.type_name(), ", expected an integer"));
    return v.as_int();
  }
  std::vector<std::size_t> sizes_at(const json::value& obj, std::string_view key,
                                    const std::string& at, std::size_t count) const {
    const json::value& v = member(obj, key, at);
    const std::string here = path_of(at, key);
    if (!v.is_array()) fail(here, "is not an array");
    if (v.size() != count) {
      fail(here, zest::detail::message("has ", v.size(), " entries, the dims need ", count));
    }
    std::vector<std::size_t> out;
    for (std::size_t k = 0; k < v.size(); ++k) {
      const std::int64_t x = as_integer(v[k], zest::detail::message(here, "[", k, "]"));
      if (x < 0) fail(zest::detail::message(here, "[", k, "]"), "is negative");
      out.push_back(static_cast<std::size_t>(x));
    }
    return out;
  }

  saved_tensor read_tensor(const json::value& t, const std::string& at, const manifest& m) const {
    saved_tensor s;
    s.name = string_at(t, "name", at);
    const std::string here = zest::detail::message(at, " (\"", s.name, "\")");
    s.dims = string_at(t, "dims", here);
    s.dtype_name = string_at(t, "dtype", here);
    const std::int64_t eb = int_at(t, "element_bytes", here);
    if (eb < 1 || eb > 16) fail(here + ".element_bytes", "is out of range");
    s.element_bytes = static_cast<std::size_t>(eb);
    s.extents = sizes_at(t, "extents", here, s.dims.size());
    s.layout = string_at(t, "layout", here);
    const json::value& blocks = member(t, "blocks", here);
    if (!blocks.is_array()) fail(here + ".blocks", "is not an array");
    // Guard the products below against overflow: a sane tensor has fewer than 2^62 bytes.
    long double total = static_cast<long double>(s.element_bytes);
    for (const std::size_t e : s.extents) total *= static_cast<long double>(e);
    if (total > 4.0e18L) fail(here + ".extents", "describe an impossibly large tensor");
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      const std::string bat = zest::detail::message(here, ".blocks[", b, "]");
      const json::value& j = blocks[b];
      saved_block k;
      k.file = string_at(j, "file", bat);
      const auto file = m.file_sizes.find(k.file);
      if (file == m.file_sizes.end())
        fail(bat, zest::detail::message("names \"", k.file, "\", which \"files\" does not list"));
      const std::int64_t offset = int_at(j, "offset", bat), bytes = int_at(j, "bytes", bat);
      if (offset < 0 || bytes < 0) fail(bat, "has a negative offset or size");
      k.offset = static_cast<std::uint64_t>(offset);
      k.bytes = static_cast<std::uint64_t>(bytes);
      if (k.offset > file->second || k.bytes > file->second - k.offset) {
        fail(bat, zest::detail::message("ends at byte ", k.offset + k.bytes, " of \"", k.file,
                                        "\", which has ", file->second));
      }
      k.box_offsets = sizes_at(j, "box_offsets", bat, s.dims.size());
      k.box_extents = sizes_at(j, "box_extents", bat, s.dims.size());
      for (std::size_t d = 0; d < s.dims.size(); ++d) {
        if (k.box_offsets[d] > s.extents[d] || k.box_extents[d] > s.extents[d] - k.box_offsets[d]) {
          fail(bat, zest::detail::message("the box ", join_extents(k.box_offsets), " + ",
                                          join_extents(k.box_extents), " does not fit the extents ",
                                          join_extents(s.extents)));
        }
      }
      if (k.bytes != volume(k.box_extents) * s.element_bytes) {
        fail(bat, zest::detail::message("has ", k.bytes, " bytes, its box needs ",
                                        volume(k.box_extents) * s.element_bytes));
      }
      if (!parse_checksum(string_at(j, "checksum", bat), k.checksum)) {
        fail(bat + ".checksum", "is not \"xxh64:\" and 16 hex digits");
      }
      s.blocks.push_back(std::move(k));
    }
    return s;
  }

  std::string op_, where_;
};

inline std::string read_manifest_text(std::string_view op, const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / manifest_file_name;
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    throw checkpoint_error(
        zest::detail::message("zest: ", op, ": no checkpoint in ", dir, ": ", manifest_file_name,
                              " is missing (a save that did not finish writes none)"));
  }
  try {
    return read_text_file(file);
  } catch (const std::exception& e) {
    throw checkpoint_error(zest::detail::message("zest: ", op, ": ", e.what()));
  }
}

// -----------------------------------------------------------------------------------------
// Boxes: a block's place in global index space.

struct box {
  std::span<const std::size_t> offsets, extents;
};

// The intersection of a and b; false when it is empty.
inline bool intersect(const box& a, const box& b, std::vector<std::size_t>& off,
                      std::vector<std::size_t>& ext) {
  const std::size_t n = a.offsets.size();
  off.resize(n);
  ext.resize(n);
  bool any = true;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t lo = std::max(a.offsets[k], b.offsets[k]);
    const std::size_t hi = std::min(a.offsets[k] + a.extents[k], b.offsets[k] + b.extents[k]);
    off[k] = lo;
    ext[k] = hi > lo ? hi - lo : 0;
    if (ext[k] == 0) any = false;
  }
  return any;
}

// The contiguous runs of an intersection box, in increasing order of their place in the
// source box (both boxes row-major): src(), dst() are byte offsets into the source and
// destination blocks, bytes() the run's length. Trailing dims that all three boxes cover
// whole are merged into one run.
class run_walker {
 public:
  run_walker(const box& src, const box& dst, std::span<const std::size_t> off,
             std::span<const std::size_t> ext, std::size_t element_bytes) {
    const std::size_t n = off.size();
    run_bytes_ = element_bytes;
    if (n == 0) return;
    std::size_t j = n - 1;
    std::size_t run = ext[j];
    while (j > 0 && ext[j] == src.extents[j] && ext[j] == dst.extents[j]) {
      --j;
      run *= ext[j];
    }
    run_bytes_ = run * element_bytes;
    outer_ = j;
    src_stride_.resize(n);
    dst_stride_.resize(n);
    std::size_t ss = element_bytes, ds = element_bytes;
    for (std::size_t k = n; k-- > 0;) {
      src_stride_[k] = ss;
      dst_stride_[k] = ds;
      ss *= src.extents[k];
      ds *= dst.extents[k];
      src_ += (off[k] - src.offsets[k]) * src_stride_[k];
      dst_ += (off[k] - dst.offsets[k]) * dst_stride_[k];
    }
    ext_.assign(ext.begin(), ext.begin() + static_cast<std::ptrdiff_t>(j));
    index_.assign(j, 0);
  }

  std::size_t src() const { return src_; }
  std::size_t dst() const { return dst_; }
  std::size_t bytes() const { return run_bytes_; }

  // Moves to the next run; false after the last.
  bool advance() {
    for (std::size_t k = outer_; k-- > 0;) {
      src_ += src_stride_[k];
      dst_ += dst_stride_[k];
      if (++index_[k] < ext_[k]) return true;
      src_ -= ext_[k] * src_stride_[k];
      dst_ -= ext_[k] * dst_stride_[k];
      index_[k] = 0;
    }
    return false;
  }

 private:
  std::size_t outer_ = 0;
  std::size_t run_bytes_ = 0, src_ = 0, dst_ = 0;
  std::vector<std::size_t> src_stride_, dst_stride_, ext_, index_;
};

// One saved block to read for one target, and the piece of it the target takes.
struct read_task {
  std::size_t target = 0;
  const saved_tensor* tensor = nullptr;
  const saved_block* block = nullptr;
  std::vector<std::size_t> off, ext;  // the intersection, global indices
};

// Reads and verifies one block, copying its intersection with the target's box into
// `staging` (the target's block).
inline void read_block(const input_file& in, const read_task& task, const tensor_record& target,
                       std::span<std::byte> staging, std::vector<std::byte>& chunk,
                       std::string_view op, const std::filesystem::path& file) {
  const saved_block& b = *task.block;
  run_walker runs(box{b.box_offsets, b.box_extents},
                  box{target.local_offsets, target.local_extents}, task.off, task.ext,
                  task.tensor->element_bytes);
  bool more = true;
  xxh64_state hash;
  for (std::uint64_t pos = 0; pos < b.bytes;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), b.bytes - pos));
    const std::span<std::byte> piece(chunk.data(), n);
    in.read_at(b.offset + pos, piece);
    hash.update(piece);
    const std::uint64_t end = pos + n;
    while (more) {
      const std::uint64_t s = runs.src(), e = s + runs.bytes();
      if (s >= end) break;
      const std::uint64_t lo = std::max<std::uint64_t>(s, pos), hi = std::min(e, end);
      if (lo < hi) {
        std::memcpy(staging.data() + runs.dst() + (lo - s), chunk.data() + (lo - pos), hi - lo);
      }
      if (e > end) break;
      more = runs.advance();
    }
    pos = end;
  }
  const std::uint64_t got = hash.digest();
  if (got != b.checksum) {
    throw checkpoint_error(zest::detail::message(
        "zest: ", op, ": checksum mismatch in ", file, " (bytes ", b.offset, " to ",
        b.offset + b.bytes, ", the block ", join_extents(b.box_offsets), " + ",
        join_extents(b.box_extents), " of tensor \"", task.tensor->name, "\"): the manifest says ",
        format_checksum(b.checksum), ", the data gives ", format_checksum(got),
        "; the file is corrupt"));
  }
}

// Which saved tensor each target is; throws "does not match" naming every difference.
inline std::vector<const saved_tensor*> match_targets(std::string_view op,
                                                      const std::filesystem::path& dir,
                                                      const manifest& m,
                                                      std::span<const tensor_record> targets) {
  std::unordered_map<std::string_view, const saved_tensor*> saved;
  for (const auto& s : m.tensors) saved.emplace(s.name, &s);
  std::vector<std::string> problems;
  std::vector<const saved_tensor*> out;
  std::set<std::string_view> wanted;
  for (const auto& t : targets) {
    wanted.insert(t.name);
    const auto it = saved.find(t.name);
    if (it == saved.end()) {
      problems.push_back(zest::detail::message("tensor \"", t.name,
                                               "\" is in the model but not in the checkpoint"));
      out.push_back(nullptr);
      continue;
    }
    const saved_tensor& s = *it->second;
    out.push_back(&s);
    if (s.dims != t.dims) {
      problems.push_back(zest::detail::message("tensor \"", t.name, "\": dims \"", s.dims,
                                               "\" in the checkpoint, \"", t.dims,
                                               "\" in the model"));
    }
    if (s.dtype_name != name_of(t.type) || s.element_bytes != element_size(t.type)) {
      problems.push_back(zest::detail::message("tensor \"", t.name, "\": dtype ", s.dtype_name,
                                               " in the checkpoint, ", name_of(t.type),
                                               " in the model"));
    }
    if (s.extents != t.global_extents) {
      problems.push_back(zest::detail::message("tensor \"", t.name, "\": extents ",
                                               join_extents(s.extents), " in the checkpoint, ",
                                               join_extents(t.global_extents), " in the model"));
    }
  }
  for (const auto& s : m.tensors) {
    if (!wanted.contains(s.name)) {
      problems.push_back(zest::detail::message("tensor \"", s.name,
                                               "\" is in the checkpoint but not in the model"));
    }
  }
  if (!problems.empty()) {
    std::string list;
    constexpr std::size_t shown = 8;
    for (std::size_t i = 0; i < problems.size() && i < shown; ++i) {
      list += (i ? "; " : "") + problems[i];
    }
    if (problems.size() > shown) {
      list += zest::detail::message("; and ", problems.size() - shown, " more");
    }
    throw checkpoint_error(zest::detail::message(
        "zest: ", op, ": ", dir, ": the checkpoint does not match the model: ", list));
  }
  return out;
}

inline bool overlap(const read_task& a, const read_task& b) {
  for (std::size_t k = 0; k < a.off.size(); ++k) {
    if (a.off[k] >= b.off[k] + b.ext[k] || b.off[k] >= a.off[k] + a.ext[k]) return false;
  }
  return true;
}

// The saved blocks each target needs, after checking that they cover its box exactly once.
inline std::vector<read_task> plan_reads(std::string_view op,
                                         std::span<const tensor_record> targets,
                                         const std::vector<const saved_tensor*>& sources) {
  std::vector<read_task> tasks;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const tensor_record& t = targets[i];
    const box want{t.local_offsets, t.local_extents};
    const std::size_t need = volume(t.local_extents);
    if (need == 0) continue;
    const std::size_t first = tasks.size();
    std::size_t covered = 0;
    for (const auto& b : sources[i]->blocks) {
      read_task task{i, sources[i], &b, {}, {}};
      if (!intersect(box{b.box_offsets, b.box_extents}, want, task.off, task.ext)) continue;
      covered += volume(task.ext);
      tasks.push_back(std::move(task));
    }
    // Saved blocks never overlap; a manifest whose blocks do is corrupt (and could hide a
    // gap from the count below).
    for (std::size_t a = first; a < tasks.size(); ++a) {
      for (std::size_t b = a + 1; b < tasks.size(); ++b) {
        if (overlap(tasks[a], tasks[b])) {
          throw checkpoint_error(zest::detail::message(
              "zest: ", op, ": tensor \"", t.name, "\": the saved blocks at ",
              join_extents(tasks[a].block->box_offsets), " and ",
              join_extents(tasks[b].block->box_offsets), " overlap; the manifest is corrupt"));
        }
      }
    }
    if (covered != need) {
      throw checkpoint_error(zest::detail::message(
          "zest: ", op, ": tensor \"", t.name, "\": the checkpoint holds ", covered, " of the ",
          need, " elements of this rank's block ", join_extents(t.local_offsets), " + ",
          join_extents(t.local_extents), "; data is missing"));
    }
  }
  return tasks;
}

// A random id for a save, drawn by rank 0: the generation in its shard names. 64 random
// bits (the device's entropy, the clock and the process id, mixed): two saves into one
// folder never share one in practice.
inline std::uint64_t new_generation() {
  std::uint64_t x =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  x ^= static_cast<std::uint64_t>(::getpid()) << 32U;
  try {
    std::random_device device;
    x ^= (static_cast<std::uint64_t>(device()) << 32U) ^ device();
  } catch (const std::exception&) {
    // No entropy device: the clock and the process id alone.
  }
  auto mix = [](std::uint64_t z) {  // splitmix64's finalizer
    z = (z ^ (z >> 30U)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27U)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31U);
  };
  return mix(x + 0x9e3779b97f4a7c15ULL);
}

inline std::string generation_text(std::uint64_t generation) {
  std::array<char, 24> buf{};
  std::snprintf(buf.data(), buf.size(), "%016llx", static_cast<unsigned long long>(generation));
  return buf.data();
}

// After a commit: removes the shard files `named` does not hold (older generations,
// leftovers of failed saves) and the temporary files of shards and manifests. Best effort:
// what cannot be removed is garbage, never part of the checkpoint.
inline void remove_stale_files(const std::filesystem::path& dir,
                               const std::set<std::string>& named) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::size_t temp_at = name.find(".tmp.");
    const bool stale_shard = is_shard_file_name(name) && !named.contains(name);
    const bool stale_temp = name.size() > 1 && name.front() == '.' &&
                            temp_at != std::string::npos &&
                            (is_shard_file_name(name.substr(1, temp_at - 1)) ||
                             name.substr(1, temp_at - 1) == manifest_file_name);
    if (stale_shard || stale_temp) stale.push_back(it->path());
  }
  for (const auto& p : stale) (void)zest::detail::remove_file(p);
}

}  // namespace detail

// Collective over mesh.world(): saves the tensors as the checkpoint of `info.step` in `dir`
// (created if missing), atomically (see the top of this header). info.mesh and
// info.world_size are ignored: they come from `mesh`. Throws shape_error for bad records (a
// repeated name, ranks passing different lists) and checkpoint_error for I/O failures, on
// every rank.
template <class Mesh>
void save_checkpoint(const std::filesystem::path& dir, const Mesh& mesh,
                     std::span<const tensor_record> tensors, const checkpoint_info& info) {
  namespace d = detail;
  constexpr std::string_view op = "save_checkpoint";
  auto& world = mesh.world();
  const int rank = world.rank();
  const auto n = static_cast<std::size_t>(world.size());

  // 1. The records are sound and the same on every rank; rank 0 makes the folder and draws
  // this save's generation, which every rank gets.
  std::array<std::int64_t, 1> generation_word{0};
  d::agree(world, d::attempt(op, [&] {
             if (info.step < 0) {
               throw shape_error(
                   zest::detail::message("zest: ", op, ": step ", info.step, " is negative"));
             }
             d::check_records(op, tensors, false);
             if (rank == 0) {
               if (const int err = zest::detail::create_folders(dir)) {
                 d::throw_io(op, "cannot create the folder", dir, err);
               }
               generation_word[0] = std::bit_cast<std::int64_t>(d::new_generation());
             }
           }));
  d::agree_on_list(world, op, tensors);
  world.template broadcast<std::int64_t>(std::span<std::int64_t>(generation_word), 0);
  const auto generation = std::bit_cast<std::uint64_t>(generation_word[0]);

  // 2. This rank's shard file, a name no manifest uses: its blocks back to back, each
  // checksummed as it is written, durable before this rank reports success.
  struct written {
    std::size_t tensor;
    std::uint64_t offset, bytes, checksum;
  };
  std::vector<written> blocks;
  const std::filesystem::path shard = dir / d::shard_file_name(info.step, generation, rank);
  bool shard_in_place = false;
  const d::outcome wrote = d::attempt(op, [&] {
    std::uint64_t offset = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i].writes || tensors[i].bytes.empty()) continue;
      blocks.push_back({i, offset, tensors[i].bytes.size(), 0});
      offset += tensors[i].bytes.size();
    }
    if (blocks.empty()) return;
    atomic_file_writer out(shard, op);
    for (auto& b : blocks) {
      const std::span<const std::byte> data = tensors[b.tensor].bytes;
      xxh64_state hash;
      for (std::size_t at = 0; at < data.size(); at += d::write_chunk_bytes) {
        const auto piece = data.subspan(at, std::min(d::write_chunk_bytes, data.size() - at));
        hash.update(piece);
        out.write(piece);
      }
      b.checksum = hash.digest();
    }
    try {
      out.commit();
    } catch (...) {
      shard_in_place = out.renamed();
      throw;
    }
    shard_in_place = true;
  });
  try {
    d::agree(world, wrote);
  } catch (...) {
    // No manifest names this generation: its shards are garbage already (best effort; a
    // later save removes what is left).
    if (shard_in_place) (void)zest::detail::remove_file(shard);
    throw;
  }

  // 3. Everyone's block list to everyone (rank 0 writes the manifest): per block the
  // tensor's index, file offset, bytes, checksum, then box offsets and extents.
  std::vector<std::int64_t> words;
  for (const auto& b : blocks) {
    const tensor_record& t = tensors[b.tensor];
    words.push_back(static_cast<std::int64_t>(b.tensor));
    words.push_back(static_cast<std::int64_t>(b.offset));
    words.push_back(static_cast<std::int64_t>(b.bytes));
    words.push_back(std::bit_cast<std::int64_t>(b.checksum));
    for (const std::size_t x : t.local_offsets) words.push_back(static_cast<std::int64_t>(x));
    for (const std::size_t x : t.local_extents) words.push_back(static_cast<std::int64_t>(x));
  }
  const std::array<std::int64_t, 1> mine{static_cast<std::int64_t>(words.size())};
  std::vector<std::int64_t> sizes(n);
  world.template all_gather<std::int64_t>(std::span<const std::int64_t>(mine),
                                          std::span<std::int64_t>(sizes));
  std::vector<std::size_t> counts(n);
  std::size_t total = 0;
  for (std::size_t r = 0; r < n; ++r) total += counts[r] = static_cast<std::size_t>(sizes[r]);
  std::vector<std::int64_t> all(total);
  world.template all_gather<std::int64_t>(std::span<const std::int64_t>(words),
                                          std::span<std::int64_t>(all),
                                          std::span<const std::size_t>(counts));

  // 4. Every shard is durable: rank 0 commits, by renaming the new manifest over the old.
  std::set<std::string> named;
  d::agree(world, d::attempt(op, [&] {
             if (rank != 0) return;
             json::value m;
             m["format"] = checkpoint_format_name;
             m["version"] = checkpoint_format_version;
             m["step"] = info.step;
             m["generation"] = d::generation_text(generation);
             m["mesh"] = mesh.describe();
             m["world_size"] = static_cast<std::int64_t>(n);
             m["byte_order"] = d::native_byte_order();
             m["checksum"] = "xxh64";
             m["metadata"] = info.metadata;
             std::vector<json::value> per_tensor(tensors.size());
             for (std::size_t i = 0; i < tensors.size(); ++i) {
               const tensor_record& t = tensors[i];
               json::value& v = per_tensor[i];
               v["name"] = t.name;
               v["dims"] = t.dims;
               v["dtype"] = name_of(t.type);
               v["element_bytes"] = d::element_size(t.type);
               v["extents"] = d::extents_json(t.global_extents);
               v["layout"] = t.layout;
               v["blocks"] = json::array{};
             }
             json::value files = json::array{};
             std::size_t at = 0;
             for (std::size_t r = 0; r < n; ++r) {
               const std::size_t end = at + counts[r];
               const std::string name =
                   d::shard_file_name(info.step, generation, static_cast<int>(r));
               std::int64_t file_bytes = 0;
               while (at < end) {
                 const auto i = static_cast<std::size_t>(all[at]);
                 const std::size_t rank_of = tensors[i].dims.size();
                 json::value b;
                 b["file"] = name;
                 b["offset"] = all[at + 1];
                 b["bytes"] = all[at + 2];
                 b["checksum"] = format_checksum(std::bit_cast<std::uint64_t>(all[at + 3]));
                 json::value off = json::array{}, ext = json::array{};
                 for (std::size_t k = 0; k < rank_of; ++k) {
                   off.push_back(all[at + 4 + k]);
                   ext.push_back(all[at + 4 + rank_of + k]);
                 }
                 b["box_offsets"] = std::move(off);
                 b["box_extents"] = std::move(ext);
                 per_tensor[i]["blocks"].push_back(std::move(b));
                 file_bytes = std::max(file_bytes, all[at + 1] + all[at + 2]);
                 at += 4 + 2 * rank_of;
               }
               if (counts[r] == 0) continue;
               json::value f;
               f["file"] = name;
               f["bytes"] = file_bytes;
               files.push_back(std::move(f));
               named.insert(name);
             }
             m["files"] = std::move(files);
             m["tensors"] = json::value(std::move(per_tensor));
             m[std::string(d::manifest_checksum_key)] = format_checksum(d::manifest_checksum(m));
             atomic_file_writer out(dir / manifest_file_name, op);
             out.write(json::dump(m, 1) + "\n");
             out.commit();
           }));

  // 5. Committed on every rank's word: what the new manifest does not name goes.
  if (rank == 0) d::remove_stale_files(dir, named);
}

// The step, metadata and saving mesh of the checkpoint in `dir` (reads the manifest only;
// not collective). Throws checkpoint_error when there is none or it is unreadable.
inline checkpoint_info read_checkpoint_info(const std::filesystem::path& dir) {
  constexpr std::string_view op = "read_checkpoint_info";
  const std::string text = detail::read_manifest_text(op, dir);
  return detail::manifest_reader(std::string(op), (dir / manifest_file_name).string())
      .read(text)
      .info;
}

// Collective over mesh.world(): fills the targets from the checkpoint in `dir`, whatever
// mesh and layouts it was saved with. The checkpoint must hold exactly the targets' names,
// with the same dims, dtypes and global extents. `accept`, when given, sees the manifest's
// step, metadata and mesh on every rank before any data is read, and refuses the checkpoint
// by throwing (checkpoint_error, or shape_error). On any failure, on any rank, every rank
// throws (checkpoint_error; shape_error for bad records) and no target is modified.
// Returns the checkpoint's step, metadata and saving mesh.
template <class Mesh>
checkpoint_info load_checkpoint(const std::filesystem::path& dir, const Mesh& mesh,
                                std::span<const tensor_record> tensors,
                                const std::function<void(const checkpoint_info&)>& accept = {}) {
  namespace d = detail;
  constexpr std::string_view op = "load_checkpoint";
  auto& world = mesh.world();
  const int rank = world.rank();

  // 1. The records are sound and the same on every rank; rank 0 reads the manifest.
  std::string text;
  d::agree(world, d::attempt(op, [&] {
             d::check_records(op, tensors, true);
             if (rank == 0) text = d::read_manifest_text(op, dir);
           }));
  d::agree_on_list(world, op, tensors);

  // 2. Every rank parses the same text (broadcast from rank 0) and matches the targets.
  std::array<std::int64_t, 1> length{static_cast<std::int64_t>(text.size())};
  world.template broadcast<std::int64_t>(std::span<std::int64_t>(length), 0);
  text.resize(static_cast<std::size_t>(length[0]));
  world.template broadcast<std::uint8_t>(
      std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(text.data()), text.size()), 0);
  d::manifest m;
  std::vector<const d::saved_tensor*> sources;
  std::vector<d::read_task> tasks;
  d::agree(
      world, d::attempt(op, [&] {
        m = d::manifest_reader(std::string(op), (dir / manifest_file_name).string()).read(text);
        sources = d::match_targets(op, dir, m, tensors);
        tasks = d::plan_reads(op, tensors, sources);
        if (accept) accept(m.info);
      }));

  // 3. Read, verify and stage this rank's parts, file by file in file order.
  std::vector<std::unique_ptr<std::byte[]>> staging(tensors.size());
  d::agree(
      world, d::attempt(op, [&] {
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          staging[i] = std::make_unique_for_overwrite<std::byte[]>(tensors[i].bytes.size());
        }
        std::sort(tasks.begin(), tasks.end(), [](const d::read_task& a, const d::read_task& b) {
          return std::tie(a.block->file, a.block->offset) <
                 std::tie(b.block->file, b.block->offset);
        });
        std::vector<std::byte> chunk(std::max<std::size_t>(d::read_chunk_bytes(), 1));
        for (std::size_t i = 0; i < tasks.size();) {
          const std::string& name = tasks[i].block->file;
          const std::filesystem::path path = dir / name;
          const d::input_file in(path, op);
          const std::uint64_t expected = m.file_sizes.at(name);
          if (const std::uint64_t size = in.size(); size != expected) {
            throw checkpoint_error(zest::detail::message(
                "zest: ", op, ": ", path, " has ", size, " bytes, the manifest says ", expected,
                size < expected ? " (the file is truncated)" : " (the file was changed)"));
          }
          for (; i < tasks.size() && tasks[i].block->file == name; ++i) {
            const std::size_t t = tasks[i].target;
            d::read_block(in, tasks[i], tensors[t],
                          std::span<std::byte>(staging[t].get(), tensors[t].bytes.size()), chunk,
                          op, path);
          }
        }
      }));

  // 4. Every rank succeeded: only now do the targets change.
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].bytes.empty()) {
      std::memcpy(tensors[i].bytes.data(), staging[i].get(), tensors[i].bytes.size());
    }
    if (tensors[i].write_back) tensors[i].write_back();
  }
  return m.info;
}

}  // namespace zest::io
