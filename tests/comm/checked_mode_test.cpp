// Tests of checked mode: ranks that disagree on a collective all get collective_mismatch,
// quickly, with each rank's call in the message; a rank that skips a collective gives
// collective_timeout on the ranks that wait, and the communicator gets back in step once the
// late rank shows up. Runs at any number of ranks; the cases that need two ranks say so.
//
// Every case leaves all ranks in step (the same calls completed on every communicator), so a
// failing check cannot turn into a hang of the whole binary.
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "comm/comm_checks.hpp"
#include "zest/comm/mpi_communicator.hpp"

namespace {

using namespace zest_test;

// After a failed check, the communicator must still work on every rank.
void expect_in_step(zest::mpi_communicator& comm) {
  std::vector<int> one{1};
  comm.all_reduce(std::span<int>(one));
  CHECK(one[0] == comm.size());
}

}  // namespace

TEST_CASE("checked mode: different collectives throw collective_mismatch on every rank") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "mismatch");
  if (comm.size() < 2) return;  // one rank always agrees with itself
  comm.set_checked(true);
  const watchdog_scope watchdog(3s);
  const std::size_t n = comm.size();
  std::vector<float> full(1024), part(512 / n * n), shard(512 / n);
  const auto start = clock_type::now();
  const std::string what = message_of<zest::collective_mismatch>([&] {
    if (comm.rank() == 0) {
      comm.all_reduce(std::span<float>(full));
    } else {
      comm.all_gather(std::span<const float>(shard), std::span<float>(part));
    }
  });
  INFO(what);
  CHECK(what.rfind("zest: collective mismatch on axis 'mismatch'", 0) == 0);
  CHECK(contains(what, "rank 0: all_reduce<float>[1024] #0"));
  CHECK(contains(what, "rank 1: all_gather<float>[" + std::to_string(part.size()) + "] #0"));
  CHECK(contains(what, "rank " + std::to_string(n - 1) + ": all_gather<float>"));
  CHECK(seconds_since(start) < 3.0);  // found by the check, not by the watchdog
  // The failed call is not counted, and the next call finds everyone in step.
  CHECK(comm.stats().calls() == 0);
  expect_in_step(comm);
}

TEST_CASE("checked mode: different counts, types, reduce ops or roots are mismatches") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "details");
  if (comm.size() < 2) return;
  comm.set_checked(true);
  const watchdog_scope watchdog(3s);
  const std::size_t n = comm.size();
  const bool first = comm.rank() == 0;

  SUBCASE("equal chunks of different sizes") {
    const std::size_t chunk = first ? 1 : 2;
    std::vector<float> send(chunk), recv(chunk * n);
    const std::string what = message_of<zest::collective_mismatch>(
        [&] { comm.all_gather(std::span<const float>(send), std::span<float>(recv)); });
    INFO(what);
    CHECK(contains(what, "rank 0: all_gather<float>[" + std::to_string(n) + "] #0"));
    CHECK(contains(what, "rank 1: all_gather<float>[" + std::to_string(2 * n) + "] #0"));
  }
  SUBCASE("uneven counts with the same total") {
    std::vector<std::size_t> counts(n, 1);
    counts[0] = first ? 1 : 2;
    counts[1] = first ? 2 : 1;
    std::vector<float> send(counts[comm.rank()]), recv(n + 1);
    const std::string what = message_of<zest::collective_mismatch>(
        [&] { comm.all_gather(std::span<const float>(send), std::span<float>(recv), counts); });
    INFO(what);
    CHECK(contains(what, "rank 0: all_gather<float>[" + std::to_string(n + 1) + "] counts {1,2"));
    CHECK(contains(what, "rank 1: all_gather<float>[" + std::to_string(n + 1) + "] counts {2,1"));
  }
  SUBCASE("element types") {
    std::vector<float> f(8);
    std::vector<double> d(8);
    const std::string what = message_of<zest::collective_mismatch>([&] {
      if (first) comm.all_reduce(std::span<double>(d));
      else comm.all_reduce(std::span<float>(f));
    });
    INFO(what);
    CHECK(contains(what, "rank 0: all_reduce<double>[8] #0; rank 1: all_reduce<float>[8] #0"));
  }
  SUBCASE("reduce ops") {
    std::vector<float> f(8);
    const std::string what = message_of<zest::collective_mismatch>([&] {
      comm.all_reduce(std::span<float>(f), first ? zest::reduce_op::max : zest::reduce_op::sum);
    });
    INFO(what);
    CHECK(contains(what, "rank 0: all_reduce<float>[8] max #0; rank 1: all_reduce<float>[8] #0"));
  }
  SUBCASE("broadcast roots") {
    std::vector<float> f(8);
    const std::string what = message_of<zest::collective_mismatch>(
        [&] { comm.broadcast(std::span<float>(f), first ? 1 : 0); });
    INFO(what);
    CHECK(contains(what,
                   "rank 0: broadcast<float>[8] root 1 #0; rank 1: broadcast<float>[8] root 0 #0"));
  }
  SUBCASE("barrier against a collective") {
    std::vector<float> f(8);
    const std::string what = message_of<zest::collective_mismatch>([&] {
      if (first) comm.barrier();
      else comm.all_reduce(std::span<float>(f));
    });
    INFO(what);
    CHECK(contains(what, "rank 0: barrier #0; rank 1: all_reduce<float>[8] #0"));
  }
  SUBCASE("non-blocking: the mismatch comes out of wait()") {
    std::vector<float> full(8), shard(8), gathered(8 * n);
    zest::request r =
        first ? comm.iall_reduce(std::span<float>(full))
              : comm.iall_gather(std::span<const float>(shard), std::span<float>(gathered));
    const std::string what = message_of<zest::collective_mismatch>([&] { r.wait(); });
    INFO(what);
    CHECK(contains(what, "rank 0: all_reduce<float>[8] #0; rank 1: all_gather<float>"));
    // Waiting again reports the same error rather than pretending success.
    CHECK_THROWS_AS(r.wait(), zest::collective_mismatch);
  }
  expect_in_step(comm);
}

