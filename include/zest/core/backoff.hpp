// zest/core/backoff.hpp — how a thread that polls for another's progress waits between polls.
//
//   detail::backoff pause;
//   while (!done()) pause();
//
// Ranks may outnumber cores (the tests run 4 ranks on 2), and a rank that spins keeps the
// core from the peer it waits for: spinning for 1 ms measured 4 ms per 8-float all_reduce
// on a loaded machine, yielding 3 us; a blocking MPI_Comm_dup, which spins inside MPI,
// 8.5 ms at 4 ranks on 2 cores against 0.04 ms for MPI_Comm_idup polled this way. So: 64
// polls back to back (a short wait costs no system call), then a yield between polls, and
// past 10 ms a 20 us sleep (a long wait costs no core).
#pragma once

#include <chrono>
#include <thread>

namespace zest::detail {

class backoff {
 public:
  using clock = std::chrono::steady_clock;

  backoff() : started_(clock::now()) {}

  // Called after each poll that found nothing done.
  void operator()() {
    if (polls_ < spins) {
      ++polls_;
      return;
    }
    if (clock::now() - started_ < yield_for) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  static constexpr unsigned spins = 64;
  static constexpr std::chrono::milliseconds yield_for{10};

 private:
  clock::time_point started_;
  unsigned polls_ = 0;
};

}  // namespace zest::detail
