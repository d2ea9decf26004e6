// bench/mpi_profile.hpp — seconds spent inside MPI, by collective, through MPI's profiling
// interface.
//
// A bench that includes this header (in one translation unit of the program: it defines MPI
// functions) replaces the MPI calls zest's communicators make with versions that time the
// call and forward it to its PMPI_ name: the blocking collectives, the starts of the
// non-blocking ones, and MPI_Wait and MPI_Test. zest's communicators start every collective
// as a non-blocking one and poll it (zest/comm/detail/mpi_core.hpp), so a wait or a test is
// counted towards the collective whose request it is: an all-to-all's seconds are its start
// and every poll of it. What is counted is the time inside these calls: not the pauses
// zest's backoff makes between two polls of a request that is not done (none for the first
// 64 polls, then yields, then 20 us sleeps), so a long wait reads short. Checked mode's
// fingerprint exchanges are all-gathers and count as such; the polls of other requests
// (communicator creation) count as `other`; the watchdog's point-to-point reports are not
// wrapped.
//
//   const double before = bench_mpi::seconds(bench_mpi::op::all_to_all);
//   ... step ...
//   const double in_all_to_all = bench_mpi::seconds(bench_mpi::op::all_to_all) - before;
//   bench_mpi::total_seconds()   // every call above
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

namespace bench_mpi {

enum class op : std::size_t {
  all_reduce,
  all_gather,
  reduce_scatter,
  all_to_all,
  broadcast,
  barrier,
  other,
  count
};

namespace detail {
struct state {
  std::array<double, static_cast<std::size_t>(op::count)> seconds{};
  std::vector<std::pair<MPI_Request, op>> in_flight;  // the collectives' requests
};
inline state& profile() {
  static state s;
  return s;
}

using clock_type = std::chrono::steady_clock;

// Runs an MPI call, adding its seconds to `kind`.
template <class F>
int timed(op kind, F call) {
  const auto t0 = clock_type::now();
  const int rc = call();
  profile().seconds[static_cast<std::size_t>(kind)] +=
      std::chrono::duration<double>(clock_type::now() - t0).count();
  return rc;
}

// A non-blocking start: timed, and its request remembered.
template <class F>
int started(op kind, MPI_Request* request, F call) {
  const int rc = timed(kind, call);
  if (rc == MPI_SUCCESS && *request != MPI_REQUEST_NULL)
    profile().in_flight.emplace_back(*request, kind);
  return rc;
}

// The collective a request belongs to; `forget`: it has completed.
inline op kind_of(MPI_Request request) {
  for (const auto& [r, kind] : profile().in_flight) {
    if (r == request) return kind;
  }
  return op::other;
}
inline void forget(MPI_Request request) {
  auto& v = profile().in_flight;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.first == request; }),
          v.end());
}
}  // namespace detail

// Seconds inside MPI so far, for one kind of call, and for all of them.
inline double seconds(op kind) { return detail::profile().seconds[static_cast<std::size_t>(kind)]; }
inline double total_seconds() {
  double t = 0;
  for (const double s : detail::profile().seconds) t += s;
  return t;
}

}  // namespace bench_mpi

extern "C" {
int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  const MPI_Request r = *request;
  const int rc = bench_mpi::detail::timed(bench_mpi::detail::kind_of(r),
                                          [&] { return PMPI_Wait(request, status); });
  bench_mpi::detail::forget(r);
  return rc;
}
int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  const MPI_Request r = *request;
  const int rc = bench_mpi::detail::timed(bench_mpi::detail::kind_of(r),
                                          [&] { return PMPI_Test(request, flag, status); });
  if (rc != MPI_SUCCESS || *flag != 0) bench_mpi::detail::forget(r);
  return rc;
}