TEST_CASE("checked mode: all_to_all counts that do not pair up") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "pairs");
  if (comm.size() < 2) return;
  comm.set_checked(true);
  const watchdog_scope watchdog(3s);
  const std::size_t n = comm.size();
  // Everyone sends one element to everyone, but rank 0 expects two from rank 1, none from itself.
  std::vector<std::size_t> send_counts(n, 1), recv_counts(n, 1);
  if (comm.rank() == 0) {
    recv_counts[0] = 0;
    recv_counts[1] = 2;
  }
  std::vector<float> send(n), recv(n);
  const std::string what = message_of<zest::collective_mismatch>([&] {
    comm.all_to_all(std::span<const float>(send), send_counts, std::span<float>(recv), recv_counts);
  });
  INFO(what);
  CHECK(what.rfind("zest: collective mismatch on axis 'pairs'", 0) == 0);
  CHECK(contains(what, "rank 0 expects 0 elements from rank 0, which sends it 1"));
  CHECK(contains(what, "rank 0 expects 2 elements from rank 1, which sends it 1"));
  expect_in_step(comm);
}

TEST_CASE("checked mode: one rank with wrong buffer sizes stops every rank") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "one_bad");
  if (comm.size() < 2) return;
  comm.set_checked(true);
  const watchdog_scope watchdog(3s);
  const std::size_t n = comm.size();
  std::vector<float> send(4), recv(comm.rank() == 0 ? 4 * n - 1 : 4 * n);
  const auto call = [&] { comm.all_gather(std::span<const float>(send), std::span<float>(recv)); };
  if (comm.rank() == 0) {
    const std::string what = message_of<zest::communicator_error>(call);
    INFO(what);
    CHECK(contains(what, "recv buffer has " + std::to_string(4 * n - 1) + " elements"));
  } else {
    const std::string what = message_of<zest::collective_mismatch>(call);
    INFO(what);
    CHECK(contains(what, "rank 0: all_gather<float>[" + std::to_string(4 * n - 1) +
                             "] #0 (its buffer sizes are wrong)"));
  }
  expect_in_step(comm);
}

TEST_CASE("checked mode: a rank that skips a collective gives collective_timeout") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "skip");
  if (comm.size() < 2) return;
  comm.set_checked(true);
  const watchdog_scope watchdog(2s);
  const std::size_t n = comm.size();
  const int late = comm.size() - 1;
  const bool waiting = comm.rank() != late;
  std::vector<float> data(16, 1.0F);

  SUBCASE("non-blocking: waiting again after the timeout completes the call") {
    zest::request r;
    if (waiting) {
      r = comm.iall_reduce(std::span<float>(data));
      const auto start = clock_type::now();
      const std::string what = message_of<zest::collective_timeout>([&] { r.wait(); });
      const double waited = seconds_since(start);
      INFO(what);
      CHECK(what.rfind("zest: collective timeout on axis 'skip'", 0) == 0);
      CHECK(contains(what, "all_reduce<float>[16] #0"));
      CHECK(contains(what, "rank " + std::to_string(comm.rank()) + " of " + std::to_string(n)));
      CHECK(contains(what, " s "));
      CHECK(waited >= 1.9);
      CHECK(waited < 10.0);
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the late rank arrives only after everyone else timed out
    if (waiting) {
      r.wait();
    } else {
      comm.all_reduce(std::span<float>(data));
    }
    CHECK(data[0] == static_cast<float>(n));
    CHECK(data[15] == static_cast<float>(n));
  }
  SUBCASE("blocking: the late rank's different call resolves it, then all is in step") {
    if (waiting) {
      const std::string what =
          message_of<zest::collective_timeout>([&] { comm.all_reduce(std::span<float>(data)); });
      INFO(what);
      CHECK(contains(what, "all_reduce<float>[16] #0 on rank " + std::to_string(comm.rank())));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (!waiting) {
      // The late rank comes with a barrier: the abandoned all_reduce is then a mismatch on
      // every rank, so no data moves for it and call #1 lines up everywhere.
      const std::string what = message_of<zest::collective_mismatch>([&] { comm.barrier(); });
      INFO(what);
      CHECK(contains(what, "rank 0: all_reduce<float>[16] #0"));
      CHECK(contains(what, "rank " + std::to_string(late) + ": barrier #0"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    expect_in_step(comm);
  }
}

TEST_CASE("checked mode: off means no check (the per-communicator switch wins)") {
  const bool saved = zest::checked_mode().enabled;
  zest::mpi_communicator comm(MPI_COMM_WORLD, "switch");
  zest::set_checked_mode(true);
  comm.set_checked(false);
  CHECK_FALSE(comm.checked());
  zest::set_checked_mode(false);
  comm.set_checked(std::nullopt);
  CHECK_FALSE(comm.checked());
  comm.set_checked(true);
  CHECK(comm.checked());
  // Switching between calls keeps the order of data transfers: a checked non-blocking call,
  // then an unchecked blocking one, then the first is waited.
  std::vector<int> a{1}, b{1};
  auto r = comm.iall_reduce(std::span<int>(a));
  comm.set_checked(false);
  comm.all_reduce(std::span<int>(b));
  r.wait();
  CHECK(a[0] == comm.size());
  CHECK(b[0] == comm.size());
  zest::set_checked_mode(saved);
}
