// zest::source_site names the caller of a function that takes it as a default argument, on
// every compiler: both std::source_location and the __builtin_FILE/__builtin_LINE fallback
// (which clang++ 14 with libstdc++ 12 uses) are checked here against the lines they are
// called from.
#include <doctest/doctest.h>

#include <string_view>

#include "zest/core/source_site.hpp"

namespace {

template <class Site>
Site called_from(Site where = Site::current()) {
  return where;
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

template <class Site>
void check_site() {
  const unsigned line = __LINE__ + 1;
  const Site where = called_from<Site>();
  CHECK(where.line() == line);
  CHECK(ends_with(where.file_name(), "source_site_test.cpp"));
  const Site other = called_from<Site>();
  CHECK(other.line() == line + 3);
  CHECK(Site{}.line() == 0);
}

}  // namespace

TEST_CASE("source_site: the caller's file and line") { check_site<zest::source_site>(); }

TEST_CASE("source_site: the builtin fallback names the caller too") {
  check_site<zest::detail::builtin_source_site>();
}

namespace {
// A public function as zest writes them: it opens a user_call with its caller's line.
zest::source_site public_call(int depth, zest::source_site at = zest::source_site::current()) {
  const zest::user_call user(at);
  if (depth > 0) return public_call(depth - 1);  // a public call made inside another
  return zest::user_call::or_else(zest::source_site::current());
}
}  // namespace

TEST_CASE("user_call: the outermost public call's line wins, and only while it runs") {
  CHECK(zest::user_call::current() == nullptr);
  const zest::source_site outside = zest::user_call::or_else(zest::source_site::current());
  CHECK(outside.line() == __LINE__ - 1);  // outside every call: the fallback
  const unsigned line = __LINE__ + 1;
  const zest::source_site inner = public_call(3);
  CHECK(inner.line() == line);
  CHECK(ends_with(inner.file_name(), "source_site_test.cpp"));
  CHECK(zest::user_call::current() == nullptr);  // closed again
}
