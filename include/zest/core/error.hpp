// zest/core/error.hpp — the exceptions zest throws at run time.
//
// Every message starts with "zest: <operation>:" and names the dims, axes, extents or ranks
// involved, so that a user can tell from the first line what went wrong and where.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
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

// A collective did not finish within the watchdog's time (checked mode).
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
// Builds a message from pieces: detail::message("einsum \"", spec, "\": dim '", d, "'").
template <class... Parts>
std::string message(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

}  // namespace zest
