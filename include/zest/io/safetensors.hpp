// zest/io/safetensors.hpp — weights in and out of zest: the safetensors format, written from
// sharded tensors and read into any layout.
//
//   zest::io::weight_map map = ...;      // the file's tensors, and where each parameter lies
//   zest::io::save_safetensors("model.safetensors", mesh, records, map);   // collective
//   zest::io::load_safetensors("model.safetensors", mesh, records, map);   // any mesh, layout
//
// (zest/train/weights.hpp applies these to a model's parameters; zest::gpt and the Llama
// example give maps with Hugging Face's names.)
//
// The format, as the safetensors project specifies it: 8 bytes, the header's length N as a
// little-endian unsigned 64-bit integer; N bytes of JSON, an object with one member per
// tensor, {"dtype": "F32", "shape": [768, 2304], "data_offsets": [begin, end]}, and an
// optional "__metadata__" object of strings; then the tensors' raw little-endian data, each
// at [begin, end) counted from the end of the header, back to back without gaps. The header
// is padded with spaces to a multiple of 8 bytes so that the data starts aligned. zest writes
// and reads it itself: the format is that small, its JSON is zest/core/json.hpp's (strict:
// a duplicate name is refused), and a C++ reader would be one more dependency for 300 lines.
// A file's tensors are read as strictly as the format's reference reader does (offsets in
// bounds, matching their dtype and shape, covering the data exactly once), so a file zest
// writes is one that reader accepts.
//
// A weight_map says how a model's parameters lie in a file's tensors: each file tensor is made
// of parts, each part one parameter whose element at global index (i_0, ..., i_k) sits at
// the file tensor's row-major position offset + sum_j i_j strides_j. That covers the usual
// conventions: a transpose (PyTorch's nn.Linear keeps [out, in]), several parameters in one
// tensor (GPT-2's c_attn holds q, k and v side by side), dims merged (heads x head dim ->
// one dim). An `alternative` part is read only when the file has no primary tensor for its
// parameter (an output head tied to the embedding in the file, untied in the model), and is
// never written.
//
// Saving gathers each parameter's blocks to rank 0 (one all-to-all of the blocks that
// checkpoints would write, replicas skipped), which places them in the file tensor and writes
// the file, atomically (zest/core/files.hpp: a temporary file, flushed, renamed). Memory on
// rank 0: one file tensor and one parameter at a time. Loading: every rank reads the header
// broadcast from rank 0 and then, from the file itself (visible to every rank, as a
// checkpoint's folder must be), the contiguous stretch of each tensor between its own
// block's first and last element (most of the tensor for a block split on a transposed dim),
// converting the file's floats (F32, F64, BF16, F16) to the parameter's element type. The
// ranks agree before any parameter changes: a missing tensor, a shape that differs, a
// truncated file or an unreadable header leaves every parameter as it was, on every rank,
// with the same error (checkpoint_error for the file, shape_error for a map or model that
// does not fit). A file tensor that no part reads is refused, naming it, unless the map
// names it as ignorable (a causal-mask buffer that older GPT-2 files carry) or
// load_options::allow_unused says so.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/bfloat16.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/float16.hpp"
#include "zest/core/json.hpp"
#include "zest/core/source_site.hpp"
#include "zest/io/checksum.hpp"
#include "zest/io/detail/checkpoint_files.hpp"
#include "zest/io/detail/rank_agreement.hpp"
#include "zest/io/tensor_record.hpp"

namespace zest::io {

// -----------------------------------------------------------------------------------------
// Weight maps.

// One parameter inside a file tensor: its element at global index i sits at the file
// tensor's row-major position offset + sum_j i_j * strides[j] (one stride per parameter dim).
struct weight_part {
  std::string parameter;
  std::size_t offset = 0;
  std::vector<std::size_t> strides;
  // Read only when the file has no primary tensor holding `parameter`; never written.
  bool alternative = false;
};

// One tensor of the file, and the parameters it is made of.
struct weight_tensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<weight_part> parts;
};

struct weight_map {
  // For messages: "Hugging Face GPT-2", "zest's own names".
  std::string convention;
  std::vector<weight_tensor> tensors;
  // A file saved from the base model rather than the language model (Hugging Face's
  // GPT2Model, LlamaModel) names its tensors without this prefix; loading accepts both.
  std::string optional_prefix;
  // File tensors a model does not read (buffers older files carry): ignored on load.
  std::vector<std::string> ignored_suffixes;
  // The model's hyperparameters in the convention's own words (Hugging Face's config.json):
  // saved as the file's metadata "config".
  json::value config;
};

