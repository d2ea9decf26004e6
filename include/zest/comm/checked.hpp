// zest/comm/checked.hpp — the watchdog, checked mode, and the context of a collective call.
//
// The watchdog (always on): every wait on an MPI collective has a deadline. A collective
// still unfinished after checked_mode().watchdog throws collective_timeout on every rank
// that waits for it, naming the call, the axis, the element count and the ranks, instead of
// hanging. Default 300 s (ZEST_WATCHDOG_MS or set_watchdog() change it); 0 means no
// deadline: collectives are then the blocking MPI calls themselves and may wait forever.
//
// Checked mode (opt-in: set_checked_mode(true) or ZEST_CHECKED=1): every collective is
// preceded by a small exchange in which the ranks of the communicator compare what they are
// about to call (kind, axis, element type, counts, the caller's context). A disagreement
// throws collective_mismatch on every rank, naming each rank's call and where it was made.
//
// A caller that issues collectives on behalf of a higher-level operation (a redistribution,
// an einsum) says so with a collective_context: checked mode compares and reports it.
//
//   zest::collective_context ctx("redistribute", [&](std::ostream& o) { o << from << " -> " << to; });
//
// The description is only formatted in checked mode (or for a message): outside it a
// context costs two pointer stores.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace zest {

struct checked_mode_settings {
  bool enabled = false;
  // The deadline of every wait on a collective; zero: none (wait forever).
  std::chrono::milliseconds watchdog{300000};
};

namespace detail {
// A non-negative number of milliseconds, or an error naming the variable.
inline std::chrono::milliseconds parse_watchdog_ms(const char* text) {
  errno = 0;
  char* end = nullptr;
  const long long ms = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || ms < 0) {
    throw std::invalid_argument(std::string("zest: ZEST_WATCHDOG_MS='") + text +
                                "' is not a number of milliseconds >= 0 (0: no deadline)");
  }
  return std::chrono::milliseconds(ms);
}
}  // namespace detail

inline checked_mode_settings& checked_mode() {
  static checked_mode_settings settings = [] {
    checked_mode_settings s;
    if (const char* on = std::getenv("ZEST_CHECKED")) s.enabled = std::string(on) != "0";
    if (const char* ms = std::getenv("ZEST_WATCHDOG_MS"))
      s.watchdog = detail::parse_watchdog_ms(ms);
    return s;
  }();
  return settings;
}

inline void set_checked_mode(bool enabled) { checked_mode().enabled = enabled; }
// Zero: no deadline. Negative values are rejected.
inline void set_watchdog(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) {
    throw std::invalid_argument("zest: set_watchdog: a negative timeout (" +
                                std::to_string(timeout.count()) + " ms); 0 means no deadline");
  }
  checked_mode().watchdog = timeout;
}

// What a thread is doing while it issues collectives: "redistribute", "einsum", ... plus a
// description written on demand. Scopes nest; the innermost one describes the call, with
// the outer ones after it ("redistribute ... in einsum ...").
class collective_context {
 public:
  using describe_fn = std::function<void(std::ostream&)>;

  explicit collective_context(std::string_view what, describe_fn describe = {})
      : what_(what), describe_(std::move(describe)), outer_(innermost()) {
    innermost() = this;
  }
  collective_context(const collective_context&) = delete;
  collective_context& operator=(const collective_context&) = delete;
  ~collective_context() { innermost() = outer_; }

  // The innermost scope of this thread, or null.
  static const collective_context* current() { return innermost(); }
  // This scope's own name ("einsum", "redistribute", ...), without its description.
  std::string_view what() const { return what_; }

  // "redistribute <from> -> <to> in einsum \"ij,jk->ik\"": every scope, innermost first.
  std::string text() const {
    std::ostringstream out;
    for (const collective_context* c = this; c != nullptr; c = c->outer_) {
      if (c != this) out << " in ";
      out << c->what_;
      if (c->describe_) {
        out << ' ';
        c->describe_(out);
      }
    }
    return out.str();
  }

 private:
  static const collective_context*& innermost() {
    thread_local const collective_context* top = nullptr;
    return top;
  }
  std::string_view what_;
  describe_fn describe_;
  const collective_context* outer_;
};

}  // namespace zest
