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
//
// Ending a failed run without losing its message:
//
//   } catch (const std::exception& e) {
//     zest::report_and_abort(e);   // "[rank 2 of 4] zest: ..." on stderr, then MPI_Abort
//   }
//
// report_and_abort writes the whole message with one write(2) to stderr (a pipe keeps it
// whole and in one piece), then waits for the other ranks, at most ZEST_ABORT_GRACE_MS
// (default 2000), on a non-blocking barrier over a duplicate of MPI_COMM_WORLD that the
// first mpi_environment made (so it never matches the application's collectives):
//   - every rank arrived (an error every rank sees): each leaves MPI (MPI_Finalize) and exits
//     with exit_code, no abort. Finalizing first matters: MPICH's launcher takes a process
//     that exits non-zero without finalizing for a crash and kills the others, whose status
//     is then 9 with a "BAD TERMINATION" banner (measured at 4 ranks: 12 of 20 runs without
//     the finalize, none of 20 with it);
//   - the grace ran out (some rank is blocked, still computing, or stopped): MPI_Abort.
// Either way every message written is out before any process is killed: MPI_Abort ends
// every process, and output the launcher has not yet forwarded is lost with them.
//
// The end of the run checks the collective schedule: when the environment that initialised
// MPI ends, the ranks compare the record of every zest communicator the program made (MPI and
// NCCL; zest/comm/detail/schedule_log.hpp: the collectives each rank issued on it), with one
// all-gather on a duplicate of MPI_COMM_WORLD, under the watchdog's deadline. Ranks that
// issued other collectives than their peers since the last check_schedule, even of the same
// sizes (which MPI lets through, with wrong data), then end
// with collective_mismatch's message through report_and_abort (exit status 1) instead of
// exiting 0. A rank that does not reach the end within the deadline makes the others skip the
// check with a warning (a rank still at work is no error); a rank whose environment ends by an
// exception takes part without records, and then no rank gives a verdict.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "zest/comm/checked.hpp"
#include "zest/comm/detail/mpi_comms.hpp"
#include "zest/comm/detail/rank_list.hpp"
#include "zest/comm/detail/schedule_registry.hpp"
#include "zest/core/backoff.hpp"
#include "zest/core/error.hpp"

