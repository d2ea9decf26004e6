// tests/layout_stress/stress_support.hpp — the run-time checks of the generated layout
// stress programs (tests/layout_stress/generate.py writes the programs; see README.md).
//
// Every tensor a generated program makes goes through check_tensor(), which checks
//   (a) X::layout read at run time (its bytes copied through a volatile pointer in a
//       function that is not inlined, so the compiler cannot fold it), and the value
//       layout_value_of<Mesh, Dims, Layout> had in a constant expression, against the layout
//       the generator computed: written as a code string ("sg0 r sJ0") and built here field
//       by field at run time (decode), so that no constant the compiler made of a
//       layout_value is involved;
//   (b) zest::layout_string<X>() against the generator's string, and zest::parse_layout of
//       both strings against the same expected layout;
//   (c) the values: zest::to_global(t) against a single-rank reference computed here in
//       plain C++ from the global data; this rank's block (offsets, extents, and its values
//       when they are determined) against the block the expected layout gives it, computed
//       here independently of zest; that the blocks counted once (coordinate 0 on every
//       axis that does not split the tensor) add up to the tensor; and, for layouts without
//       partial axes, zest::global_norm against the norm of the global values.
// A layout that is wrong on the mesh's axes and one wrong only in the array entries past
// them (which zest does not read, but which are part of the value) are counted apart.
// Only the public API (zest/zest.hpp) and MPI are used. Every rank runs every check in the
// same order (the collectives inside to_global, global_norm and the counting reduction
// need that); a failed check is recorded, never skips the ones after it.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/zest.hpp"

// The generated programs also check at compile time that zest::parse_layout of the
// generator's string equals X::layout and that redistribute/einsum give the types the
// generator expects. With ZEST_STRESS_STATIC_CHECKS=0 those static_asserts are left out, to
// see what the run-time checks say about a compiler that gets the constants wrong.
#ifndef ZEST_STRESS_STATIC_CHECKS
#define ZEST_STRESS_STATIC_CHECKS 1
#endif
#if ZEST_STRESS_STATIC_CHECKS
#define ZEST_STRESS_STATIC_ASSERT(...) static_assert(__VA_ARGS__)
#else
#define ZEST_STRESS_STATIC_ASSERT(...) static_assert(true || (__VA_ARGS__))  // named, not evaluated
#endif

namespace stress {

// ---------------------------------------------------------------------------------------
// Bookkeeping: checks and failures of this rank.

struct run_state {
  std::string mesh;  // the mesh the current scenario runs on, for messages
  std::string scenario;
  std::size_t checks = 0;
  std::size_t failures = 0;
  std::set<std::string> types_checked;
  std::set<std::string> bad_layout_types;    // a mesh axis's placement read wrong at run time
  std::set<std::string> bad_trailing_types;  // only entries past axis_count read wrong
  std::set<std::string> bad_value_types;     // values or blocks wrong
  // The first messages of each kind: layouts, values.
  std::vector<std::string> layout_messages;
  std::vector<std::string> value_messages;
};

inline run_state& state() {
  static run_state s;
  return s;
}

enum class failure_kind : std::uint8_t { layout, value };

// A message with its unprintable characters escaped (a misread layout prints a dim of '\0').
inline std::string printable(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 32 && u < 127) {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    }
  }
  return out;
}

inline void fail(const std::string& what, failure_kind kind = failure_kind::value) {
  auto& s = state();
  ++s.failures;
  auto& list = kind == failure_kind::layout ? s.layout_messages : s.value_messages;
  if (list.size() < 20) list.push_back(printable(s.scenario + " on " + s.mesh + ": " + what));
}

// ---------------------------------------------------------------------------------------
// What the generator knows about a tensor type.

struct type_info {
  const char* name;             // the type as the generator spelled it
  const char* expected;         // the generator's layout string; nullptr when deduced
  const char* code;             // the generator's normalised layout, see decode(); or nullptr
  zest::layout_value constant;  // layout_value_of<Mesh, Dims, Layout> (a constant expression)
};

