// zest/core/source_site.hpp — where in the user's code a call was made.
//
// `source_site` is std::source_location where the standard library provides it. Some
// compilers accepted by zest/config.hpp lack it with the library they ship with: clang++ 14
// with libstdc++ 12 has no __builtin_source_location, so <source_location> defines nothing.
// There the same interface is built on __builtin_FILE/__builtin_LINE, which name the
// outermost caller when used, as here, in a default argument.
#pragma once

#if __has_include(<source_location>)
#include <source_location>
#endif

namespace zest {

namespace detail {
// The fallback, defined everywhere so that its tests run on every compiler.
class builtin_source_site {
 public:
  constexpr builtin_source_site() noexcept = default;
  static constexpr builtin_source_site current(
      const char* file = __builtin_FILE(), unsigned line = __builtin_LINE(),
      const char* function = __builtin_FUNCTION()) noexcept {
    builtin_source_site site;
    site.file_ = file;
    site.line_ = line;
    site.function_ = function;
    return site;
  }
  [[nodiscard]] constexpr const char* file_name() const noexcept { return file_; }
  [[nodiscard]] constexpr const char* function_name() const noexcept { return function_; }
  [[nodiscard]] constexpr unsigned line() const noexcept { return line_; }
  [[nodiscard]] constexpr unsigned column() const noexcept { return 0; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  unsigned line_ = 0;
};
}  // namespace detail

#if defined(__cpp_lib_source_location) && __cpp_lib_source_location >= 201907L
using source_site = std::source_location;
#else
using source_site = detail::builtin_source_site;
#endif

// The user's line of the outermost public zest call this thread is in. A public function
// that issues collectives (einsum, redistribute, to_global, a layer's forward, backward,
// an optimizer step, ...) takes `source_site at = source_site::current()` and opens a
// `user_call` with it; the communicators name that line in their messages (schedule check,
// watchdog, checked mode) rather than the zest header that made the call. Scopes nest: the
// outermost wins, so a layer's einsums are reported at the line that called the layer. A
// user's own layer built from zest calls gets its own lines, which are the user's too.
class user_call {
 public:
  explicit user_call(const source_site& at) noexcept : at_(at) {
    if (outermost() == nullptr) {
      outermost() = &at_;
      owner_ = true;
    }
  }
  user_call(const user_call&) = delete;
  user_call& operator=(const user_call&) = delete;
  ~user_call() {
    if (owner_) outermost() = nullptr;
  }

  // The outermost open call's site, or null outside every public call.
  static const source_site* current() noexcept { return outermost(); }
  // That site, or `fallback` (the communicator's own caller) outside every public call.
  static source_site or_else(const source_site& fallback) noexcept {
    const source_site* at = outermost();
    return at != nullptr ? *at : fallback;
  }

 private:
  static const source_site*& outermost() noexcept {
    thread_local const source_site* site = nullptr;
    return site;
  }
  source_site at_;
  bool owner_ = false;
};

}  // namespace zest
