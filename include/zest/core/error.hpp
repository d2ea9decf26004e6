// zest/core/error.hpp — the exceptions zest throws at run time.
//
// Every message starts with "zest: <operation>:" and names the dims, axes, extents or ranks
// involved, so that a user can tell from the first line what went wrong and where.
#pragma once

#include <initializer_list>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
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

// One piece of a message, whatever its type: text, an integer or a floating-point number
// held by value, anything else written through operator<< by a small function of its type.
// The pieces are written by one function (join_message) for every message of the program,
// not one ostringstream sequence per combination of types (bench/README.md, "Compile time
// and memory"). Each piece prints as `out << piece` would.
class message_piece {
 public:
  template <class T>
  message_piece(const T& x) {  // NOLINT: every piece converts implicitly
    if constexpr (std::is_convertible_v<const T&, std::string_view>) {
      kind_ = kind::text;
      text_ = std::string_view(x);
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                         !std::is_same_v<T, char> && !std::is_same_v<T, signed char> &&
                         !std::is_same_v<T, unsigned char> && std::is_signed_v<T>) {
      kind_ = kind::signed_integer;
      signed_ = static_cast<long long>(x);
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                         !std::is_same_v<T, char> && !std::is_same_v<T, signed char> &&
                         !std::is_same_v<T, unsigned char>) {
      kind_ = kind::unsigned_integer;
      unsigned_ = static_cast<unsigned long long>(x);
    } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      kind_ = kind::floating;
      floating_ = static_cast<double>(x);  // exact; printed as the float would be
    } else {
      kind_ = kind::other;
      other_ = {&x, [](std::ostream& out, const void* p) { out << *static_cast<const T*>(p); }};
    }
  }

  void write(std::ostream& out) const {
    switch (kind_) {
      case kind::text: out << text_; break;
      case kind::signed_integer: out << signed_; break;
      case kind::unsigned_integer: out << unsigned_; break;
      case kind::floating: out << floating_; break;
      case kind::other: other_.write(out, other_.object); break;
    }
  }

 private:
  enum class kind : unsigned char { text, signed_integer, unsigned_integer, floating, other };
  struct written {
    const void* object;
    void (*write)(std::ostream&, const void*);
  };
  kind kind_;
  union {
    std::string_view text_;
    long long signed_;
    unsigned long long unsigned_;
    double floating_;
    written other_;
  };
};

inline std::string join_message(std::initializer_list<message_piece> pieces) {
  std::ostringstream out;
  for (const message_piece& p : pieces) p.write(out);
  return out.str();
}

// Builds a message from pieces: detail::message("einsum \"", spec, "\": dim '", d, "'").
template <class... Parts>
std::string message(const Parts&... parts) {
  return join_message({message_piece(parts)...});
}
}  // namespace detail

}  // namespace zest