// A layout value's bytes as they are, for messages: a misread value need not be printable
// by to_string (a kind of 0, say).
inline std::string dump(const zest::layout_value& v) {
  std::string out = "{axis_count " + std::to_string(v.axis_count) + ":";
  for (std::size_t a = 0; a < v.axes.size(); ++a) {
    const auto& p = v.axes[a];
    out += a == 0 ? " " : " | ";
    out += "kind " + std::to_string(static_cast<int>(p.kind));
    if (p.dim != 0 || p.order != 0) {
      const auto d = static_cast<unsigned char>(p.dim);
      out += " dim ";
      out += (d >= 32 && d < 127) ? std::string(1, p.dim) : "\\" + std::to_string(d);
      out += " order " + std::to_string(static_cast<int>(p.order));
    }
  }
  return out + "}";
}

// Copies a layout value byte by byte through a volatile pointer; not inlined, so what the
// caller gets is what the object in memory holds, not what the compiler knows it should.
[[gnu::noinline]] inline zest::layout_value copy_through_volatile(const volatile unsigned char* p) {
  static_assert(std::is_trivially_copyable_v<zest::layout_value>);
  unsigned char bytes[sizeof(zest::layout_value)];
  for (std::size_t i = 0; i < sizeof bytes; ++i) bytes[i] = p[i];
  zest::layout_value v;
  std::memcpy(&v, bytes, sizeof v);
  return v;
}

template <class X>
zest::layout_value runtime_layout() {
  return copy_through_volatile(reinterpret_cast<const volatile unsigned char*>(&X::layout));
}

// The generator's normalised layout, one token per mesh axis: "r" replicate, "p" partial,
// "s<dim><order>" split (order = position in the dim's nesting), e.g. "sg0 r sJ0". Every
// field of every entry is assigned here at run time, from the characters of the string, so
// that no constant the compiler made of a layout_value is involved; entries past the mesh's
// axes are replicate, as layout_value's default member initialisers say.
inline zest::layout_value decode(const char* code, std::size_t axis_count) {
  zest::layout_value v;
  for (std::size_t a = 0; a < v.axes.size(); ++a) {
    v.axes[a].kind = zest::placement_kind::replicate;
    v.axes[a].dim = 0;
    v.axes[a].order = 0;
  }
  v.axis_count = static_cast<std::uint8_t>(axis_count);
  std::size_t a = 0;
  for (const char* p = code; *p != '\0'; ++a) {
    if (a >= axis_count)
      throw std::invalid_argument(std::string("stress::decode: too many axes in ") + code);
    if (*p == 'r') {
      ++p;
    } else if (*p == 'p') {
      v.axes[a].kind = zest::placement_kind::partial;
      ++p;
    } else if (*p == 's') {
      v.axes[a].kind = zest::placement_kind::split;
      v.axes[a].dim = p[1];
      p += 2;
      int order = 0;
      while (*p >= '0' && *p <= '9') order = order * 10 + (*p++ - '0');
      v.axes[a].order = static_cast<std::uint8_t>(order);
    } else {
      throw std::invalid_argument(std::string("stress::decode: bad code ") + code);
    }
    while (*p == ' ') ++p;
  }
  if (a != axis_count)
    throw std::invalid_argument(std::string("stress::decode: too few axes in ") + code);
  return v;
}

// Whether two layout values agree on the mesh's axes (what zest's code looks at).
inline bool same_on_mesh_axes(const zest::layout_value& x, const zest::layout_value& y) {
  if (x.axis_count != y.axis_count) return false;
  for (std::size_t a = 0; a < x.axis_count && a < x.axes.size(); ++a) {
    if (!(x.axes[a] == y.axes[a])) return false;
  }
  return true;
}

// The constant's entries on the mesh's axes, copied field by field, the others replicate:
// what a deduced layout is expected to be (the generator does not know it).
inline zest::layout_value on_mesh_axes(const zest::layout_value& c, std::size_t axis_count) {
  zest::layout_value v;
  for (std::size_t a = 0; a < v.axes.size(); ++a) {
    const bool on_mesh = a < axis_count;
    v.axes[a].kind = on_mesh ? c.axes[a].kind : zest::placement_kind::replicate;
    v.axes[a].dim = on_mesh ? c.axes[a].dim : '\0';
    v.axes[a].order = on_mesh ? c.axes[a].order : 0;
  }
  v.axis_count = static_cast<std::uint8_t>(axis_count);
  return v;
}

