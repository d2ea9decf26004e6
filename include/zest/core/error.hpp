// zest/core/error.hpp — the exceptions zest throws at run time.
//
// Every message starts with "zest: <operation>:" and names the dims, axes, extents or ranks
// involved, so that a user can tell from the first line what went wrong and where.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace zest {

// Bad run-time input: extents that disagree, a mesh that does not fit the world, ...
class shape_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Ranks of one communicator disagree on the collective they call (checked mode).
class collective_mismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective did not finish within the watchdog's time (zest/comm/checked.hpp; in every
// mode, unless ZEST_WATCHDOG_MS=0). The message names the call, the axis, the element count,
// the caller's source location, the world ranks of the axis and which of them were heard
// waiting in the same call.
class collective_timeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Anything else that goes wrong in a communicator (an MPI error code, a bad argument).
class communicator_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A checkpoint cannot be written or read: an I/O error, a corrupt or truncated file, a
// checkpoint that does not match the model. Thrown on every rank of the collective.
class checkpoint_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
// The condition of a static_assert that fires only where its template is instantiated: false
// for any types (dependent on them, so an error class that is never used compiles). The one
// definition; each area's error namespace names it with a using-declaration.
template <class...>
inline constexpr bool always_false = false;

// The pieces written out, by their decayed types: one instantiation per sequence of types,
// whatever the lengths of the string literals among them.
template <class... Parts>
std::string message_of(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
// Builds a message from pieces: detail::message("einsum \"", spec, "\": dim '", d, "'").
// (A literal's type includes its length: passed on as such, every message with other
// wording would compile its own ostringstream code; bench/README.md, "Compile time and
// memory".)
template <class... Parts>
std::string message(const Parts&... parts) {
  return message_of<std::decay_t<const Parts&>...>(parts...);
}
}  // namespace detail

}  // namespace zest
