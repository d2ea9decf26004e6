// The watchdog of nccl_communicator outside checked mode: a collective queued on the device
// that does not finish makes the next host wait (here a read of a result to the host) throw
// collective_timeout within ZEST_WATCHDOG_MS, the communicator is aborted and refuses later
// calls, and collectives that did finish are never blamed, however long ago they ran.
//
//   - one rank: the collective is held back behind a kernel that spins until the host lets
//     it go (a peer that never comes, as far as the host can tell); runs on any GPU;
//   - two or more ranks: the last rank skips an all_reduce (after one all ranks made, so
//     that NCCL's connections exist), every other rank times out.
//
// gpu_main turns checked mode on for every test; these turn it off on their communicators.
// The late rank aborts its communicator at the end (nccl_communicator::abort), as a rank that
// gives up would.
#include <doctest/doctest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cuda/gpu_test.hpp"
#include "zest/backend/cuda/device_memory.hpp"
#include "zest/comm/checked.hpp"
#include "zest/comm/nccl_communicator.hpp"
#include "zest/core/error.hpp"

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using zest::device_buffer;
using zest::nccl_communicator;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

class watchdog_scope {
 public:
  explicit watchdog_scope(std::chrono::milliseconds timeout)
      : saved_(zest::checked_mode().watchdog) {
    zest::set_watchdog(timeout);
  }
  watchdog_scope(const watchdog_scope&) = delete;
  watchdog_scope& operator=(const watchdog_scope&) = delete;
  ~watchdog_scope() { zest::set_watchdog(saved_); }

 private:
  std::chrono::milliseconds saved_;
};

// A communicator that is never destroyed: NCCL does not promise that destroying one whose
// peer aborted returns, and the process ends soon after the test anyway.
nccl_communicator& lasting_comm(const char* name) {
  return *new nccl_communicator(MPI_COMM_WORLD, name);  // NOLINT(cppcoreguidelines-owning-memory)
}

device_buffer<float> filled(std::size_t n, float value) {
  std::vector<float> host(n, value);
  device_buffer<float> b(n);
  zest::cuda::copy_to_device(std::span<const float>(host), b.data());
  return b;
}

__global__ void spin_until_set(const volatile int* flag) {
  while (*flag == 0) {
  }
}

// Pinned host memory the device reads while the host writes it.
struct host_flag {
  host_flag() {
    ZEST_CUDA_CHECK(
        cudaHostAlloc(reinterpret_cast<void**>(&host), sizeof(int), cudaHostAllocMapped));
    *host = 0;
    ZEST_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host, 0));
  }
  host_flag(const host_flag&) = delete;
  host_flag& operator=(const host_flag&) = delete;
  ~host_flag() { static_cast<void>(cudaFreeHost(host)); }
  void set() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    *static_cast<volatile int*>(host) = 1;
  }
  int* host = nullptr;
  int* device = nullptr;
};

}  // namespace

