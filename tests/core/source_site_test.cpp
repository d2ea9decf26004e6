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