namespace zest {

namespace detail {
// The duplicate of MPI_COMM_WORLD that report_and_abort waits on (MPI_COMM_NULL: none).
inline MPI_Comm& abort_comm() {
  static MPI_Comm comm = MPI_COMM_NULL;
  return comm;
}

// Writes all of text to fd, in one write(2) unless the kernel takes less.
inline void write_whole(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nothing more can be done about a closed stderr
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

inline std::chrono::milliseconds abort_grace() {
  if (const char* ms = std::getenv("ZEST_ABORT_GRACE_MS")) {
    char* end = nullptr;
    const long long value = std::strtoll(ms, &end, 10);
    if (end != ms && *end == '\0' && value >= 0) return std::chrono::milliseconds(value);
  }
  return std::chrono::milliseconds(2000);
}

// Every rank has reported and ends: each leaves MPI, then exits with exit_code (see the top
// of the file). MPI_Finalize is collective, and a collective the failed program left
// unmatched could keep it from returning: a thread ends the process at `until` plus the
// grace if it has not returned by then.
[[noreturn]] inline void finalize_and_exit(int exit_code,
                                           std::chrono::steady_clock::time_point until) noexcept {
  try {
    std::thread([exit_code, at = until + abort_grace()] {
      std::this_thread::sleep_until(at);
      std::_Exit(exit_code);
    }).detach();
  } catch (...) {  // no thread: exit without leaving MPI
    std::_Exit(exit_code);
  }
  MPI_Finalize();
  std::_Exit(exit_code);
}
}  // namespace detail

// Reports `what` on stderr and ends the run with exit_code (see the top of this file).
// Prefixed "[rank r of n] " when MPI runs with more than one rank. Never returns.
[[noreturn]] inline void report_and_abort(std::string_view what, int exit_code = 1) noexcept {
  int initialized = 0, finalized = 0, rank = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool running = initialized != 0 && finalized == 0;
  if (running) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  std::string text;
  try {
    if (size > 1) text = "[rank " + std::to_string(rank) + " of " + std::to_string(size) + "] ";
    text.append(what);
    if (text.empty() || text.back() != '\n') text.push_back('\n');
  } catch (...) {  // out of memory: the message alone, then the newline
    detail::write_whole(STDERR_FILENO, what);
    text = "\n";
  }
  std::cout.flush();  // what the program printed before comes first
  std::fflush(nullptr);
  detail::write_whole(STDERR_FILENO, text);
  if (!running || size == 1) std::_Exit(exit_code);

  const auto until = std::chrono::steady_clock::now() + detail::abort_grace();
  MPI_Request all_here = MPI_REQUEST_NULL;
  const MPI_Comm comm = detail::abort_comm();
  if (comm == MPI_COMM_NULL || MPI_Ibarrier(comm, &all_here) != MPI_SUCCESS) {
    all_here = MPI_REQUEST_NULL;
  }
  while (std::chrono::steady_clock::now() < until) {
    int done = 0;
    if (all_here != MPI_REQUEST_NULL &&
        MPI_Test(&all_here, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done != 0) {
      // Every rank is here and ends: no abort is needed, and none must cut the launcher's
      // forwarding of the messages short (measured: MPI_Abort right after this barrier
      // lost a rank's message in 9 of 100 runs at 2 ranks).
      detail::finalize_and_exit(exit_code, until);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Some rank is elsewhere (blocked, computing, stopped): take it down. The messages
  // written here went out at least the grace period ago.
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; if it did, still end here
}

// The exception's what().
[[noreturn]] inline void report_and_abort(const std::exception& error, int exit_code = 1) noexcept {
  report_and_abort(std::string_view(error.what()), exit_code);
}

namespace detail {
// Waits for `pending` until the watchdog's deadline (none when it is 0), polling with backoff.
inline bool wait_within_watchdog(MPI_Request& pending) {
  const auto limit = checked_mode().watchdog;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  backoff pause;
  for (unsigned polls = 0;; ++polls) {
    int done = 0;
    if (MPI_Test(&pending, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done != 0) return true;
    if (limit.count() > 0 && polls >= backoff::spins &&
        std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    pause();
  }
}

// What the end of the run's check says on this rank: a mismatch it ends with (status 1), or
// a warning that the check could not be made (the run still ends as it would have).
struct end_of_run_verdict {
  std::string mismatch, warning;
};

// The end of the run's schedule check over `comm` (a duplicate of MPI_COMM_WORLD). A rank
// whose environment ends by an exception (`unwinding`) still takes part in the first
// exchange, with no records, so that the others learn it and give no verdict.
inline end_of_run_verdict end_of_run_check(MPI_Comm comm, bool unwinding) {
  int world_size = 1, world_rank = 0;
  MPI_Comm_size(comm, &world_size);
  MPI_Comm_rank(comm, &world_rank);
  constexpr std::size_t words = 5;  // key, hash, calls, rank in the communicator, its size
  std::vector<std::uint64_t> mine;
  for (const auto& e : schedule_registry::instance().entries()) {
    if (!schedule_registry::compared(e)) continue;
    const auto [hash, calls] = schedule_registry::record_of(e);
    mine.insert(mine.end(), {e.key, hash, calls, static_cast<std::uint64_t>(e.rank),
                             static_cast<std::uint64_t>(e.world_ranks.size())});
  }
  const auto timed_out = [&] {
    return end_of_run_verdict{
        "", message("zest: mpi_environment: the end of the run's schedule check was skipped: "
                    "some rank did not reach the end of the run within the watchdog's ",
                    checked_mode().watchdog.count(),
                    " ms (it is blocked in a collective, still computing, or has stopped)")};
  };
  std::vector<int> counts(static_cast<std::size_t>(world_size)), starts(counts.size());
  // -1: this rank ends by an exception, and there is no verdict.
  auto count = std::make_unique<int>(unwinding ? -1 : static_cast<int>(mine.size()));
  MPI_Request pending = MPI_REQUEST_NULL;
  if (MPI_Iallgather(count.get(), 1, MPI_INT, counts.data(), 1, MPI_INT, comm, &pending) !=
      MPI_SUCCESS) {
    return {};  // no check possible: MPI is failing already
  }
  if (!wait_within_watchdog(pending)) {
    keep_forever(std::move(counts));  // MPI may still read and write them
    static_cast<void>(count.release());
    return timed_out();
  }
  if (unwinding || std::any_of(counts.begin(), counts.end(), [](int c) { return c < 0; })) {
    return {};
  }
  int total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    starts[r] = total;
    total += counts[r];
  }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(total));
  if (MPI_Iallgatherv(mine.data(), *count, MPI_UINT64_T, all.data(), counts.data(), starts.data(),
                      MPI_UINT64_T, comm, &pending) != MPI_SUCCESS) {
    return {};
  }
  if (!wait_within_watchdog(pending)) {
    keep_forever(std::move(mine));
    keep_forever(std::move(all));
    keep_forever(std::move(counts));
    keep_forever(std::move(starts));
    return timed_out();
  }
  // Every rank sees every record: the verdict is the same everywhere.
  struct seen {
    int world_rank, rank;
    std::uint64_t hash, calls, size;
  };
  std::map<std::uint64_t, std::vector<seen>> by_key;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    for (int w = 0; w < counts[r]; w += static_cast<int>(words)) {
      const std::uint64_t* f = &all[static_cast<std::size_t>(starts[r] + w)];
      by_key[f[0]].push_back({static_cast<int>(r), static_cast<int>(f[3]), f[1], f[2], f[4]});
    }
  }
  std::ostringstream out;
  std::vector<int> involved;
  for (auto& entry : by_key) {  // not a structured binding: clang++ 14 cannot capture one
    const std::uint64_t key = entry.first;
    std::vector<seen>& ranks = entry.second;
    // A communicator that some of its ranks left out (unusable there after a timeout, whose
    // error that rank reported) is not compared.
    if (ranks.size() != ranks.front().size) continue;
    const bool agree = std::all_of(ranks.begin(), ranks.end(), [&](const seen& s) {
      return s.hash == ranks.front().hash && s.calls == ranks.front().calls;
    });
    if (agree) continue;
    for (const seen& s : ranks) involved.push_back(s.world_rank);
    const schedule_registry::entry* here = nullptr;
    for (const auto& e : schedule_registry::instance().entries()) {
      if (e.key == key) here = &e;
    }
    if (here == nullptr) continue;  // not a communicator of this rank: its ranks say which
    std::sort(ranks.begin(), ranks.end(),
              [](const seen& a, const seen& b) { return a.rank < b.rank; });
    bool same_counts = true;
    for (const seen& s : ranks) same_counts = same_counts && s.calls == ranks.front().calls;
    out << (out.tellp() > 0 ? "\n" : "") << "zest: collective mismatch on axis '" << here->name
        << "' found at the end of the run (mpi_environment): the ranks of the axis did not issue "
           "the same collectives since it was made or last checked: "
        << per_rank(
               ranks.size(),
               [&](std::size_t r) {
                 const auto same_as = std::find_if(ranks.begin(), ranks.end(), [&](const seen& s) {
                   return s.hash == ranks[r].hash && s.calls == ranks[r].calls;
                 });
                 return message(ranks[r].calls, ranks[r].calls == 1 ? " call" : " calls",
                                ", sequence ",
                                static_cast<char>(
                                    'A' + std::min<std::ptrdiff_t>(same_as - ranks.begin(), 25)));
               },
               true)
        << (same_counts ? " (as many calls, not the same ones)" : "")
        << ". zest::check_schedule(mesh) names the first call that differs (zero_engine::step "
           "checks every step); ZEST_CHECKED=1 stops at the first such call";
  }
  if (involved.empty()) return {};
  if (out.tellp() > 0) return {out.str(), ""};
  std::sort(involved.begin(), involved.end());
  involved.erase(std::unique(involved.begin(), involved.end()), involved.end());
  return {message("zest: collective mismatch found at the end of the run (mpi_environment) on a "
                  "communicator of world ranks ",
                  rank_list(involved), ", which this rank is not part of: their messages name it"),
          ""};
}
}  // namespace detail

class mpi_environment {
 public:
  mpi_environment() : mpi_environment(nullptr, nullptr) {}

  mpi_environment(int* argc, char*** argv, int required = MPI_THREAD_FUNNELED) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0) {
      MPI_Query_thread(&provided_);
    } else {
      const int code = MPI_Init_thread(argc, argv, required, &provided_);
      if (code != MPI_SUCCESS) {
        throw communicator_error(
            detail::message("zest: mpi_environment: MPI_Init_thread failed with MPI error ", code));
      }
      owns_ = true;
    }
    // Every rank constructs its environment, so these collective calls line up.
    if (detail::abort_comm() == MPI_COMM_NULL &&
        detail::duplicate_politely(MPI_COMM_WORLD, std::span(&detail::abort_comm(), 1)) ==
            MPI_SUCCESS) {
      owns_abort_comm_ = true;
    }
    if (owns_ &&
        detail::duplicate_politely(MPI_COMM_WORLD, std::span(&end_comm_, 1)) != MPI_SUCCESS) {
      end_comm_ = MPI_COMM_NULL;
    }
  }

  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  mpi_environment(mpi_environment&&) = delete;
  mpi_environment& operator=(mpi_environment&&) = delete;

  ~mpi_environment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized != 0) return;
    if (end_comm_ != MPI_COMM_NULL) {
      detail::end_of_run_verdict verdict;
      try {
        verdict = detail::end_of_run_check(end_comm_, std::uncaught_exceptions() > 0);
      } catch (...) {  // out of memory: no check
      }
      if (!verdict.mismatch.empty()) report_and_abort(verdict.mismatch, 1);
      if (!verdict.warning.empty()) {
        int rank = 0, size = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        detail::write_whole(STDERR_FILENO, detail::message("[rank ", rank, " of ", size, "] ",
                                                           verdict.warning, '\n'));
      }
      MPI_Comm_free(&end_comm_);
    }
    if (owns_abort_comm_) MPI_Comm_free(&detail::abort_comm());
    if (owns_) MPI_Finalize();
  }

  // Whether this object initialised MPI (and will finalise it).
  bool owns() const { return owns_; }
  // The thread level MPI provides (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const { return provided_; }

 private:
  bool owns_ = false;
  bool owns_abort_comm_ = false;
  MPI_Comm end_comm_ = MPI_COMM_NULL;  // the end of the run's schedule check
  int provided_ = MPI_THREAD_SINGLE;
};

}  // namespace zest
