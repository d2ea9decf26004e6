// The collectives of a redistribution and of an einsum carry a collective_context: checked
// mode compares it across ranks and names it, with the layouts of the step and the einsum's
// spec, when the ranks' calls do not pair up (zest/comm/checked.hpp). Needs two ranks or more;
// at one rank it checks only that a lone call has no context left behind.
#include <doctest/doctest.h>
#include <mpi.h>

#include <string>

#include "comm/comm_checks.hpp"
#include "zest/zest.hpp"

namespace {

using namespace zest;
using mesh_t = mesh<"x">;
using rows_t = tensor<float, mesh_t, "bm", layout<split<'b', "x">>>;
using zest_test::contains;

}  // namespace

TEST_CASE("checked mode names the redistribution and the einsum behind mismatched calls") {
  const mesh_t m(MPI_COMM_WORLD, {-1});
  const std::size_t n = static_cast<std::size_t>(m.size(0));
  const auto a = rows_t::generate(m, {4 * n, 3}, [](auto i) { return float(i[0] + 10 * i[1]); });
  if (n < 2) {
    const auto whole = redistribute<layout<>>(a);
    CHECK(whole.local()[3 * 3 + 2] == doctest::Approx(3.0F + 20.0F));
    CHECK(collective_context::current() == nullptr);
    return;
  }
  REQUIRE(checked_mode().enabled);
  std::string what;
  try {
    if (m.rank() == 0) {
      (void)redistribute<layout<>>(a);  // an all-gather over x
    } else {
      (void)einsum<"bm->m", layout<>>(a);  // a local sum, then an all-reduce over x
    }
  } catch (const collective_mismatch& e) {
    what = e.what();
  }
  INFO(what);
  REQUIRE(!what.empty());
  CHECK(contains(what, "in redistribute \"bm\" split(b:x) -> replicate (all_gather over x)"));
  CHECK(contains(what, "in einsum \"bm->m\""));
  CHECK(collective_context::current() == nullptr);

  // The communicator is in step again: the same einsum everywhere gives the column sums.
  const auto sums = einsum<"bm->m", layout<>>(a);
  for (std::size_t j = 0; j < 3; ++j) {
    float want = 0;
    for (std::size_t b = 0; b < 4 * n; ++b) want += float(b + 10 * j);
    CHECK(sums.local()[j] == doctest::Approx(want));
  }
}
