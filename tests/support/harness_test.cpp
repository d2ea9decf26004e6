// tests/support/harness_test.cpp — the MPI test main does what it promises.
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>

#include "support/mpi_test.hpp"
#include "zest/comm/checked.hpp"

TEST_CASE("mpi harness: the world the tests see is MPI's") {
  int rank = -1;
  int size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(zest::testing::world().rank == rank);
  CHECK(zest::testing::world().size == size);

  // Every rank runs this test case: the ranks that reach this collective are all of them,
  // each once.
  int ranks_here = 0;
  int rank_sum = 0;
  const int one = 1;
  MPI_Allreduce(&one, &ranks_here, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&rank, &rank_sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(ranks_here == size);
  CHECK(rank_sum == size * (size - 1) / 2);
}

TEST_CASE("mpi harness: doctest reports from rank 0, failures only from the others") {
  const auto& options = *doctest::getContextOptions();
  const auto& world = zest::testing::world();
  CHECK(options.minimal == (world.size > 1 && world.rank != 0));
}

TEST_CASE("mpi harness: checked mode is on, with a watchdog") {
  CHECK(zest::checked_mode().enabled);
  if (std::getenv("ZEST_WATCHDOG_MS") == nullptr) {
    CHECK(zest::checked_mode().watchdog == std::chrono::milliseconds(20000));
  }
}

TEST_CASE("mpi harness: point to point and waits work through the polite-wait shim") {
  const auto& world = zest::testing::world();
  const int right = (world.rank + 1) % world.size;
  const int left = (world.rank + world.size - 1) % world.size;
  int received = -1;
  MPI_Sendrecv(&world.rank, 1, MPI_INT, right, 7, &received, 1, MPI_INT, left, 7, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  CHECK(received == left);

  MPI_Request requests[2];
  int from_left = -1;
  MPI_Irecv(&from_left, 1, MPI_INT, left, 8, MPI_COMM_WORLD, &requests[0]);
  MPI_Isend(&world.rank, 1, MPI_INT, right, 8, MPI_COMM_WORLD, &requests[1]);
  MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
  CHECK(from_left == left);

  int value = world.rank == 0 ? 42 : 0;
  MPI_Bcast(&value, 1, MPI_INT, 0, MPI_COMM_WORLD);
  CHECK(value == 42);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Not run by default (skip); tests/support/CMakeLists.txt runs it on purpose at 4 ranks and
// checks that rank 0's summary names rank 2.
TEST_CASE("mpi harness: a failure on one rank is reported" * doctest::skip()) {
  CHECK_MESSAGE(zest::testing::world().rank != 2, "deliberate failure on rank 2");
}
