// The always-on schedule check (issue 24): outside checked mode, ranks that issued different
// collectives of the same size (which MPI lets through, with wrong data) learn it at the next
// check_schedule, every one of them with collective_mismatch naming the first call that
// differs on each rank. Runs at any number of ranks; one rank always agrees with itself.
//
// Every case leaves the ranks in step on the data communicator (each issued as many calls),
// so a failing check cannot hang the binary.
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "comm/comm_checks.hpp"
#include "zest/comm/mpi_communicator.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace {

using namespace zest_test;

// Default mode (the MPI tests' main turns checked mode on for every communicator).
zest::mpi_communicator unchecked(const char* name) {
  zest::mpi_communicator comm(MPI_COMM_WORLD, name);
  comm.set_checked(false);
  return comm;
}

}  // namespace

TEST_CASE("schedule check: the same collectives on every rank pass") {
  auto comm = unchecked("same");
  std::vector<float> v(64, 1.0F);
  std::vector<float> shard(8), full(8 * static_cast<std::size_t>(comm.size()));
  for (int i = 0; i < 50; ++i) {
    comm.all_reduce(std::span<float>(v));
    comm.all_gather(std::span<const float>(shard), std::span<float>(full));
  }
  comm.check_schedule("after 100 calls");
  CHECK(comm.stats().calls() == 100);  // the check itself is not a counted collective
  comm.check_schedule("again");        // nothing since: still equal
}

TEST_CASE("schedule check: a reduction of another op, same size, is named with both calls") {
  auto comm = unchecked("ops");
  if (comm.size() < 2) return;
  const watchdog_scope watchdog(std::chrono::seconds(20));
  std::vector<double> v(16, 1.0);
  comm.all_reduce(std::span<double>(v));  // call #0: agreed
  // Call #1: rank 0 takes the maximum, the others the sum; MPI returns on every rank.
  comm.all_reduce(std::span<double>(v),
                  comm.rank() == 0 ? zest::reduce_op::max : zest::reduce_op::sum);
  comm.all_reduce(std::span<double>(v));  // call #2: agreed again
  const std::string what =
      message_of<zest::collective_mismatch>([&] { comm.check_schedule("the test's step 7"); });
  INFO(what);
  CHECK(what.rfind("zest: collective mismatch on axis 'ops' found by check_schedule at the "
                   "test's step 7",
                   0) == 0);
  CHECK(contains(what, "the first that differs is call #1"));
  CHECK(contains(what, "rank 0: all_reduce<double>[16] max #1 at comm/schedule_check_test.cpp:"));
  CHECK(contains(what, "rank 1: all_reduce<double>[16] #1 at comm/schedule_check_test.cpp:"));
}

TEST_CASE(
    "schedule check: redistributions of the same bytes, an all-gather against a reduce-scatter") {
  // The case as a user meets it: rank 0 gathers a split tensor, the others reduce-scatter a
  // partial one; each sends and receives as many bytes (two ranks), and both calls return.
  zest::mesh<"dp"> mesh(MPI_COMM_WORLD, {-1});
  if (mesh.world_size() != 2) return;
  mesh.axis(0).set_checked(false);
  mesh.world().set_checked(false);
  const watchdog_scope watchdog(std::chrono::seconds(20));
  using split_t = zest::tensor<float, zest::mesh<"dp">, "a", zest::layout<zest::split<'a', "dp">>>;
  using partial_t = zest::tensor<float, zest::mesh<"dp">, "a", zest::layout<zest::partial<"dp">>>;
  const std::string what = message_of<zest::collective_mismatch>([&] {
    if (mesh.rank() == 0) {
      const auto x = split_t::generate(mesh, {64}, [](const auto& i) { return float(i[0]); });
      (void)zest::redistribute<zest::layout<>>(x);
    } else {
      const auto x = partial_t::generate(mesh, {64}, [](const auto& i) { return float(i[0]); });
      (void)zest::redistribute<zest::layout<zest::split<'a', "dp">>>(x);
    }
    zest::check_schedule(mesh, "step 3");
  });
  INFO(what);
  CHECK(contains(what, "on axis 'dp' found by check_schedule at step 3"));
  CHECK(contains(what, "the first that differs is call #0"));
  CHECK(contains(what, "rank 0: all_gather<float>[64] #0 at comm/schedule_check_test.cpp:"));
  CHECK(contains(what, "rank 1: reduce_scatter<float>[64] #0 at comm/schedule_check_test.cpp:"));
  CHECK(contains(what, "in redistribute"));
  CHECK(!contains(what, ".hpp:"));  // the user's lines, not zest's
}

TEST_CASE("schedule check: a difference older than the calls a rank remembers") {
  auto comm = unchecked("old");
  if (comm.size() < 2) return;
  const watchdog_scope watchdog(std::chrono::seconds(20));
  std::vector<int> v(4, 1);
  comm.all_reduce(std::span<int>(v),
                  comm.rank() == 0 ? zest::reduce_op::min : zest::reduce_op::sum);
  for (int i = 0; i < 40; ++i) comm.all_reduce(std::span<int>(v));
  const std::string what = message_of<zest::collective_mismatch>([&] { comm.check_schedule(); });
  INFO(what);
  CHECK(contains(what,
                 "the last 32 calls of every rank agree, so the first difference is before "
                 "call #9"));
}

TEST_CASE("schedule check: checked mode's agreed calls enter the record, a refused one does not") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "checked");
  comm.set_checked(true);
  if (comm.size() < 2) return;
  const watchdog_scope watchdog(std::chrono::seconds(20));
  std::vector<float> v(8, 1.0F);
  comm.all_reduce(std::span<float>(v));
  // Refused before any data moves, on every rank: the schedules stay equal.
  (void)message_of<zest::collective_mismatch>([&] {
    comm.all_reduce(std::span<float>(v),
                    comm.rank() == 0 ? zest::reduce_op::max : zest::reduce_op::sum);
  });
  comm.all_reduce(std::span<float>(v));
  comm.check_schedule("after a refused call");
}
