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

}  // namespace zest
