// tests/cuda/gpu_main.cpp — main() of every GPU test (label gpu): doctest on every rank,
// or exit code 77 (CTest's SKIP_RETURN_CODE) when this machine cannot run the test.
//
//   - MPI_Init_thread (a singleton when run without mpiexec, as the 1-rank tests are);
//   - skip, on every rank, unless each rank of a node can have its own GPU: no driver, no
//     device, or fewer devices than ranks on the node all give 77, never a pass;
//   - then as tests/support/mpi_main.cpp: checked mode on (watchdog 20 s unless
//     ZEST_WATCHDOG_MS says otherwise), rank 0 reports, others print only failures, and the
//     exit code is the maximum over ranks.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/gpu_test.hpp"
#include "support/mpi_test.hpp"
#include "zest/backend/cuda/device_memory.hpp"
#include "zest/comm/checked.hpp"

namespace zest::testing {

namespace {
mpi_world world_info;
std::vector<std::function<void()>>& finalizers() {
  static std::vector<std::function<void()>> f;
  return f;
}
}  // namespace

const mpi_world& world() { return world_info; }
void before_finalize(std::function<void()> f) { finalizers().push_back(std::move(f)); }
void run_finalizers() {
  auto& f = finalizers();
  while (!f.empty()) {
    auto last = std::move(f.back());
    f.pop_back();
    last();
  }
}

}  // namespace zest::testing

namespace {
constexpr int skip_code = 77;
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  zest::testing::world_info = {rank, size};

  // One GPU per rank of each node, or skip everywhere.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_ranks = 1;
  MPI_Comm_size(node, &node_ranks);
  MPI_Comm_free(&node);
  // A CUDA start that fails for any reason but "no driver" or "no device" is a failure
  // (exit 1, CUDA's error named), never a skip.
  zest::cuda::device_census seen;
  int broken = 0;
  try {
    seen = zest::cuda::visible_devices();
  } catch (const std::exception& e) {
    std::printf("FAILED: rank %d: CUDA did not start: %s\n", rank, e.what());
    std::fflush(stdout);
    broken = 1;
  }
  int any_broken = 0;
  MPI_Allreduce(&broken, &any_broken, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_broken != 0) {
    MPI_Finalize();
    return 1;
  }
  int runnable = seen.count >= node_ranks ? 1 : 0;
  int all_runnable = 0;
  MPI_Allreduce(&runnable, &all_runnable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all_runnable == 0) {
    if (rank == 0) {
      std::printf(
          "SKIPPED: no usable GPU: %d CUDA device(s) visible%s%s, %d rank(s) per node "
          "need one each\n",
          seen.count, seen.why_none.empty() ? "" : ": ", seen.why_none.c_str(), node_ranks);
      std::fflush(stdout);
    }
    MPI_Finalize();
    return skip_code;
  }

  zest::set_checked_mode(true);
  if (std::getenv("ZEST_WATCHDOG_MS") == nullptr) {
    zest::set_watchdog(std::chrono::milliseconds(20000));
  }

  int result = 0;
  {
    doctest::Context context;
    context.applyCommandLine(argc, argv);
    if (size > 1) {
      context.setOption("no-colors", true);
      if (rank != 0) context.setOption("minimal", true);
    }
    result = context.run();
  }
  std::fflush(stdout);

  zest::testing::run_finalizers();  // meshes and communicators go before MPI does
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && size > 1) {
    std::printf("[zest] %d ranks: %s\n", size,
                worst == 0 ? "all passed" : "FAILED on some rank (see above)");
    std::fflush(stdout);
  }
  MPI_Finalize();
  // A real failure must never read as a skip.
  return worst == skip_code ? 1 : worst;
}