// What the checks need of a mesh, whatever its type: axis names, sizes, coordinates.
struct mesh_view {
  std::vector<std::string_view> names;
  std::vector<int> sizes;
  std::vector<int> coords;
  int rank = 0;
  std::size_t axis_count() const { return names.size(); }
};

template <class Mesh>
mesh_view view_of(const Mesh& m) {
  mesh_view v;
  v.names.assign(Mesh::axis_names.begin(), Mesh::axis_names.end());
  v.sizes.assign(m.sizes().begin(), m.sizes().end());
  v.coords.assign(m.coords().begin(), m.coords().end());
  v.rank = m.rank();
  return v;
}

// The layout a check expects: the generator's when it gave one, else the constant's
// placements on the mesh's axes.
inline zest::layout_value expected_layout(const type_info& info, std::size_t axis_count) {
  if (info.code == nullptr) return on_mesh_axes(info.constant, axis_count);
  try {
    return decode(info.code, axis_count);
  } catch (const std::exception& e) {
    fail(std::string(info.name) + ": " + e.what());
    return info.constant;
  }
}

// (a) and (b): a type's layout as read at run time (rt: X::layout's bytes; printed:
// layout_string<X>()) against the expected one. No communication.
inline void check_layout(const type_info& info, const mesh_view& m, const zest::layout_value& rt,
                         const std::string& printed) {
  const std::span<const std::string_view> names(m.names);
  state().types_checked.insert(info.name);
  const zest::layout_value want = expected_layout(info, m.axis_count());
  const char* expected = info.expected != nullptr ? info.expected : "(deduced)";
  bool on_axes = true;   // every value agrees with `want` on the mesh's axes
  bool trailing = true;  // ... and past them
  auto note = [&](bool good, bool good_on_axes, const std::string& what) {
    ++state().checks;
    if (good) return;
    if (good_on_axes) {
      trailing = false;
    } else {
      on_axes = false;
    }
    fail(std::string(info.name) + ": " + what +
             (good_on_axes ? " (only past the mesh's axes)" : "") + "; expected layout \"" +
             expected + "\" " + dump(want) + ", layout_string<X>() gives \"" + printed +
             "\", X::layout at run time " + dump(rt) + ", layout_value_of " + dump(info.constant),
         failure_kind::layout);
  };
  auto compare = [&](const zest::layout_value& got, const std::string& what) {
    note(got == want, same_on_mesh_axes(got, want), what);
  };
  compare(rt, "X::layout read at run time differs from the expected layout");
  compare(info.constant,
          "layout_value_of<...> read in a constant expression differs from the expected layout");
  if (info.expected != nullptr) {
    note(printed == info.expected, false, "layout_string<X>() differs from the expected string");
    try {
      compare(zest::parse_layout(info.expected, names),
              "parse_layout(expected string) differs from the expected layout");
    } catch (const std::exception& e) {
      note(false, false, std::string("the expected string does not parse: ") + e.what());
    }
  }
  try {
    compare(zest::parse_layout(printed, names),
            "layout_string<X>() parses to another value than the expected layout");
  } catch (const std::exception& e) {
    note(false, false, std::string("layout_string<X>() does not parse: ") + e.what());
  }
  if (!on_axes) state().bad_layout_types.insert(info.name);
  if (on_axes && !trailing) state().bad_trailing_types.insert(info.name);
}

template <class X>
void check_type(const type_info& info, const mesh_view& m) {
  check_layout(info, m, runtime_layout<X>(), zest::layout_string<X>());
}

// ---------------------------------------------------------------------------------------
// Global reference data.

// A global tensor on the host: values and, per element, the sum of the magnitudes of the
// terms that made it (the scale of the rounding error a value may carry).
struct reference {
  std::vector<std::size_t> extents;
  std::vector<double> values;
  std::vector<double> magnitude;
};

// Small integers in [-4, 4], exact in every element type; `salt` varies the pattern.
template <std::size_t N>
double value_at(const std::array<std::size_t, N>& i, int salt) {
  long v = salt;
  for (std::size_t k = 0; k < N; ++k) v = v * 5 + static_cast<long>((i[k] + 1) * (2 * k + 3));
  return static_cast<double>(((v % 9) + 9) % 9) - 4.0;
}

