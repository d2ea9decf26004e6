// The collectives of a redistribution and of an einsum carry a collective_context: checked
// mode compares it across ranks and names it, with the layouts of the step and the einsum's
// spec, when the ranks' calls do not pair up (zest/comm/checked.hpp). Needs two ranks or more;
// at one rank it checks only that a lone call has no context left behind.
//
// The messages name the user's line: the line that called the public function (einsum,
// redistribute, to_global, a layer's forward, backward, the optimizer step), never the zest
// header that issued the collective (zest::user_call, zest/core/source_site.hpp).
#include <doctest/doctest.h>
#include <mpi.h>

#include <string>
#include <vector>

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

namespace {

// Runs `call` (which must throw collective_mismatch on every rank); returns the message and
// every rank's `line`, the line it made its public call from.
template <class Call>
std::pair<std::string, std::vector<int>> mismatch_at(Call call) {
  int line = 0;
  std::string what;
  try {
    call(line);
  } catch (const collective_mismatch& e) {
    what = e.what();
  }
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> lines(static_cast<std::size_t>(size));
  MPI_Allgather(&line, 1, MPI_INT, lines.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return {what, lines};
}

const std::string here = "einsum/collective_context_test.cpp:";

bool names_line(const std::string& what, int line) {
  return contains(what, "at " + here + std::to_string(line) + " ");
}

}  // namespace

TEST_CASE("a mismatch names the user's lines, not zest's headers") {
  const mesh_t m(MPI_COMM_WORLD, {-1});
  const std::size_t n = static_cast<std::size_t>(m.size(0));
  if (n < 2) return;
  REQUIRE(checked_mode().enabled);
  const bool first = m.rank() == 0;
  const auto a = rows_t::generate(m, {4 * n, 3}, [](auto i) { return float(i[0] - i[1]); });
  const auto b = rows_t::generate(m, {2 * n, 3}, [](auto i) { return float(i[0] + i[1]); });

  SUBCASE("redistribute against einsum") {
    const auto [what, lines] = mismatch_at([&](int& line) {
      if (first) {
        line = __LINE__ + 1;
        (void)redistribute<layout<>>(a);
      } else {
        line = __LINE__ + 1;
        (void)einsum<"bm->m", layout<>>(a);
      }
    });
    INFO(what);
    CHECK(names_line(what, lines[0]));
    CHECK(names_line(what, lines[1]));
    CHECK(!contains(what, ".hpp:"));
  }
  SUBCASE("to_global of tensors of other extents") {
    const auto [what, lines] = mismatch_at([&](int& line) {
      if (first) {
        line = __LINE__ + 1;
        (void)to_global(a);
      } else {
        line = __LINE__ + 1;
        (void)to_global(b);
      }
    });
    INFO(what);
    CHECK(names_line(what, lines[0]));
    CHECK(names_line(what, lines[1]));
    CHECK(!contains(what, ".hpp:"));
  }
  SUBCASE("autodiff's redistribute") {
    const auto [what, lines] = mismatch_at([&](int& line) {
      autodiff::tape t;
      const auto x = t.parameter(first ? a : b);
      line = __LINE__ + 1;
      (void)autodiff::redistribute<layout<>>(x);
    });
    INFO(what);
    CHECK(names_line(what, lines[0]));
    CHECK(!contains(what, ".hpp:"));
  }
  SUBCASE("a layer's forward: zest::linear, row-parallel, its product reduced over tp") {
    using grid = zest::mesh<"dp", "tp">;
    using policy = training_policy<grid, zero_stage<0>, float>;
    using on_tp = layout<split<'m', "tp">>;
    using in_t = tensor<float, grid, "bm", on_tp>;
    const grid g(MPI_COMM_WORLD, {1, -1});
    zero_engine<policy> engine(g, {.seed = 3});
    const linear<policy, "bm,mh->bh", "mh", "", on_tp> fc(engine, "fc", {2 * n, 5});
    // Other batch sizes on rank 0 and elsewhere: the reductions' sizes differ.
    const auto x =
        in_t::generate(g, {first ? 3U : 4U, 2 * n}, [](auto i) { return float(i[0] + i[1]); });
    const auto [what, lines] = mismatch_at([&](int& line) {
      autodiff::tape t;
      const auto in_scope = engine.use(t, engine.group_of(fc.weight()));
      const auto v = t.constant(x);
      line = __LINE__ + 1;
      (void)fc.into<layout<>>(v);
    });
    INFO(what);
    CHECK(names_line(what, lines[0]));
    CHECK(!contains(what, ".hpp:"));
  }
  // In step at the end: every rank the same call.
  const auto sums = einsum<"bm->m", layout<>>(a);
  CHECK(sums.local().size() == 3);
}
