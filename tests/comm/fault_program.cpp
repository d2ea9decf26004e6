// A small MPI program that fails on purpose, run by fault_driver.py (tests/comm/CMakeLists.txt).
//
//   fault_program fail-all   every rank throws; each message (about 2 KB, ending "END <rank>")
//                            goes through zest::report_and_abort
//   fault_program stop       the last rank stops (sleeps for 10 minutes) before an all_reduce;
//                            the others' watchdog (ZEST_WATCHDOG_MS) raises collective_timeout,
//                            which they report and abort with
//   fault_program exit       the last rank leaves main() (MPI_Finalize) before the all_reduce
//   fault_program mismatch   outside checked mode, rank 0 reduces with max where the others
//                            sum (the same size: MPI lets it through), then every rank returns
//                            0 from main(): the end of the run's schedule check
//                            (mpi_environment) must end it with status 1 and the message
//   fault_program skip       outside checked mode, the last rank skips an all_reduce and
//                            goes on to the same next one (which MPI pairs with the skipped
//                            one: the sizes agree), then to check_schedule, while the others
//                            wait in that next call: every rank's timeout names call #0, made
//                            from other lines, as the first call that did not match
//   fault_program agree      the same calls on every rank, on the world and on a second
//                            communicator freed before the end: the run ends with status 0
//
// Exit status: 1 after a report, 0 if the collective unexpectedly succeeded (and for agree).
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "zest/comm/mpi_communicator.hpp"
#include "zest/comm/mpi_environment.hpp"

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  const std::string_view mode = argc > 1 ? argv[1] : "";
  try {
    zest::mpi_communicator world(MPI_COMM_WORLD, "world");
    const int last = world.size() - 1;
    if (mode == "fail-all") {
      std::string filler;
      for (int line = 0; line < 24; ++line) {
        filler += "\n  detail line " + std::to_string(line) + " of rank " +
                  std::to_string(world.rank()) + ": " + std::string(64, 'x');
      }
      throw std::runtime_error("zest: fault_program: deliberate failure on rank " +
                               std::to_string(world.rank()) + filler + "\nEND " +
                               std::to_string(world.rank()));
    }
    if (mode == "stop" && world.rank() == last) {
      std::this_thread::sleep_for(std::chrono::minutes(10));
    }
    if (mode == "exit" && world.rank() == last) return 0;
    if (mode == "mismatch" || mode == "agree") {
      world.set_checked(false);
      std::vector<double> x(64, 1.0);
      {
        zest::mpi_communicator freed(MPI_COMM_WORLD, "freed");
        freed.set_checked(false);
        freed.all_reduce(std::span<double>(x));
      }
      const bool differ = mode == "mismatch" && world.rank() == 0;
      world.all_reduce(std::span<double>(x), differ ? zest::reduce_op::max : zest::reduce_op::sum);
      std::printf("rank %d: the all_reduces returned\n", world.rank());
      return 0;
    }
    if (mode == "skip") {
      world.set_checked(false);
      std::vector<double> a(64, 1.0), b(64, 1.0);
      const auto next = [&] { world.all_reduce(std::span<double>(b)); };  // one line for all
      if (world.rank() != last) world.all_reduce(std::span<double>(a));   // the last skips it
      next();
      world.check_schedule("the step's end");
      return 0;
    }
    if (mode != "stop" && mode != "exit") {
      throw std::invalid_argument(
          "fault_program: mode must be fail-all, stop, exit, skip, mismatch or agree");
    }
    std::vector<double> x(64, 1.0);
    world.all_reduce(std::span<double>(x));
    std::printf("rank %d: all_reduce returned %g\n", world.rank(), x[0]);
    return 0;
  } catch (const std::exception& e) {
    zest::report_and_abort(e);
  }
}
