// zest/comm/mpi_environment.hpp — MPI's lifetime as an object.
//
//   int main(int argc, char** argv) {
//     zest::mpi_environment mpi(&argc, &argv);   // MPI_Init_thread unless already done
//     zest::mpi_communicator world(MPI_COMM_WORLD, "world");
//     ...
//   }                                           // world freed, then MPI_Finalize
//
// Only the environment that initialised MPI finalises it, so a library or test helper can
// create one without caring whether the application did too. zest only calls MPI from the
// thread that created its communicators, so MPI_THREAD_FUNNELED is what it asks for.
#pragma once

#include <mpi.h>

#include "zest/core/error.hpp"

namespace zest {

class mpi_environment {
 public:
  mpi_environment() : mpi_environment(nullptr, nullptr) {}

  mpi_environment(int* argc, char*** argv, int required = MPI_THREAD_FUNNELED) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0) {
      MPI_Query_thread(&provided_);
      return;
    }
    const int code = MPI_Init_thread(argc, argv, required, &provided_);
    if (code != MPI_SUCCESS) {
      throw communicator_error(
          detail::message("zest: mpi_environment: MPI_Init_thread failed with MPI error ", code));
    }
    owns_ = true;
  }

  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  mpi_environment(mpi_environment&&) = delete;
  mpi_environment& operator=(mpi_environment&&) = delete;

  ~mpi_environment() {
    if (!owns_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Finalize();
  }

  // Whether this object initialised MPI (and will finalise it).
  bool owns() const { return owns_; }
  // The thread level MPI provides (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const { return provided_; }

 private:
  bool owns_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

}  // namespace zest
