// Tests of the watchdog outside checked mode (every wait on a collective has a deadline) and
// of what checked mode adds to its fingerprint: the caller's source location and
// collective_context. The cases that need two ranks say so and return at one.
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/comm_checks.hpp"
#include "zest/comm/mpi_communicator.hpp"

namespace {

using namespace zest_test;

// A buffer that an abandoned MPI request may still write into: it must outlive the test.
std::vector<float>& lasting_buffer(std::size_t n, float value) {
  return *new std::vector<float>(n, value);  // NOLINT: leaked on purpose
}

const std::string here = "comm/watchdog_test.cpp:";

}  // namespace

TEST_CASE("watchdog: unchecked, a rank that skips a collective makes every other rank throw") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "skip");
  if (comm.size() < 2) return;
  comm.set_checked(false);
  const watchdog_scope watchdog(1500ms);
  const int n = comm.size();
  const int late = n - 1;
  const bool waiting = comm.rank() != late;
  std::vector<float>& data = lasting_buffer(16, 1.0F);

  const auto check_timeout = [&](const std::string& what, int line, double waited) {
    INFO(what);
    CHECK(what.rfind("zest: collective timeout on axis 'skip': all_reduce<float>[16] #0 on rank " +
                         std::to_string(comm.rank()) + " of " + std::to_string(n) +
                         " not complete after ",
                     0) == 0);
    CHECK(contains(what, "called at " + here + std::to_string(line)));
    CHECK(contains(what, "the axis spans world ranks 0-" + std::to_string(late)));
    CHECK(contains(what, "no word from ranks " + std::to_string(late) + " of the axis"));
    CHECK(contains(what, "ZEST_WATCHDOG_MS sets the deadline (now 1500 ms; 0: none)"));
    CHECK(waited >= 1.45);
    CHECK(waited < 1.5 + 1.0 + 5.0);  // the deadline, the listening for reports, slack
  };

  SUBCASE("blocking") {
    MPI_Barrier(MPI_COMM_WORLD);
    if (waiting) {
      const auto start = clock_type::now();
      int line = 0;
      const std::string what = message_of<zest::collective_timeout>([&] {
        line = __LINE__ + 1;
        comm.all_reduce(std::span<float>(data));
      });
      check_timeout(what, line, seconds_since(start));
      // The calls no longer line up: the communicator refuses further work, at once.
      std::vector<float> more(4);
      const std::string refused =
          message_of<zest::communicator_error>([&] { comm.all_reduce(std::span<float>(more)); });
      INFO(refused);
      CHECK(contains(refused, "the communicator is unusable: all_reduce<float>[16] #0"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // The late rank's call still meets the others' abandoned one: the sum of every rank's 1.
    if (!waiting) {
      comm.all_reduce(std::span<float>(data));
      CHECK(data[0] == static_cast<float>(n));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  SUBCASE("non-blocking: the timeout comes out of wait()") {
    MPI_Barrier(MPI_COMM_WORLD);
    if (waiting) {
      int line = __LINE__ + 1;
      zest::request r = comm.iall_reduce(std::span<float>(data));
      const auto start = clock_type::now();
      const std::string what = message_of<zest::collective_timeout>([&] { r.wait(); });
      check_timeout(what, line, seconds_since(start));
      // Waiting again does not wait another deadline: the communicator is unusable.
      const auto again = clock_type::now();
      CHECK_THROWS_AS(r.wait(), zest::communicator_error);
      CHECK(seconds_since(again) < 1.0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (!waiting) comm.all_reduce(std::span<float>(data));
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("watchdog: 0 means no deadline; bad settings are refused") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "zero");
  comm.set_checked(false);
  {
    const watchdog_scope watchdog(0ms);
    std::vector<int> one{1};
    comm.all_reduce(std::span<int>(one));  // MPI's blocking call
    CHECK(one[0] == comm.size());
    zest::request r = comm.iall_reduce(std::span<int>(one));
    r.wait();
    CHECK(one[0] == comm.size() * comm.size());
  }
  CHECK_THROWS_AS(zest::set_watchdog(-1ms), std::invalid_argument);
  CHECK(zest::detail::parse_watchdog_ms("0") == 0ms);
  CHECK(zest::detail::parse_watchdog_ms("2500") == 2500ms);
  for (const char* bad : {"", "abc", "10s", "-5", "1e3"}) {
    const std::string what =
        message_of<std::invalid_argument>([&] { zest::detail::parse_watchdog_ms(bad); });
    INFO(bad);
    CHECK(contains(what, "ZEST_WATCHDOG_MS='" + std::string(bad) + "' is not a number"));
  }
}

TEST_CASE("watchdog: a completed call is not slowed into a timeout") {
  // Many small calls with a deadline much shorter than the test: none may time out.
  zest::mpi_communicator comm(MPI_COMM_WORLD, "quick");
  comm.set_checked(false);
  const watchdog_scope watchdog(5000ms);
  std::vector<double> x(256);
  for (int i = 0; i < 200; ++i) {
    std::fill(x.begin(), x.end(), 1.0);
    comm.all_reduce(std::span<double>(x));
    REQUIRE(x[255] == static_cast<double>(comm.size()));
  }
}

TEST_CASE("checked mode: a mismatch names both call sites and their contexts") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "sites");
  if (comm.size() < 2) return;
  comm.set_checked(true);
  const watchdog_scope watchdog(3000ms);
  const std::size_t n = comm.size();
  const bool first = comm.rank() == 0;

  SUBCASE("all_gather of 8x4 on rank 0, 6x4 elsewhere (finding 4)") {
    std::vector<float> send(first ? 32 : 24), recv(send.size() * n);
    int line = 0;
    const std::string what = message_of<zest::collective_mismatch>([&] {
      const zest::collective_context context("redistribute", [&](std::ostream& out) {
        out << (first ? "8x4" : "6x4") << " S(0)@sites -> R";
      });
      if (first) {
        line = __LINE__ + 1;
        comm.all_gather(std::span<const float>(send), std::span<float>(recv));
      } else {
        line = __LINE__ + 1;
        comm.all_gather(std::span<const float>(send), std::span<float>(recv));
      }
    });
    INFO(what);
    std::vector<int> lines(n);
    MPI_Allgather(&line, 1, MPI_INT, lines.data(), 1, MPI_INT, MPI_COMM_WORLD);
    CHECK(contains(what, "rank 0: all_gather<float>[" + std::to_string(32 * n) + "] #0"));
    CHECK(contains(what, "rank 1: all_gather<float>[" + std::to_string(24 * n) + "] #0"));
    CHECK(contains(what, "rank 0: at " + here + std::to_string(lines[0]) +
                             " in redistribute 8x4 S(0)@sites -> R"));
    CHECK(contains(
        what, "at " + here + std::to_string(lines[1]) + " in redistribute 6x4 S(0)@sites -> R"));
    CHECK(lines[0] != lines[1]);
  }
  SUBCASE("the same call from two einsums: the context alone differs") {
    std::vector<double> x(8, 1.0);
    const std::string what = message_of<zest::collective_mismatch>([&] {
      const zest::collective_context outer(
          "einsum", [&](std::ostream& out) { out << (first ? "\"ij,jk->ik\"" : "\"bi,ij->bj\""); });
      const zest::collective_context inner("redistribute",
                                           [](std::ostream& out) { out << "P(sites) -> R"; });
      comm.all_reduce(std::span<double>(x));
    });
    INFO(what);
    CHECK(contains(what, "rank 0: all_reduce<double>[8] #0; rank 1: all_reduce<double>[8] #0"));
    CHECK(contains(what, "in redistribute P(sites) -> R in einsum \"ij,jk->ik\""));
    CHECK(contains(what, "in redistribute P(sites) -> R in einsum \"bi,ij->bj\""));
  }
  // In step again: the same call everywhere, no context.
  std::vector<int> one{1};
  comm.all_reduce(std::span<int>(one));
  CHECK(one[0] == comm.size());
  CHECK(zest::collective_context::current() == nullptr);
}
