// tests/support/mpi_main.cpp — main() of every MPI test: doctest on every rank.
//
// Debian's doctest has no MPI extension; this is our equivalent:
//   - MPI_Init_thread (FUNNELED, what zest asks for), then checked mode on, with a watchdog
//     of 20 s unless ZEST_WATCHDOG_MS says otherwise: a mismatched or stuck collective
//     becomes a test failure naming the operation instead of a hang until CTest's timeout;
//   - every rank runs the same test cases, so collectives inside a test case match up;
//   - rank 0 prints doctest's usual report; the other ranks print only their failures
//     (doctest's --minimal). With more than one rank every line is prefixed "[rank r] "
//     and written in one piece, so lines of different ranks do not mix mid-line;
//   - rank 0 ends with one line naming the ranks that failed, e.g.
//       [zest] 4 ranks: FAILED on ranks 2 (look for lines starting "[rank 2]")
//   - the exit code is the maximum over ranks, so a failure on any rank fails the test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/mpi_test.hpp"
#include "zest/comm/checked.hpp"

namespace zest::testing {

namespace {
mpi_world world_info;
}  // namespace

const mpi_world& world() { return world_info; }

}  // namespace zest::testing

namespace {

// Collects characters into lines and writes each line, prefixed, with one fwrite + fflush.
class prefixed_line_buffer : public std::streambuf {
 public:
  prefixed_line_buffer(std::FILE* sink, std::string prefix)
      : sink_(sink), prefix_(std::move(prefix)), line_(prefix_) {}
  prefixed_line_buffer(const prefixed_line_buffer&) = delete;
  prefixed_line_buffer& operator=(const prefixed_line_buffer&) = delete;
  ~prefixed_line_buffer() override { flush_line(); }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    line_.push_back(traits_type::to_char_type(c));
    if (c == '\n') emit();
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n; ++i) overflow(traits_type::to_int_type(s[i]));
    return n;
  }
  int sync() override {
    std::fflush(sink_);
    return 0;
  }

 private:
  void emit() {
    std::fwrite(line_.data(), 1, line_.size(), sink_);
    std::fflush(sink_);
    line_ = prefix_;
  }
  void flush_line() {
    if (line_.size() > prefix_.size()) {
      line_.push_back('\n');
      emit();
    }
  }

  std::FILE* sink_;
  std::string prefix_;
  std::string line_;
};

class null_buffer : public std::streambuf {
 protected:
  int_type overflow(int_type c) override { return traits_type::not_eof(c); }
};

// doctest's options that only print information (help, lists, counts): other ranks stay
// silent for them, so `mpiexec -n 4 test --list-test-cases` lists once.
bool is_query_option(std::string_view arg) {
  while (!arg.empty() && arg.front() == '-') arg.remove_prefix(1);
  if (arg.starts_with("dt-")) arg.remove_prefix(3);
  arg = arg.substr(0, arg.find('='));
  for (std::string_view q :
       {"h", "?", "help", "v", "version", "c", "count", "ltc", "list-test-cases", "lts",
        "list-test-suites", "lr", "list-reporters"}) {
    if (arg == q) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  zest::testing::world_info = {rank, size};

  zest::set_checked_mode(true);
  if (std::getenv("ZEST_WATCHDOG_MS") == nullptr) {
    zest::set_watchdog(std::chrono::milliseconds(20000));
  }

  bool query = false;
  for (int i = 1; i < argc; ++i) query = query || is_query_option(argv[i]);

  int result = 0;
  {
    prefixed_line_buffer prefixed(stdout, "[rank " + std::to_string(rank) + "] ");
    null_buffer silent;
    std::ostream prefixed_out(&prefixed);
    std::ostream silent_out(&silent);

    doctest::Context context;
    context.applyCommandLine(argc, argv);
    if (size > 1) {
      context.setOption("no-colors", true);
      context.setOption("no-version", true);
      if (rank != 0) context.setOption("minimal", true);
      context.setCout(rank != 0 && query ? &silent_out : &prefixed_out);
    }
    result = context.run();
  }
  std::fflush(stdout);

  std::vector<int> results(static_cast<std::size_t>(size));
  MPI_Gather(&result, 1, MPI_INT, results.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && size > 1 && !query) {
    std::string failed;
    for (int r = 0; r < size; ++r) {
      if (results[static_cast<std::size_t>(r)] != 0) {
        failed += (failed.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (failed.empty()) {
      std::printf("[zest] %d ranks: all passed\n", size);
    } else {
      std::printf("[zest] %d ranks: FAILED on ranks %s (look for lines starting \"[rank N]\")\n",
                  size, failed.c_str());
    }
    std::fflush(stdout);
  }

  MPI_Finalize();
  return worst;
}
