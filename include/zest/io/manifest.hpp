// zest/io/manifest.hpp — a checkpoint's manifest: what it says about the
// checkpoint (checkpoint_info) and about every tensor (its blocks and where they are), and
// the reader that checks all of it before a loader relies on any of it (the format is
// described at the top of zest/io/checkpoint.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/json.hpp"
#include "zest/io/checksum.hpp"
#include "zest/io/detail/checkpoint_files.hpp"

namespace zest::io {

struct checkpoint_info {
  std::int64_t step = 0;
  json::value metadata;  // free-form: config, ZeRO stage, precision, rng, loss scaler...
  std::string mesh;      // the saving mesh, "mesh<dp=4>" (set by save, read back by load)
  int world_size = 0;    // ranks of the saving mesh (set by save)
};

inline constexpr std::string_view checkpoint_format_name = "zest checkpoint";
// Version 2: generations in shard names, the manifest's own checksum.
inline constexpr std::int64_t checkpoint_format_version = 2;

namespace detail {

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

}  // namespace detail

}  // namespace zest::io