// The row-major strides of `shape`: a parameter that is the file tensor itself has these.
inline std::vector<std::size_t> row_major_strides(std::span<const std::size_t> shape) {
  std::vector<std::size_t> s(shape.size(), 1);
  for (std::size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

// A file tensor that is one parameter, element for element.
inline weight_tensor whole_tensor(std::string file_name, std::string parameter,
                                  std::vector<std::size_t> shape) {
  weight_tensor t{std::move(file_name), std::move(shape), {}};
  t.parts.push_back({std::move(parameter), 0, row_major_strides(t.shape), false});
  return t;
}

// A file tensor [b, a] holding a parameter [a, b] transposed (PyTorch's nn.Linear weight of
// a zest "in, out" matrix).
inline weight_tensor transposed_tensor(std::string file_name, std::string parameter, std::size_t a,
                                       std::size_t b) {
  weight_tensor t{std::move(file_name), {b, a}, {}};
  t.parts.push_back({std::move(parameter), 0, {1, a}, false});
  return t;
}

struct load_options {
  // Load a file holding tensors that no part of the map reads (they are listed and skipped).
  bool allow_unused = false;
};

// -----------------------------------------------------------------------------------------
// The format.

struct safetensors_entry {
  std::string name;
  std::string dtype;  // the format's name: "F32", "BF16", ...
  std::vector<std::size_t> shape;
  std::uint64_t begin = 0, end = 0;  // from the start of the data
};

struct safetensors_header {
  std::vector<safetensors_entry> tensors;  // in the header's order
  json::value metadata;                    // the "__metadata__" object, or null
  std::uint64_t data_start = 0;            // 8 + the header's length
  const safetensors_entry* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

namespace detail {

// The reference reader's limit on the header.
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

// Bytes per element of each of the format's dtypes; 0 for a name it does not have.
inline std::size_t safetensors_element_bytes(std::string_view t) {
  constexpr std::array<std::pair<std::string_view, std::size_t>, 15> sizes{{
      {"BOOL", 1},
      {"U8", 1},
      {"I8", 1},
      {"F8_E5M2", 1},
      {"F8_E4M3", 1},
      {"I16", 2},
      {"U16", 2},
      {"F16", 2},
      {"BF16", 2},
      {"I32", 4},
      {"U32", 4},
      {"F32", 4},
      {"F64", 8},
      {"I64", 8},
      {"U64", 8},
  }};
  for (const auto& [name, bytes] : sizes)
    if (name == t) return bytes;
  return 0;
}

inline std::string_view safetensors_dtype_of(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f64: return "F64";
    case dtype::bf16: return "BF16";
    case dtype::f16: return "F16";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
    case dtype::u8: return "U8";
    case dtype::u16: return "U16";
  }
  return "?";
}

inline std::string shape_text(std::span<const std::size_t> shape) { return join_extents(shape); }

// The header's text, padded with spaces to a multiple of 8 bytes.
inline std::string safetensors_header_text(std::span<const safetensors_entry> tensors,
                                           const json::value& metadata) {
  json::value h = json::object{};
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  for (const auto& t : tensors) {
    json::value e = json::object{};
    e["dtype"] = t.dtype;
    json::value shape = json::array{};
    for (const std::size_t x : t.shape) shape.push_back(static_cast<std::int64_t>(x));
    e["shape"] = std::move(shape);
    json::value offsets = json::array{};
    offsets.push_back(static_cast<std::int64_t>(t.begin));
    offsets.push_back(static_cast<std::int64_t>(t.end));
    e["data_offsets"] = std::move(offsets);
    h[t.name] = std::move(e);
  }
  std::string text = json::dump(h);
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// Writes the file's beginning: the header's length (8 bytes, little-endian) and its text.
inline void write_safetensors_header(atomic_file_writer& out,
                                     std::span<const safetensors_entry> tensors,
                                     const json::value& metadata) {
  const std::string header = safetensors_header_text(tensors, metadata);
  std::array<std::byte, 8> length{};
  for (std::size_t k = 0; k < 8; ++k)
    length[k] = static_cast<std::byte>((header.size() >> (8 * k)) & 0xffU);
  out.write(std::span<const std::byte>(length));
  out.write(header);
}

// Parses and checks a header (`text`: the N bytes after the length) of a file of
// `file_bytes` bytes.
inline safetensors_header parse_safetensors_header(std::string_view op,
                                                   const std::filesystem::path& file,
                                                   std::string_view text,
                                                   std::uint64_t file_bytes) {
  auto fail = [&](auto&&... parts) -> void {
    throw checkpoint_error(zest::detail::message("zest: ", op, ": ", file,
                                                 " is not a valid safetensors file: ", parts...));
  };
  json::value h;
  try {
    h = json::parse(text);
  } catch (const json::error& e) {
    fail("its header is not JSON (", e.what(), ")");
  }
  if (!h.is_object()) fail("its header is not a JSON object");
  safetensors_header out;
  out.data_start = 8 + text.size();
  const std::uint64_t data_bytes = file_bytes - out.data_start;
  for (const auto& [name, e] : h.as_object()) {
    if (name == "__metadata__") {
      if (!e.is_object()) fail("\"__metadata__\" is not an object");
      for (const auto& [key, v] : e.as_object()) {
        if (!v.is_string()) fail("metadata \"", key, "\" is not a string");
      }
      out.metadata = e;
      continue;
    }
    const auto bad = [&](auto&&... parts) { fail("tensor \"", name, "\": ", parts...); };
    if (!e.is_object()) bad("its entry is not an object");
    for (const auto& [key, v] : e.as_object()) {
      (void)v;
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        bad("unknown key \"", key, "\"");
    }
    const json::value* type = e.find("dtype");
    const json::value* shape = e.find("shape");
    const json::value* offsets = e.find("data_offsets");
    if (type == nullptr || !type->is_string()) bad("no \"dtype\" string");
    const std::size_t element = safetensors_element_bytes(type->as_string());
    if (element == 0) bad("unknown dtype \"", type->as_string(), "\"");
    if (shape == nullptr || !shape->is_array()) bad("no \"shape\" array");
    if (offsets == nullptr || !offsets->is_array() || offsets->as_array().size() != 2)
      bad("no \"data_offsets\" pair");
    safetensors_entry t;
    t.name = name;
    t.dtype = type->as_string();
    std::uint64_t count = 1;
    for (const json::value& x : shape->as_array()) {
      if (!x.is_integer() || x.as_int() < 0) bad("the shape holds ", json::dump(x));
      const auto n = static_cast<std::uint64_t>(x.as_int());
      if (n != 0 && count > std::numeric_limits<std::uint64_t>::max() / n / element)
        bad("the shape overflows");
      count *= n;
      t.shape.push_back(static_cast<std::size_t>(n));
    }
    const json::value& b = offsets->as_array()[0];
    const json::value& f = offsets->as_array()[1];
    if (!b.is_integer() || !f.is_integer() || b.as_int() < 0 || f.as_int() < b.as_int())
      bad("data_offsets ", json::dump(*offsets), " are not a range");
    t.begin = static_cast<std::uint64_t>(b.as_int());
    t.end = static_cast<std::uint64_t>(f.as_int());
    if (t.end - t.begin != count * element) {
      bad("data_offsets ", json::dump(*offsets), " hold ", t.end - t.begin, " bytes, its shape ",
          shape_text(t.shape), " of ", t.dtype, " needs ", count * element);
    }
    if (t.end > data_bytes) {
      bad("its data ends at byte ", t.end, " of the data, which has ", data_bytes,
          " (the file is truncated)");
    }
    out.tensors.push_back(std::move(t));
  }
  // The data, tensor after tensor, without gaps or overlaps.
  std::vector<const safetensors_entry*> by_offset;
  for (const auto& t : out.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  std::uint64_t at = 0;
  for (const auto* t : by_offset) {
    if (t->begin != at) {
      fail("tensor \"", t->name, "\" starts at byte ", t->begin, " of the data, where ", at,
           t->begin < at ? " (it overlaps the tensor before it)" : " (a gap before it)");
    }
    at = t->end;
  }
  if (at != data_bytes) {
    fail("its tensors end at byte ", at, " of the data, the file holds ", data_bytes,
         " bytes of data");
  }
  return out;
}

// Reads and checks the header of `file` (rank 0 on load).
inline std::string read_safetensors_header_text(std::string_view op,
                                                const std::filesystem::path& file,
                                                std::uint64_t& file_bytes) {
  const input_file in(file, op);
  file_bytes = in.size();
  auto fail = [&](auto&&... parts) -> void {
    throw checkpoint_error(zest::detail::message("zest: ", op, ": ", file,
                                                 " is not a valid safetensors file: ", parts...));
  };
  if (file_bytes < 8) fail("it has ", file_bytes, " bytes, fewer than the header's length");
  std::array<std::byte, 8> word{};
  in.read_at(0, word);
  std::uint64_t length = 0;
  for (std::size_t k = 8; k-- > 0;)
    length = (length << 8U) | std::to_integer<std::uint64_t>(word[k]);
  if (length > safetensors_max_header || length > file_bytes - 8) {
    fail("its header's length ", length, " exceeds ",
         length > safetensors_max_header ? "the format's limit of 100 MB" : "the file");
  }
  std::string text(static_cast<std::size_t>(length), '\0');
  in.read_at(8, std::as_writable_bytes(std::span(text.data(), text.size())));
  // The reference writer pads with spaces; JSON allows trailing white space.
  return text;
}

// -----------------------------------------------------------------------------------------
// Elements.

// One element of the format's float dtypes as a double; false for another dtype.
inline bool float_dtype(std::string_view t) {
  return t == "F32" || t == "F64" || t == "BF16" || t == "F16";
}
inline double read_float(std::string_view t, const std::byte* p) {
  if (t == "F32") {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  if (t == "F64") {
    double v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  if (t == "BF16") return static_cast<float>(bfloat16::from_bits(bits));
  return static_cast<float>(float16::from_bits(bits));
}
inline void write_float(dtype t, double v, std::byte* p) {
  switch (t) {
    case dtype::f32: {
      const auto f = static_cast<float>(v);
      std::memcpy(p, &f, sizeof f);
      return;
    }
    case dtype::f64: std::memcpy(p, &v, sizeof v); return;
    case dtype::bf16: {
      const bfloat16 b(static_cast<float>(v));
      std::memcpy(p, &b.bits, sizeof b.bits);
      return;
    }
    case dtype::f16: {
      const float16 h(static_cast<float>(v));
      const std::uint16_t bits = h.bits();
      std::memcpy(p, &bits, sizeof bits);
      return;
    }
    default: break;
  }
  throw shape_error(
      zest::detail::message("zest: safetensors: cannot store a float as ", name_of(t)));
}

// Visits the elements of a row-major box (its global offsets and extents) with their index
// in the box and their position in a file tensor under `part`.
template <class F>
void for_each_placed(std::span<const std::size_t> offsets, std::span<const std::size_t> extents,
                     const weight_part& part, F&& f) {
  const std::size_t n = extents.size();
  std::size_t count = 1;
  for (const std::size_t e : extents) count *= e;
  if (count == 0) return;
  std::vector<std::size_t> index(n, 0);
  std::size_t at = part.offset;
  for (std::size_t k = 0; k < n; ++k) at += offsets[k] * part.strides[k];
  for (std::size_t i = 0; i < count; ++i) {
    f(i, at);
    for (std::size_t k = n; k-- > 0;) {
      at += part.strides[k];
      if (++index[k] < extents[k]) break;
      at -= extents[k] * part.strides[k];
      index[k] = 0;
    }
  }
}

// The file tensor's position of the last element of a parameter of `extents` (all extents
// positive), under `part`.
inline std::size_t last_position(const weight_part& part, std::span<const std::size_t> extents) {
  std::size_t at = part.offset;
  for (std::size_t k = 0; k < extents.size(); ++k) at += (extents[k] - 1) * part.strides[k];
  return at;
}

inline std::size_t volume_of(std::span<const std::size_t> e) {
  std::size_t n = 1;
  for (const std::size_t x : e) n *= x;
  return n;
}

// The map against the records (one per parameter, by name): every part names a record of
// as many dims as it has strides and lands inside its tensor; every record has exactly one
// primary part; a tensor's primary parts hold as many elements as the tensor and share one
// element type. Whether they cover it exactly once is checked as the data is placed.
inline void check_map(std::string_view op, const weight_map& map,
                      const std::map<std::string, const tensor_record*>& records, bool saving) {
  auto fail = [&](auto&&... parts) {
    throw shape_error(zest::detail::message("zest: ", op, ": ", map.convention, ": ", parts...));
  };
  std::map<std::string_view, std::size_t> primary;
  std::set<std::string_view> names;
  for (const auto& t : map.tensors) {
    if (!names.insert(t.name).second) fail("the file tensor \"", t.name, "\" is named twice");
    if (t.name.empty() || t.name == "__metadata__") {
      fail("a file tensor cannot be named \"", t.name, "\" (the header's metadata has that key)");
    }
    const std::size_t size = volume_of(t.shape);
    std::size_t held = 0;
    std::optional<dtype> type;
    for (const auto& p : t.parts) {
      const auto it = records.find(p.parameter);
      if (it == records.end()) {
        fail("file tensor \"", t.name, "\" holds parameter \"", p.parameter,
             "\", which the model does not have");
      }
      const tensor_record& r = *it->second;
      if (p.strides.size() != r.global_extents.size()) {
        fail("file tensor \"", t.name, "\": parameter \"", p.parameter, "\" has ",
             r.global_extents.size(), " dims (", r.dims, "), its part ", p.strides.size(),
             " strides");
      }
      const std::size_t count = volume_of(r.global_extents);
      if (count > 0 && last_position(p, r.global_extents) >= size) {
        fail("file tensor \"", t.name, "\" ", shape_text(t.shape), " cannot hold parameter \"",
             p.parameter, "\" ", shape_text(r.global_extents), " at offset ", p.offset,
             " with strides ", shape_text(p.strides));
      }
      if (p.alternative) continue;
      ++primary[p.parameter];
      held += count;
      if (type && *type != r.type) {
        fail("file tensor \"", t.name, "\" holds parameters of ", name_of(*type), " and of ",
             name_of(r.type), " (", p.parameter, "): a tensor has one element type");
      }
      type = r.type;
    }
    if (saving && !type) fail("file tensor \"", t.name, "\" has no primary part to write");
    if (saving && held != size) {
      fail("the parameters of file tensor \"", t.name, "\" ", shape_text(t.shape), " hold ", held,
           " elements, the tensor ", size);
    }
  }
  for (const auto& [name, r] : records) {
    (void)r;
    const auto it = primary.find(name);
    if (it == primary.end()) {
      fail("parameter \"", name, "\" has no tensor in the file's names",
           saving ? " (the model has more than the convention can write)" : "");
    }
    if (it->second > 1) fail("parameter \"", name, "\" is in ", it->second, " file tensors");
  }
}

// The same map on every rank (its collectives follow its parts): compared by a digest of
// its text; a difference is a shape_error on every rank.
template <class Comm>
void agree_on_map(Comm& world, std::string_view op, const weight_map& map) {
  std::string text = map.convention + "|" + map.optional_prefix;
  for (const auto& s : map.ignored_suffixes) text += "|" + s;
  for (const auto& t : map.tensors) {
    text += "|" + t.name + ":" + join_extents(t.shape);
    for (const auto& p : t.parts) {
      text += ";" + p.parameter + "@" + std::to_string(p.offset) + ":" + join_extents(p.strides) +
              (p.alternative ? "?" : "");
    }
  }
  const std::array<std::int64_t, 1> mine{
      std::bit_cast<std::int64_t>(xxh64(std::as_bytes(std::span(text.data(), text.size()))))};
  std::vector<std::int64_t> all(static_cast<std::size_t>(world.size()));
  world.template all_gather<std::int64_t>(std::span<const std::int64_t>(mine),
                                          std::span<std::int64_t>(all));
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) {
      throw shape_error(zest::detail::message("zest: ", op, ": rank ", r,
                                              " passes another weight map than rank 0; every "
                                              "rank must pass the same"));
    }
  }
}

}  // namespace detail

// Collective over mesh.world(): writes the parameters (one record each, named as the map's
// parts name them; every rank passes the same list) as the safetensors file `file`, tensors
// and names as `map` says, the map's config as metadata "config" beside "format": "pt".
// Atomic: `file` is the old one or the new one whatever fails. Throws shape_error when the
// map and the records do not fit, checkpoint_error when the file cannot be written, on
// every rank.
template <class Mesh>
void save_safetensors(const std::filesystem::path& file, const Mesh& mesh,
                      std::span<const tensor_record> parameters, const weight_map& map,
                      source_site at = source_site::current()) {
  const user_call user(at);
  namespace d = detail;
  constexpr std::string_view op = "save_safetensors";
  auto& world = mesh.world();
  const int rank = world.rank();
  const auto n = static_cast<std::size_t>(world.size());
  std::map<std::string, const tensor_record*> by_name;
  d::agree(world, d::attempt(op, [&] {
             d::check_records(op, parameters, false);
             for (const auto& r : parameters) {
               if (r.type != dtype::f32 && r.type != dtype::f64 && r.type != dtype::bf16 &&
                   r.type != dtype::f16) {
                 throw shape_error(zest::detail::message(
                     "zest: ", op, ": parameter \"", r.name, "\" holds ", name_of(r.type),
                     ": weights are floats (f32, f64, bf16, f16)"));
               }
               by_name[r.name] = &r;
             }
             d::check_map(op, map, by_name, true);
           }));
  d::agree_on_list(world, op, parameters);
  d::agree_on_map(world, op, map);

  // The header: the tensors in the map's order, back to back.
  std::vector<safetensors_entry> entries;
  std::vector<dtype> types;
  std::uint64_t data_bytes = 0;
  for (const auto& t : map.tensors) {
    // Its element type: the primary parts' (check_map: one, and at least one part).
    const auto first = std::find_if(t.parts.begin(), t.parts.end(),
                                    [](const weight_part& p) { return !p.alternative; });
    const dtype type = by_name.at(first->parameter)->type;
    const std::uint64_t bytes = d::volume_of(t.shape) * d::element_size(type);
    entries.push_back({t.name, std::string(d::safetensors_dtype_of(type)), t.shape, data_bytes,
                       data_bytes + bytes});
    types.push_back(type);
    data_bytes += bytes;
  }
  json::value metadata = json::object{};
  metadata["format"] = "pt";
  if (!map.config.is_null()) metadata["config"] = json::dump(map.config);

  // Rank 0 writes; a failure there is kept until every rank has sent its blocks.
  std::unique_ptr<atomic_file_writer> out;
  d::outcome written = d::attempt(op, [&] {
    if constexpr (std::endian::native != std::endian::little) {
      throw checkpoint_error(zest::detail::message(
          "zest: ", op, ": safetensors data is little-endian; this host is not"));
    }
    if (rank != 0) return;
    out = std::make_unique<atomic_file_writer>(file, op);
    d::write_safetensors_header(*out, entries, metadata);
  });
  const auto ok = [&] { return written.kind == d::failure::none; };

  std::vector<std::byte> tensor;     // rank 0: the file tensor being assembled
  std::vector<bool> placed;          // rank 0: which of its elements a part wrote
  std::vector<std::uint8_t> blocks;  // rank 0: every rank's block of one parameter
  for (std::size_t i = 0; i < map.tensors.size(); ++i) {
    const weight_tensor& t = map.tensors[i];
    const std::size_t element = d::element_size(types[i]);
    const std::size_t size = d::volume_of(t.shape);
    if (rank == 0 && ok()) {
      written = d::attempt(op, [&] {
        tensor.assign(size * element, std::byte{0});
        placed.assign(size, false);
      });
    }
    for (const weight_part& part : t.parts) {
      if (part.alternative) continue;
      const tensor_record& r = *by_name.at(part.parameter);
      const std::size_t dims = r.dims.size();
      // Each rank's box (offsets, extents; nothing for a replica), then its bytes, to rank 0.
      const bool sends = r.writes && !r.bytes.empty();
      std::vector<std::int64_t> box;
      if (sends) {
        for (const std::size_t x : r.local_offsets) box.push_back(static_cast<std::int64_t>(x));
        for (const std::size_t x : r.local_extents) box.push_back(static_cast<std::int64_t>(x));
      }
      const std::array<std::int64_t, 1> mine{static_cast<std::int64_t>(box.size())};
      std::vector<std::int64_t> box_sizes(n);
      world.template all_gather<std::int64_t>(std::span<const std::int64_t>(mine),
                                              std::span<std::int64_t>(box_sizes));
      std::vector<std::size_t> box_counts(n);
      std::size_t total = 0;
      for (std::size_t q = 0; q < n; ++q)
        total += box_counts[q] = static_cast<std::size_t>(box_sizes[q]);
      std::vector<std::int64_t> boxes(total);
      world.template all_gather<std::int64_t>(std::span<const std::int64_t>(box),
                                              std::span<std::int64_t>(boxes),
                                              std::span<const std::size_t>(box_counts));
      std::vector<std::size_t> send_counts(n, 0), recv_counts(n, 0);
      if (sends) send_counts[0] = r.bytes.size();
      std::size_t received = 0;
      std::vector<std::size_t> block_bytes(n, 0);
      for (std::size_t q = 0, at_box = 0; q < n; at_box += box_counts[q], ++q) {
        if (box_counts[q] == 0) continue;
        std::size_t count = element;
        for (std::size_t k = 0; k < dims; ++k)
          count *= static_cast<std::size_t>(boxes[at_box + dims + k]);
        block_bytes[q] = count;
      }
      if (rank == 0) {
        recv_counts = block_bytes;
        for (const std::size_t b : block_bytes) received += b;
      }
      blocks.resize(received);
      world.template all_to_all<std::uint8_t>(
          std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(r.bytes.data()),
                                        sends ? r.bytes.size() : 0),
          std::span<const std::size_t>(send_counts), std::span<std::uint8_t>(blocks),
          std::span<const std::size_t>(recv_counts));
      if (rank != 0 || !ok()) continue;
      written = d::attempt(op, [&] {
        std::size_t from = 0;
        for (std::size_t q = 0, at_box = 0; q < n; at_box += box_counts[q], ++q) {
          if (box_counts[q] == 0) continue;
          std::vector<std::size_t> offsets(dims), extents(dims);
          for (std::size_t k = 0; k < dims; ++k) {
            offsets[k] = static_cast<std::size_t>(boxes[at_box + k]);
            extents[k] = static_cast<std::size_t>(boxes[at_box + dims + k]);
          }
          const std::uint8_t* src = blocks.data() + from;
          d::for_each_placed(offsets, extents, part, [&](std::size_t e, std::size_t pos) {
            if (placed[pos]) {
              throw shape_error(zest::detail::message(
                  "zest: ", op, ": ", map.convention, ": file tensor \"", t.name, "\": element ",
                  pos, " is placed twice, the second time by parameter \"", part.parameter,
                  "\" (two parts on the same elements, or two ranks' blocks overlapping)"));
            }
            placed[pos] = true;
            std::memcpy(tensor.data() + pos * element, src + e * element, element);
          });
          from += block_bytes[q];
        }
      });
    }
    if (rank != 0 || !ok()) continue;
    written = d::attempt(op, [&] {
      const auto missing = std::find(placed.begin(), placed.end(), false);
      if (missing != placed.end()) {
        throw shape_error(
            zest::detail::message("zest: ", op, ": ", map.convention, ": file tensor \"", t.name,
                                  "\" ", d::shape_text(t.shape), ": element ",
                                  missing - placed.begin(), " is held by no parameter"));
      }
      out->write(std::span<const std::byte>(tensor));
    });
  }
  if (rank == 0 && ok()) written = d::attempt(op, [&] { out->commit(); });
  out.reset();
  d::agree(world, written);
}

// Collective over mesh.world(): fills each record with the values of the parameter its name
// names (several records may name one parameter: a stored copy and its fp32 master), from
// the safetensors file `file` as `map` places the parameters in it, whatever mesh and layout
// the records have. The file's floats are converted to each record's element type. On any
// failure, on any rank, every rank throws (checkpoint_error for the file, shape_error for
// records or a map that do not fit) and no record is modified.
template <class Mesh>
void load_safetensors(const std::filesystem::path& file, const Mesh& mesh,
                      std::span<const tensor_record> targets, const weight_map& map,
                      const load_options& options = {}, source_site at = source_site::current()) {
  const user_call user(at);
  namespace d = detail;
  constexpr std::string_view op = "load_safetensors";
  auto& world = mesh.world();
  const int rank = world.rank();

  // 1. Rank 0 reads the header; every rank parses the same text.
  std::string text;
  std::array<std::int64_t, 2> sizes{0, 0};  // the header's length, the file's
  d::agree(
      world, d::attempt(op, [&] {
        if constexpr (std::endian::native != std::endian::little) {
          throw checkpoint_error(zest::detail::message(
              "zest: ", op, ": safetensors data is little-endian; this host is not"));
        }
        if (rank != 0) return;
        std::uint64_t file_bytes = 0;
        text = d::read_safetensors_header_text(op, file, file_bytes);
        sizes = {static_cast<std::int64_t>(text.size()), static_cast<std::int64_t>(file_bytes)};
      }));
  world.template broadcast<std::int64_t>(std::span<std::int64_t>(sizes), 0);
  text.resize(static_cast<std::size_t>(sizes[0]));
  world.template broadcast<std::uint8_t>(
      std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(text.data()), text.size()), 0);
  d::agree_on_map(world, op, map);

  // 2. The header against the map and the records: for each record, the file tensor and
  // part it is read from.
  struct source {
    const safetensors_entry* entry = nullptr;
    const weight_part* part = nullptr;
  };
  safetensors_header header;
  std::vector<source> sources(targets.size());
  d::agree(
      world, d::attempt(op, [&] {
        header = d::parse_safetensors_header(op, file, text, static_cast<std::uint64_t>(sizes[1]));
        std::map<std::string, const tensor_record*> by_name;
        for (const auto& r : targets) {
          const std::size_t n = r.dims.size();
          bool fits = r.global_extents.size() == n && r.local_offsets.size() == n &&
                      r.local_extents.size() == n &&
                      r.bytes.size() == d::volume(r.local_extents) * d::element_size(r.type);
          for (std::size_t k = 0; fits && k < n; ++k)
            fits = r.local_offsets[k] + r.local_extents[k] <= r.global_extents[k];
          if (!fits) {
            throw shape_error(zest::detail::message(
                "zest: ", op, ": parameter \"", r.name, "\": its block ",
                d::join_extents(r.local_offsets), " + ", d::join_extents(r.local_extents), " of ",
                d::join_extents(r.global_extents), " and its ", r.bytes.size(),
                " bytes do not fit each other"));
          }
          if (r.read_only) {
            throw shape_error(zest::detail::message("zest: ", op, ": parameter \"", r.name,
                                                    "\" was recorded from a const tensor"));
          }
          if (r.type != dtype::f32 && r.type != dtype::f64 && r.type != dtype::bf16 &&
              r.type != dtype::f16) {
            throw shape_error(zest::detail::message("zest: ", op, ": parameter \"", r.name,
                                                    "\" holds ", name_of(r.type),
                                                    ": weights are floats (f32, f64, bf16, f16)"));
          }
          const auto [it, fresh] = by_name.emplace(r.name, &r);
          if (!fresh && it->second->global_extents != r.global_extents) {
            throw shape_error(zest::detail::message("zest: ", op, ": two records of parameter \"",
                                                    r.name, "\" have extents ",
                                                    d::shape_text(it->second->global_extents),
                                                    " and ", d::shape_text(r.global_extents)));
          }
        }
        d::check_map(op, map, by_name, false);
        // The file's entry of each map tensor, under its name or without the optional prefix.
        std::map<std::string_view, const safetensors_entry*> present;
        std::set<std::string_view> used;
        for (const auto& t : map.tensors) {
          const safetensors_entry* e = header.find(t.name);
          if (e == nullptr && !map.optional_prefix.empty() &&
              t.name.starts_with(map.optional_prefix))
            e = header.find(std::string_view(t.name).substr(map.optional_prefix.size()));
          if (e == nullptr) continue;
          if (e->shape != t.shape) {
            throw shape_error(zest::detail::message(
                "zest: ", op, ": ", file, ": tensor \"", e->name, "\" has shape ",
                d::shape_text(e->shape), ", the model needs ", d::shape_text(t.shape), " (",
                map.convention, ")"));
          }
          present[t.name] = e;
        }
        for (std::size_t i = 0; i < targets.size(); ++i) {
          const std::string& name = targets[i].name;
          std::vector<std::string> looked;
          for (const bool alternative : {false, true}) {
            for (const auto& t : map.tensors) {
              for (const auto& p : t.parts) {
                if (p.parameter != name || p.alternative != alternative) continue;
                looked.push_back(t.name);
                const auto it = present.find(t.name);
                if (it != present.end() && sources[i].entry == nullptr)
                  sources[i] = {it->second, &p};
              }
            }
          }
          if (sources[i].entry == nullptr) {
            std::string names;
            for (const auto& l : looked) names += (names.empty() ? "\"" : ", \"") + l + "\"";
            throw checkpoint_error(
                zest::detail::message("zest: ", op, ": ", file, ": no tensor holds parameter \"",
                                      name, "\" (", map.convention, ": looked for ", names, ")"));
          }
          if (!d::float_dtype(sources[i].entry->dtype)) {
            throw checkpoint_error(zest::detail::message(
                "zest: ", op, ": ", file, ": tensor \"", sources[i].entry->name, "\" holds ",
                sources[i].entry->dtype, "; weights load from F32, F64, BF16 or F16"));
          }
          used.insert(sources[i].entry->name);
        }
        // What the file holds that the model would not read.
        std::string unused;
        std::size_t unused_count = 0;
        std::set<const safetensors_entry*> mapped;
        for (const auto& [name, e] : present) mapped.insert(e);
        for (const auto& e : header.tensors) {
          bool known = used.contains(e.name) || mapped.contains(&e);
          for (const auto& s : map.ignored_suffixes) known = known || e.name.ends_with(s);
          if (known) continue;
          if (++unused_count <= 5) unused += (unused.empty() ? "\"" : ", \"") + e.name + "\"";
        }
        if (unused_count > 0 && !options.allow_unused) {
          throw checkpoint_error(zest::detail::message(
              "zest: ", op, ": ", file, ": ", unused_count, " tensor", unused_count == 1 ? "" : "s",
              " of the file ", unused_count == 1 ? "is" : "are", " not the model's (", unused,
              unused_count > 5 ? ", ..." : "", "; ", map.convention,
              "): a file of another model? load_options::allow_unused skips them"));
        }
      }));

  // 3. Each rank reads the stretch of each source tensor its block spans, converting.
  std::vector<std::unique_ptr<std::byte[]>> staging(targets.size());
  d::agree(world, d::attempt(op, [&] {
             const d::input_file in(file, op);
             std::vector<std::byte> stretch;
             for (std::size_t i = 0; i < targets.size(); ++i) {
               const tensor_record& r = targets[i];
               const safetensors_entry& e = *sources[i].entry;
               const weight_part& part = *sources[i].part;
               const std::size_t from_bytes = d::safetensors_element_bytes(e.dtype);
               const std::size_t to_bytes = d::element_size(r.type);
               staging[i] = std::make_unique_for_overwrite<std::byte[]>(r.bytes.size());
               std::size_t lo = std::numeric_limits<std::size_t>::max(), hi = 0;
               d::for_each_placed(r.local_offsets, r.local_extents, part,
                                  [&](std::size_t, std::size_t p) {
                                    lo = std::min(lo, p);
                                    hi = std::max(hi, p);
                                  });
               if (lo > hi) continue;  // an empty block
               stretch.resize((hi - lo + 1) * from_bytes);
               in.read_at(header.data_start + e.begin + lo * from_bytes, stretch);
               std::byte* dst = staging[i].get();
               d::for_each_placed(
                   r.local_offsets, r.local_extents, part, [&](std::size_t k, std::size_t p) {
                     d::write_float(r.type, d::read_float(e.dtype, &stretch[(p - lo) * from_bytes]),
                                    dst + k * to_bytes);
                   });
             }
           }));

  // 4. Every rank read its part: only now do the records change.
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (!targets[i].bytes.empty()) {
      std::memcpy(targets[i].bytes.data(), staging[i].get(), targets[i].bytes.size());
    }
    if (targets[i].write_back) targets[i].write_back();
  }
}

// The header of a safetensors file (not collective): its tensors and metadata.
inline safetensors_header read_safetensors_header(const std::filesystem::path& file) {
  constexpr std::string_view op = "read_safetensors_header";
  std::uint64_t file_bytes = 0;
  const std::string text = detail::read_safetensors_header_text(op, file, file_bytes);
  return detail::parse_safetensors_header(op, file, text, file_bytes);
}

}  // namespace zest::io