template <std::size_t N>
reference global_values(const std::array<std::size_t, N>& extents, int salt) {
  reference r;
  r.extents.assign(extents.begin(), extents.end());
  std::size_t total = 1;
  for (auto e : extents) total *= e;
  r.values.resize(total);
  r.magnitude.resize(total);
  std::array<std::size_t, N> i{};
  for (std::size_t flat = 0; flat < total; ++flat) {
    std::size_t rest = flat;
    for (std::size_t k = N; k-- > 0;) {
      i[k] = rest % extents[k];
      rest /= extents[k];
    }
    r.values[flat] = value_at(i, salt);
    r.magnitude[flat] = std::abs(r.values[flat]);
  }
  return r;
}

template <class T>
T from_double(double v) {
  if constexpr (std::is_arithmetic_v<T>) {
    return static_cast<T>(v);
  } else {
    return T(static_cast<float>(v));  // zest::bfloat16, zest::float16
  }
}
template <class T>
double to_double(const T& v) {
  if constexpr (std::is_arithmetic_v<T>) {
    return static_cast<double>(v);
  } else {
    return static_cast<double>(static_cast<float>(v));
  }
}

// How far a value of type T may be from the reference, relative to its magnitude, after a
// contraction and a few partial sums (each rounds once).
template <class T>
constexpr double rounding_tolerance() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  if constexpr (std::is_same_v<T, zest::float16>) return 1e-2;
  if constexpr (std::is_same_v<T, zest::bfloat16>) return 5e-2;
  return 0;
}

inline bool close(double got, double want, double magnitude, double rel) {
  if (rel == 0) return got == want;
  return std::abs(got - want) <= rel * magnitude;
}