int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op o,
                  MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::all_reduce,
                                  [&] { return PMPI_Allreduce(send, recv, count, type, o, comm); });
}
int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv,
                  int recv_count, MPI_Datatype recv_type, MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::all_gather, [&] {
    return PMPI_Allgather(send, send_count, send_type, recv, recv_count, recv_type, comm);
  });
}
int MPI_Allgatherv(const void* send, int send_count, MPI_Datatype send_type, void* recv,
                   const int recv_counts[], const int displs[], MPI_Datatype recv_type,
                   MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::all_gather, [&] {
    return PMPI_Allgatherv(send, send_count, send_type, recv, recv_counts, displs, recv_type, comm);
  });
}
int MPI_Reduce_scatter(const void* send, void* recv, const int recv_counts[], MPI_Datatype type,
                       MPI_Op o, MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::reduce_scatter, [&] {
    return PMPI_Reduce_scatter(send, recv, recv_counts, type, o, comm);
  });
}
int MPI_Reduce_scatter_block(const void* send, void* recv, int recv_count, MPI_Datatype type,
                             MPI_Op o, MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::reduce_scatter, [&] {
    return PMPI_Reduce_scatter_block(send, recv, recv_count, type, o, comm);
  });
}
int MPI_Alltoall(const void* send, int send_count, MPI_Datatype send_type, void* recv,
                 int recv_count, MPI_Datatype recv_type, MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::all_to_all, [&] {
    return PMPI_Alltoall(send, send_count, send_type, recv, recv_count, recv_type, comm);
  });
}
int MPI_Alltoallv(const void* send, const int send_counts[], const int send_displs[],
                  MPI_Datatype send_type, void* recv, const int recv_counts[],
                  const int recv_displs[], MPI_Datatype recv_type, MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::all_to_all, [&] {
    return PMPI_Alltoallv(send, send_counts, send_displs, send_type, recv, recv_counts, recv_displs,
                          recv_type, comm);
  });
}
int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::broadcast,
                                  [&] { return PMPI_Bcast(buffer, count, type, root, comm); });
}
int MPI_Barrier(MPI_Comm comm) {
  return bench_mpi::detail::timed(bench_mpi::op::barrier, [&] { return PMPI_Barrier(comm); });
}

int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op o,
                   MPI_Comm comm, MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::all_reduce, request, [&] {
    return PMPI_Iallreduce(send, recv, count, type, o, comm, request);
  });
}
int MPI_Iallgather(const void* send, int send_count, MPI_Datatype send_type, void* recv,
                   int recv_count, MPI_Datatype recv_type, MPI_Comm comm, MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::all_gather, request, [&] {
    return PMPI_Iallgather(send, send_count, send_type, recv, recv_count, recv_type, comm, request);
  });
}
int MPI_Iallgatherv(const void* send, int send_count, MPI_Datatype send_type, void* recv,
                    const int recv_counts[], const int displs[], MPI_Datatype recv_type,
                    MPI_Comm comm, MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::all_gather, request, [&] {
    return PMPI_Iallgatherv(send, send_count, send_type, recv, recv_counts, displs, recv_type, comm,
                            request);
  });
}
int MPI_Ireduce_scatter(const void* send, void* recv, const int recv_counts[], MPI_Datatype type,
                        MPI_Op o, MPI_Comm comm, MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::reduce_scatter, request, [&] {
    return PMPI_Ireduce_scatter(send, recv, recv_counts, type, o, comm, request);
  });
}
int MPI_Ireduce_scatter_block(const void* send, void* recv, int recv_count, MPI_Datatype type,
                              MPI_Op o, MPI_Comm comm, MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::reduce_scatter, request, [&] {
    return PMPI_Ireduce_scatter_block(send, recv, recv_count, type, o, comm, request);
  });
}
int MPI_Ialltoall(const void* send, int send_count, MPI_Datatype send_type, void* recv,
                  int recv_count, MPI_Datatype recv_type, MPI_Comm comm, MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::all_to_all, request, [&] {
    return PMPI_Ialltoall(send, send_count, send_type, recv, recv_count, recv_type, comm, request);
  });
}
int MPI_Ialltoallv(const void* send, const int send_counts[], const int send_displs[],
                   MPI_Datatype send_type, void* recv, const int recv_counts[],
                   const int recv_displs[], MPI_Datatype recv_type, MPI_Comm comm,
                   MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::all_to_all, request, [&] {
    return PMPI_Ialltoallv(send, send_counts, send_displs, send_type, recv, recv_counts,
                           recv_displs, recv_type, comm, request);
  });
}
int MPI_Ibcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm,
               MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::broadcast, request, [&] {
    return PMPI_Ibcast(buffer, count, type, root, comm, request);
  });
}
int MPI_Ibarrier(MPI_Comm comm, MPI_Request* request) {
  return bench_mpi::detail::started(bench_mpi::op::barrier, request,
                                    [&] { return PMPI_Ibarrier(comm, request); });
}
}  // extern "C"