TEST_CASE("nccl watchdog: finished collectives are never blamed, however long ago they ran") {
  nccl_communicator& comm = lasting_comm("done");
  comm.set_checked(false);
  const watchdog_scope watchdog(1000ms);
  auto data = filled(256, 1.0F);
  comm.all_reduce(std::span<float>(data.span()));
  std::vector<float> out(256);
  zest::cuda::copy_to_host(data.data(), out.size(), out.data());
  CHECK(out[0] == static_cast<float>(comm.size()));
  std::this_thread::sleep_for(1500ms);  // past the deadline, with nothing pending
  comm.all_reduce(std::span<float>(data.span()));
  auto r = comm.iall_reduce(std::span<float>(data.span()));
  r.wait();
  std::this_thread::sleep_for(50ms);
  CHECK_NOTHROW(zest::cuda::copy_to_host(data.data(), out.size(), out.data()));
  const float n = static_cast<float>(comm.size());
  CHECK(out[255] == n * n * n);
  CHECK_NOTHROW(zest::cuda::synchronize());
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("nccl watchdog: a collective held back on the device times out at the next host read") {
  // One rank's own communicator (no peer needed): the hold is a kernel before it.
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  auto& comm = *new nccl_communicator(MPI_COMM_SELF, "held");  // NOLINT: see lasting_comm
  comm.set_checked(false);
  const watchdog_scope watchdog(1500ms);
  auto data = filled(1024, 2.0F);
  host_flag flag;
  spin_until_set<<<1, 1, 0, zest::cuda::compute_stream()>>>(flag.device);
  ZEST_CUDA_CHECK(cudaGetLastError());
  const auto started = clock_type::now();
  // Lets the kernel go well after the deadline (NCCL's abort may wait for the device).
  std::thread release([&flag] {
    std::this_thread::sleep_for(2500ms);
    flag.set();
  });
  comm.all_reduce(std::span<float>(data.span()));  // returns: only the device waits
  std::vector<float> out(1024);
  std::string what, other;
  try {
    zest::cuda::copy_to_host(data.data(), out.size(), out.data());
  } catch (const zest::collective_timeout& e) {
    what = e.what();
  } catch (const std::exception& e) {  // reported below, once the kernel is let go
    other = e.what();
  }
  const double waited = seconds_since(started);
  release.join();
  CHECK(other.empty());
  INFO(what);
  CHECK(what.rfind("zest: collective timeout on axis 'held': all_reduce<float>[1024] #0 on rank "
                   "0 of 1 not complete after ",
                   0) == 0);
  CHECK(contains(what, "outside checked mode"));
  CHECK(contains(what, "ZEST_CHECKED=1"));
  CHECK(contains(what, "the axis spans world ranks " + std::to_string(world_rank)));
  CHECK(contains(what, "ZEST_WATCHDOG_MS sets the deadline (now 1500 ms; 0: none)"));
  CHECK(waited >= 1.45);
  CHECK(waited < 20.0);
  // The communicator refuses further calls; the device itself is fine.
  try {
    comm.all_reduce(std::span<float>(data.span()));
    FAIL("a call on an aborted communicator returned");
  } catch (const zest::communicator_error& e) {
    CHECK(contains(e.what(), "the communicator is unusable"));
    CHECK(contains(e.what(), "all_reduce #0 timed out; NCCL was aborted"));
  }
  CHECK_NOTHROW(zest::cuda::synchronize());
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("nccl watchdog: a rank skips an all_reduce; every other rank's host read throws") {
  nccl_communicator comm(MPI_COMM_WORLD, "skip");
  const int n = comm.size();
  if (n < 2) return;
  comm.set_checked(false);
  const watchdog_scope watchdog(3000ms);
  const int late = n - 1;
  auto data = filled(1024, 1.0F);
  std::vector<float> out(1024);
  // First on every rank: NCCL may connect the ranks at a communicator's first collective of a
  // kind, on the host, and the host would then wait in NCCL itself for the missing peer.
  comm.all_reduce(std::span<float>(data.span()));
  zest::cuda::copy_to_host(data.data(), out.size(), out.data());
  CHECK(out[0] == static_cast<float>(n));
  if (comm.rank() != late) {
    const auto started = clock_type::now();
    comm.all_reduce(std::span<float>(data.span()));
    std::string what;
    try {
      zest::cuda::copy_to_host(data.data(), out.size(), out.data());
    } catch (const zest::collective_timeout& e) {
      what = e.what();
    }
    const double waited = seconds_since(started);
    INFO(what);
    CHECK(what.rfind("zest: collective timeout on axis 'skip': all_reduce<float>[1024] #1 on "
                     "rank " +
                         std::to_string(comm.rank()) + " of " + std::to_string(n) +
                         " not complete after ",
                     0) == 0);
    CHECK(contains(what, "the ranks' calls were not compared"));
    CHECK(contains(what, "ZEST_CHECKED=1"));
    CHECK(contains(what, "the axis spans world ranks 0-" + std::to_string(late)));
    CHECK(contains(what, "NCCL was aborted"));
    CHECK(contains(what, "ZEST_WATCHDOG_MS sets the deadline (now 3000 ms; 0: none)"));
    CHECK(waited >= 2.95);
    CHECK(waited < 30.0);
    CHECK_THROWS_AS(comm.all_reduce(std::span<float>(data.span())), zest::communicator_error);
    CHECK_NOTHROW(zest::cuda::synchronize());
  } else {
    // The rank that skipped goes on, then gives up well after the others' deadline (NCCL may
    // need every rank to abort before an abort returns; the others' came first).
    std::this_thread::sleep_for(4500ms);
    comm.abort();
    CHECK_THROWS_AS(comm.all_reduce(std::span<float>(data.span())), zest::communicator_error);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // never in NCCL
}