// einsum over global host arrays: "Jg->g", "ab,bc->ca", ... The single-rank reference.
inline reference host_einsum(std::string_view spec, const std::vector<const reference*>& ops) {
  const std::size_t arrow = spec.find("->");
  const std::string_view lhs = spec.substr(0, arrow);
  const std::string_view out = spec.substr(arrow + 2);
  std::vector<std::string_view> terms;
  for (std::size_t start = 0;;) {
    const std::size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string_view::npos ? comma : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  std::string letters;
  std::array<std::size_t, 128> extent{};
  for (std::size_t t = 0; t < terms.size(); ++t) {
    for (std::size_t k = 0; k < terms[t].size(); ++k) {
      const char c = terms[t][k];
      if (letters.find(c) == std::string::npos) letters += c;
      extent[static_cast<unsigned char>(c)] = ops[t]->extents[k];
    }
  }
  reference r;
  std::size_t out_total = 1;
  for (char c : out) {
    r.extents.push_back(extent[static_cast<unsigned char>(c)]);
    out_total *= extent[static_cast<unsigned char>(c)];
  }
  r.values.assign(out_total, 0.0);
  r.magnitude.assign(out_total, 0.0);
  std::size_t total = 1;
  for (char c : letters) total *= extent[static_cast<unsigned char>(c)];
  std::array<std::size_t, 128> at{};
  auto flat_index = [&](std::string_view term) {
    std::size_t f = 0;
    for (char c : term)
      f = f * extent[static_cast<unsigned char>(c)] + at[static_cast<unsigned char>(c)];
    return f;
  };
  for (std::size_t flat = 0; flat < total; ++flat) {
    std::size_t rest = flat;
    for (std::size_t k = letters.size(); k-- > 0;) {
      const auto c = static_cast<unsigned char>(letters[k]);
      at[c] = rest % extent[c];
      rest /= extent[c];
    }
    double v = 1;
    double m = 1;
    for (std::size_t t = 0; t < terms.size(); ++t) {
      const std::size_t f = flat_index(terms[t]);
      v *= ops[t]->values[f];
      m *= ops[t]->magnitude[f];
    }
    const std::size_t o = flat_index(out);
    r.values[o] += v;
    r.magnitude[o] += m;
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Blocks, computed here from a layout value and the mesh, independently of zest.

struct block {
  std::size_t offset = 0;
  std::size_t size = 0;
};

// A dim split over axes a1, a2, ... (nesting order): cut over a1 into balanced blocks (the
// first extent % p one larger), then this rank's block again over a2, and so on.
inline block expected_block(const zest::layout_value& v, char dim, std::size_t extent,
                            const mesh_view& m) {
  std::vector<std::pair<int, std::size_t>> axes;  // (order, axis)
  for (std::size_t a = 0; a < m.axis_count(); ++a) {
    if (v.axes[a].kind == zest::placement_kind::split && v.axes[a].dim == dim)
      axes.emplace_back(v.axes[a].order, a);
  }
  std::sort(axes.begin(), axes.end());
  block b{0, extent};
  for (const auto& [order, a] : axes) {
    const auto p = static_cast<std::size_t>(m.sizes[a]);
    const auto c = static_cast<std::size_t>(m.coords[a]);
    const std::size_t q = b.size / p;
    const std::size_t r = b.size % p;
    b.offset += c * q + std::min(c, r);
    b.size = q + (c < r ? 1U : 0U);
  }
  return b;
}

inline bool on_coordinate_zero_of_partial_axes(const zest::layout_value& v, const mesh_view& m) {
  for (std::size_t a = 0; a < m.axis_count(); ++a) {
    if (v.axes[a].kind == zest::placement_kind::partial && m.coords[a] != 0) return false;
  }
  return true;
}

// The blocks this rank holds of a tensor with these dims and extents under layout v, and the
// value of each of its elements: value(global flat index, local flat index).
struct local_blocks {
  std::vector<block> blocks;
  std::size_t count = 1;
};
inline local_blocks blocks_of(const zest::layout_value& v, std::string_view dims,
                              std::span<const std::size_t> extents, const mesh_view& m) {
  local_blocks out;
  for (std::size_t k = 0; k < dims.size(); ++k) {
    out.blocks.push_back(expected_block(v, dims[k], extents[k], m));
    out.count *= out.blocks.back().size;
  }
  return out;
}
// The global row-major index of local element `flat`; `index` receives its multi-index.
inline std::size_t global_index(const local_blocks& b, std::span<const std::size_t> extents,
                                std::size_t flat, std::vector<std::size_t>& index) {
  const std::size_t rank = b.blocks.size();
  index.resize(rank);
  for (std::size_t k = rank; k-- > 0;) {
    index[k] = b.blocks[k].offset + flat % b.blocks[k].size;
    flat /= b.blocks[k].size;
  }
  std::size_t g = 0;
  for (std::size_t k = 0; k < rank; ++k) g = g * extents[k] + index[k];
  return g;
}

// ---------------------------------------------------------------------------------------
// Making inputs.

// X::generate with the pattern of `r` (partial axes: the value on coordinate 0, zeros else).
template <class X>
X make_generated(const typename X::mesh_type& m, const typename X::extents_type& e, int salt) {
  using T = typename X::value_type;
  return X::generate(m, e, [salt](const typename X::extents_type& i) {
    return from_double<T>(value_at(i, salt));
  });
}

// X::from_global from the reference's values.
template <class X>
X make_from_global(const typename X::mesh_type& m, const typename X::extents_type& e,
                   const reference& r) {
  using T = typename X::value_type;
  std::vector<T> global(r.values.size());
  for (std::size_t i = 0; i < global.size(); ++i) global[i] = from_double<T>(r.values[i]);
  return X::from_global(m, e, std::span<const T>(global));
}

// A tensor whose partial axes hold genuine summands: on each partial axis of p ranks,
// coordinate 0 adds -(p - 1) * s and the others s (s a small integer that depends on the
// element), on top of the value on the ranks at coordinate 0 of every partial axis; the
// summands add up to the value exactly. The block is the one the expected layout gives this
// rank (computed here), handed to the tensor's constructor that takes a local shard.
inline std::vector<double> summands(const zest::layout_value& layout, std::string_view dims,
                                    std::span<const std::size_t> extents, const reference& r,
                                    const mesh_view& m) {
  const local_blocks b = blocks_of(layout, dims, extents, m);
  const bool holds_value = on_coordinate_zero_of_partial_axes(layout, m);
  std::vector<double> out(b.count);
  std::vector<std::size_t> i;
  for (std::size_t flat = 0; flat < b.count; ++flat) {
    const std::size_t g = global_index(b, extents, flat, i);
    std::size_t mix = 0;
    for (auto x : i) mix += x;
    double v = holds_value ? r.values[g] : 0.0;
    for (std::size_t a = 0; a < m.axis_count(); ++a) {
      if (layout.axes[a].kind != zest::placement_kind::partial) continue;
      const double s = static_cast<double>(1 + (mix + a) % 3);
      v += m.coords[a] == 0 ? -(m.sizes[a] - 1) * s : s;
    }
    out[flat] = v;
  }
  return out;
}

// X's dim letters.
template <class X>
std::string dims_of() {
  std::string out;
  for (std::size_t k = 0; k < X::rank; ++k) out += X::dims[k];
  return out;
}

template <class X>
X make_summands(const typename X::mesh_type& m, const typename X::extents_type& e,
                const reference& r, const type_info& info) {
  using T = typename X::value_type;
  const mesh_view mv = view_of(m);
  const std::vector<double> values =
      summands(expected_layout(info, mv.axis_count()), dims_of<X>(), e, r, mv);
  typename X::storage_type local(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) local[i] = from_double<T>(values[i]);
  return X(m, e, std::move(local));
}

// ---------------------------------------------------------------------------------------
// The checks of one tensor.

enum class blocks_known : std::uint8_t {
  values,    // every rank's block values follow from the layout (no partial summands, or
             // the value on coordinate 0 of the partial axes and zeros elsewhere)
  sums_only  // partial summands are arbitrary: only their sum (to_global) is checked
};

// What check_tensor reads of a tensor, as plain data.
struct tensor_data {
  std::string dims;
  std::string printed;  // layout_string<X>()
  std::vector<std::size_t> extents;
  std::vector<std::size_t> offsets;        // local_offsets()
  std::vector<std::size_t> local_extents;  // local_extents()
  std::vector<double> local;               // local_to_host()
  std::vector<double> global;              // to_global()
  std::size_t local_count = 0;
  std::size_t size = 0;
  bool has_norm = false;  // layouts without partial axes, floating-point elements
  double norm = 0;        // global_norm(mesh, t)
};

// (c): blocks and values of one tensor against the reference. Every rank must call it (one
// all-reduce on MPI_COMM_WORLD).
inline void check_values(const type_info& info, const mesh_view& m, const tensor_data& t,
                         const reference& r, double rel, blocks_known known) {
  const zest::layout_value want = expected_layout(info, m.axis_count());
  const std::size_t rank = t.dims.size();
  bool values_ok = true;
  auto value_check = [&](bool good, auto&& what) {
    ++state().checks;
    if (good) return;
    values_ok = false;
    const std::span<const std::string_view> names(m.names);
    fail(std::string(info.name) + " (expected layout " +
             (info.expected != nullptr ? info.expected : zest::to_string(want, names)) +
             ", layout_string<X>() \"" + t.printed + "\"): " + what(),
         failure_kind::value);
  };

  // This rank's block: offsets and extents.
  const local_blocks b = blocks_of(want, t.dims, t.extents, m);
  bool geometry_ok = true;
  for (std::size_t k = 0; k < rank; ++k) {
    const bool good = t.offsets[k] == b.blocks[k].offset && t.local_extents[k] == b.blocks[k].size;
    geometry_ok = geometry_ok && good;
    value_check(good, [&] {
      return "rank " + std::to_string(m.rank) + " holds dim '" + std::string(1, t.dims[k]) + "' [" +
             std::to_string(t.offsets[k]) + ", +" + std::to_string(t.local_extents[k]) +
             "), the layout gives [" + std::to_string(b.blocks[k].offset) + ", +" +
             std::to_string(b.blocks[k].size) + ")";
    });
  }

  // This rank's block values, where the layout determines them.
  if (geometry_ok && t.local.size() == b.count &&
      (known == blocks_known::values || !want.any_partial())) {
    const bool holds_value = on_coordinate_zero_of_partial_axes(want, m);
    std::size_t wrong = 0;
    std::size_t first_wrong = 0;
    std::vector<std::size_t> i;
    for (std::size_t flat = 0; flat < t.local.size(); ++flat) {
      const std::size_t g = global_index(b, t.extents, flat, i);
      const double want_v = holds_value ? r.values[g] : 0.0;
      const double mag = holds_value ? r.magnitude[g] : 0.0;
      if (!close(t.local[flat], want_v, mag, rel)) {
        if (wrong++ == 0) first_wrong = flat;
      }
    }
    value_check(wrong == 0, [&] {
      return "rank " + std::to_string(m.rank) + ": " + std::to_string(wrong) + " of " +
             std::to_string(t.local.size()) +
             " local values differ from the reference (first at local index " +
             std::to_string(first_wrong) + ": " + std::to_string(t.local[first_wrong]) + ")";
    });
  }

  // Every rank: the whole tensor against the reference (to_global sums partial axes).
  {
    std::size_t wrong = 0;
    std::size_t first_wrong = 0;
    const bool sized = t.global.size() == r.values.size();
    for (std::size_t g = 0; sized && g < t.global.size(); ++g) {
      if (!close(t.global[g], r.values[g], r.magnitude[g], rel)) {
        if (wrong++ == 0) first_wrong = g;
      }
    }
    value_check(sized && wrong == 0, [&] {
      if (!sized) {
        return "to_global gives " + std::to_string(t.global.size()) + " elements, the reference " +
               std::to_string(r.values.size());
      }
      return "to_global: " + std::to_string(wrong) + " of " + std::to_string(t.global.size()) +
             " values differ from the reference (first at " + std::to_string(first_wrong) + ": " +
             std::to_string(t.global[first_wrong]) + ", want " +
             std::to_string(r.values[first_wrong]) + ")";
    });
  }

  // The blocks counted once (coordinate 0 of every axis that does not split the tensor)
  // tile the tensor: their sizes add up to its size.
  {
    bool counted = true;
    for (std::size_t a = 0; a < m.axis_count(); ++a) {
      if (want.axes[a].kind != zest::placement_kind::split && m.coords[a] != 0) counted = false;
    }
    long long mine = counted ? static_cast<long long>(t.local_count) : 0;
    long long sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    value_check(sum == static_cast<long long>(t.size), [&] {
      return "the blocks counted once hold " + std::to_string(sum) + " elements, the tensor has " +
             std::to_string(t.size);
    });
  }

  // global_norm counts every element once: the norm of the global values.
  if (t.has_norm) {
    double sq = 0;
    for (double v : t.global) sq += v * v;
    const double want_norm = std::sqrt(sq);
    value_check(std::abs(t.norm - want_norm) <= 1e-9 * (want_norm + 1), [&] {
      return "global_norm gives " + std::to_string(t.norm) + ", the global values' norm is " +
             std::to_string(want_norm);
    });
  }
  if (!values_ok) state().bad_value_types.insert(info.name);
}

template <class T, class Range>
std::vector<double> doubles(const Range& values) {
  std::vector<double> out;
  out.reserve(values.size());
  for (const auto& v : values) out.push_back(to_double<T>(v));
  return out;
}

// Every check of tensor t of type X (see the top of this file). Every rank must call it.
template <class X>
void check_tensor(const X& t, const type_info& info, const reference& r, double rel,
                  blocks_known known) {
  using T = typename X::value_type;
  const mesh_view m = view_of(t.mesh());
  tensor_data d;
  d.dims = dims_of<X>();
  d.printed = zest::layout_string<X>();
  check_layout(info, m, runtime_layout<X>(), d.printed);
  d.extents.assign(t.extents().begin(), t.extents().end());
  d.offsets.assign(t.local_offsets().begin(), t.local_offsets().end());
  d.local_extents.assign(t.local_extents().begin(), t.local_extents().end());
  d.local = doubles<T>(t.local_to_host());
  d.global = doubles<T>(zest::to_global(t));
  d.local_count = t.local_count();
  d.size = t.size();
  if constexpr (!X::layout.any_partial() && !std::is_integral_v<T>) {
    d.has_norm = true;
    d.norm = zest::global_norm(t.mesh(), t);
  }
  check_values(info, m, d, r, rel, known);
}

// ---------------------------------------------------------------------------------------
// Meshes and the program's frame.

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Whether a shape (one entry may be -1: the rest of the ranks) fits `world` ranks.
template <std::size_t N>
bool fits(const std::array<int, N>& shape, int world) {
  int known = 1;
  bool free_axis = false;
  for (int s : shape) {
    if (s == -1) {
      free_axis = true;
    } else {
      known *= s;
    }
  }
  return free_axis ? world % known == 0 : world == known;
}

// One mesh of type Mesh per shape that fits the world.
template <class Mesh, std::size_t N>
std::vector<std::unique_ptr<Mesh>> meshes(const std::vector<std::array<int, N>>& shapes) {
  std::vector<std::unique_ptr<Mesh>> out;
  for (const auto& s : shapes) {
    if (fits(s, world_size())) out.push_back(std::make_unique<Mesh>(MPI_COMM_WORLD, s));
  }
  return out;
}

// Runs a scenario on every mesh of its type. An exception is a failure (on the rank that
// threw it; a collective it skipped may then hang the others until CTest's timeout).
template <class Mesh, class Scenario>
void run(const char* name, const std::vector<std::unique_ptr<Mesh>>& ms, Scenario&& scenario) {
  for (const auto& m : ms) {
    state().scenario = name;
    state().mesh = m->describe();
    try {
      scenario(*m);
    } catch (const std::exception& e) {
      fail(std::string("threw: ") + e.what());
    }
  }
}

// Prints the summary line (rank 0) and the failures; returns the exit code (the same on
// every rank: 1 when any rank failed a check).
inline int finish(const char* program, const char* opt, std::size_t types, std::size_t plans,
                  std::size_t einsums) {
  auto& s = state();
  const int rank = world_rank();
  unsigned long long mine[5] = {s.failures, s.checks, s.bad_layout_types.size(),
                                s.bad_trailing_types.size(), s.bad_value_types.size()};
  unsigned long long sum[5] = {};
  unsigned long long most[5] = {};
  MPI_Allreduce(mine, sum, 5, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(mine, most, 5, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  unsigned long long rank0_failures = s.failures;
  MPI_Bcast(&rank0_failures, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  // Rank 0 reports its failures; another rank only when rank 0 saw none.
  if (s.failures != 0 && (rank == 0 || rank0_failures == 0)) {
    for (const auto& m : s.layout_messages)
      std::fprintf(stderr, "%s [rank %d]: FAIL %s\n", program, rank, m.c_str());
    for (const auto& m : s.value_messages)
      std::fprintf(stderr, "%s [rank %d]: FAIL %s\n", program, rank, m.c_str());
    const std::size_t shown = s.layout_messages.size() + s.value_messages.size();
    if (s.failures > shown)
      std::fprintf(stderr, "%s [rank %d]: ... and %zu more failures\n", program, rank,
                   s.failures - shown);
    for (const auto& t : s.bad_layout_types)
      std::fprintf(stderr, "%s [rank %d]: wrong layout at run time: %s\n", program, rank,
                   printable(t).c_str());
    for (const auto& t : s.bad_trailing_types)
      std::fprintf(stderr, "%s [rank %d]: wrong past the mesh's axes at run time: %s\n", program,
                   rank, printable(t).c_str());
    for (const auto& t : s.bad_value_types)
      std::fprintf(stderr, "%s [rank %d]: wrong values or blocks: %s\n", program, rank,
                   printable(t).c_str());
  }
  std::fflush(stderr);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf(
        "%s (%s, np %d): %zu tensor types, %zu transition plans, %zu einsums; %zu types checked; "
        "%llu checks, %llu failures; types with a wrong layout on a mesh axis: %llu, wrong only "
        "past the mesh's axes: %llu, wrong values or blocks: %llu (most on one rank): %s\n",
        program, opt, world_size(), types, plans, einsums, s.types_checked.size(), sum[1], sum[0],
        most[2], most[3], most[4], sum[0] == 0 ? "PASS" : "FAIL");
    std::fflush(stdout);
  }
  return sum[0] == 0 ? 0 : 1;
}

}  // namespace stress
