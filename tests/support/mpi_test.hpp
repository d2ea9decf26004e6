// tests/support/mpi_test.hpp — what the MPI test main (mpi_main.cpp) tells the tests.
//
//   #include "support/mpi_test.hpp"
//   TEST_CASE("allgather on the world") {
//     const auto& w = zest::testing::world();   // MPI_COMM_WORLD's rank and size
//     if (w.size < 2) return;                    // the same binary runs at 1, 2 and 4 ranks
//     ...
//   }
#pragma once

namespace zest::testing {

struct mpi_world {
  int rank = 0;
  int size = 1;
};

// Rank and size of MPI_COMM_WORLD, set by the test main before any test runs.
const mpi_world& world();

}  // namespace zest::testing
