// tests/support/mpi_polite_wait.cpp — blocking MPI calls that yield the CPU while waiting.
//
// Why: MPICH 4.0 (Debian 12, ch4:ucx) busy-polls inside every blocking call and never
// yields. With more ranks than cores (4-rank tests on a 2-core CI machine) a rank that waits
// for a descheduled peer burns its whole time slice first: 2000 MPI_Allreduce of 8 KB at 4
// ranks on 2 idle cores took 16 s. None of MPICH 4.0.2's MPIR_CVAR_* settings
// (POLLS_BEFORE_YIELD, *_POSIX_INTRA_ALGORITHM=mpir, NOLOCAL, ...) nor `-bind-to none`
// changed that; newer MPICH has MPIR_CVAR_CH4_PROGRESS_THROTTLE for it.
//
// How: through MPI's profiling interface. The MPI test executables define the blocking
// calls below; each starts the nonblocking form with PMPI_I... and polls PMPI_Test: a short
// spin, then sched_yield() between polls, then 20 us sleeps, so that a rank that waits long
// leaves the core to the ranks that compute. Results and matching are those of the
// blocking call. Measured, 1000 such allreduces at 4 ranks on 2 cores that other builds
// kept busy: MPICH's busy wait 2.5-4.3 s, yield only 0.4-6.4 s, this 1.2-1.6 s.
//
// Set ZEST_MPI_BUSY_WAIT=1 to call the blocking PMPI_ functions instead (to compare, or to
// rule this file out), or configure with -DZEST_TEST_MPI_POLITE_WAIT=OFF to leave it out.
#include <mpi.h>
#include <sched.h>
#include <time.h>

#include <cstdlib>

namespace {

bool busy_wait() {
  static const bool busy = [] {
    const char* value = std::getenv("ZEST_MPI_BUSY_WAIT");
    return value != nullptr && *value != '\0' && *value != '0';
  }();
  return busy;
}

// When the peer runs on another core the answer usually comes within microseconds: spin
// first, then yield, and sleep only once the wait is clearly long.
constexpr int spin_polls = 64;
constexpr int yield_polls = 256;
constexpr timespec nap{0, 20000};  // 20 us

template <class Poll>
int poll_until_done(Poll poll) {
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int code = poll(done);
    if (code != MPI_SUCCESS || done != 0) return code;
    if (polls >= yield_polls) {
      nanosleep(&nap, nullptr);
    } else if (polls >= spin_polls) {
      sched_yield();
    }
  }
}

int polite_wait(MPI_Request* request, MPI_Status* status) {
  return poll_until_done([&](int& done) { return PMPI_Test(request, &done, status); });
}

}  // namespace

#define ZEST_UNPAREN(...) __VA_ARGS__

// ZEST_POLITE(Blocking, Nonblocking, (parameters), (arguments)) defines MPI_Blocking as
// PMPI_Nonblocking(arguments..., &request) followed by a polite wait.
#define ZEST_POLITE(blocking, nonblocking, parameters, arguments)          \
  extern "C" int MPI_##blocking parameters {                               \
    if (busy_wait()) return PMPI_##blocking arguments;                     \
    MPI_Request request = MPI_REQUEST_NULL;                                \
    const int code = PMPI_##nonblocking(ZEST_UNPAREN arguments, &request); \
    if (code != MPI_SUCCESS) return code;                                  \
    return polite_wait(&request, MPI_STATUS_IGNORE);                       \
  }

// Collectives ------------------------------------------------------------------------------

extern "C" int MPI_Barrier(MPI_Comm comm) {
  if (busy_wait()) return PMPI_Barrier(comm);
  MPI_Request request = MPI_REQUEST_NULL;
  const int code = PMPI_Ibarrier(comm, &request);
  if (code != MPI_SUCCESS) return code;
  return polite_wait(&request, MPI_STATUS_IGNORE);
}

ZEST_POLITE(Bcast, Ibcast, (void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm),
            (buffer, count, type, root, comm))
ZEST_POLITE(Reduce, Ireduce,
            (const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, int root,
             MPI_Comm comm),
            (send, receive, count, type, op, root, comm))
ZEST_POLITE(Allreduce, Iallreduce,
            (const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op,
             MPI_Comm comm),
            (send, receive, count, type, op, comm))
ZEST_POLITE(Allgather, Iallgather,
            (const void* send, int send_count, MPI_Datatype send_type, void* receive,
             int receive_count, MPI_Datatype receive_type, MPI_Comm comm),
            (send, send_count, send_type, receive, receive_count, receive_type, comm))
ZEST_POLITE(Allgatherv, Iallgatherv,
            (const void* send, int send_count, MPI_Datatype send_type, void* receive,
             const int receive_counts[], const int displacements[], MPI_Datatype receive_type,
             MPI_Comm comm),
            (send, send_count, send_type, receive, receive_counts, displacements, receive_type,
             comm))
ZEST_POLITE(Gather, Igather,
            (const void* send, int send_count, MPI_Datatype send_type, void* receive,
             int receive_count, MPI_Datatype receive_type, int root, MPI_Comm comm),
            (send, send_count, send_type, receive, receive_count, receive_type, root, comm))
ZEST_POLITE(Gatherv, Igatherv,
            (const void* send, int send_count, MPI_Datatype send_type, void* receive,
             const int receive_counts[], const int displacements[], MPI_Datatype receive_type,
             int root, MPI_Comm comm),
            (send, send_count, send_type, receive, receive_counts, displacements, receive_type,
             root, comm))
ZEST_POLITE(Scatter, Iscatter,
            (const void* send, int send_count, MPI_Datatype send_type, void* receive,
             int receive_count, MPI_Datatype receive_type, int root, MPI_Comm comm),
            (send, send_count, send_type, receive, receive_count, receive_type, root, comm))
ZEST_POLITE(Scatterv, Iscatterv,
            (const void* send, const int send_counts[], const int displacements[],
             MPI_Datatype send_type, void* receive, int receive_count, MPI_Datatype receive_type,
             int root, MPI_Comm comm),
            (send, send_counts, displacements, send_type, receive, receive_count, receive_type,
             root, comm))
ZEST_POLITE(Reduce_scatter, Ireduce_scatter,
            (const void* send, void* receive, const int receive_counts[], MPI_Datatype type,
             MPI_Op op, MPI_Comm comm),
            (send, receive, receive_counts, type, op, comm))
ZEST_POLITE(Reduce_scatter_block, Ireduce_scatter_block,
            (const void* send, void* receive, int receive_count, MPI_Datatype type, MPI_Op op,
             MPI_Comm comm),
            (send, receive, receive_count, type, op, comm))
ZEST_POLITE(Alltoall, Ialltoall,
            (const void* send, int send_count, MPI_Datatype send_type, void* receive,
             int receive_count, MPI_Datatype receive_type, MPI_Comm comm),
            (send, send_count, send_type, receive, receive_count, receive_type, comm))
ZEST_POLITE(Alltoallv, Ialltoallv,
            (const void* send, const int send_counts[], const int send_displacements[],
             MPI_Datatype send_type, void* receive, const int receive_counts[],
             const int receive_displacements[], MPI_Datatype receive_type, MPI_Comm comm),
            (send, send_counts, send_displacements, send_type, receive, receive_counts,
             receive_displacements, receive_type, comm))

#if MPI_VERSION >= 4
// MPI 4's large-count forms, for counts past INT_MAX.
ZEST_POLITE(Bcast_c, Ibcast_c,
            (void* buffer, MPI_Count count, MPI_Datatype type, int root, MPI_Comm comm),
            (buffer, count, type, root, comm))
ZEST_POLITE(Allreduce_c, Iallreduce_c,
            (const void* send, void* receive, MPI_Count count, MPI_Datatype type, MPI_Op op,
             MPI_Comm comm),
            (send, receive, count, type, op, comm))
ZEST_POLITE(Allgather_c, Iallgather_c,
            (const void* send, MPI_Count send_count, MPI_Datatype send_type, void* receive,
             MPI_Count receive_count, MPI_Datatype receive_type, MPI_Comm comm),
            (send, send_count, send_type, receive, receive_count, receive_type, comm))
ZEST_POLITE(Allgatherv_c, Iallgatherv_c,
            (const void* send, MPI_Count send_count, MPI_Datatype send_type, void* receive,
             const MPI_Count receive_counts[], const MPI_Aint displacements[],
             MPI_Datatype receive_type, MPI_Comm comm),
            (send, send_count, send_type, receive, receive_counts, displacements, receive_type,
             comm))
ZEST_POLITE(Reduce_scatter_c, Ireduce_scatter_c,
            (const void* send, void* receive, const MPI_Count receive_counts[], MPI_Datatype type,
             MPI_Op op, MPI_Comm comm),
            (send, receive, receive_counts, type, op, comm))
ZEST_POLITE(Reduce_scatter_block_c, Ireduce_scatter_block_c,
            (const void* send, void* receive, MPI_Count receive_count, MPI_Datatype type, MPI_Op op,
             MPI_Comm comm),
            (send, receive, receive_count, type, op, comm))
ZEST_POLITE(Alltoall_c, Ialltoall_c,
            (const void* send, MPI_Count send_count, MPI_Datatype send_type, void* receive,
             MPI_Count receive_count, MPI_Datatype receive_type, MPI_Comm comm),
            (send, send_count, send_type, receive, receive_count, receive_type, comm))
ZEST_POLITE(Alltoallv_c, Ialltoallv_c,
            (const void* send, const MPI_Count send_counts[], const MPI_Aint send_displacements[],
             MPI_Datatype send_type, void* receive, const MPI_Count receive_counts[],
             const MPI_Aint receive_displacements[], MPI_Datatype receive_type, MPI_Comm comm),
            (send, send_counts, send_displacements, send_type, receive, receive_counts,
             receive_displacements, receive_type, comm))
#endif

// Point to point and waits -----------------------------------------------------------------

ZEST_POLITE(Send, Isend,
            (const void* buffer, int count, MPI_Datatype type, int destination, int tag,
             MPI_Comm comm),
            (buffer, count, type, destination, tag, comm))

extern "C" int MPI_Recv(void* buffer, int count, MPI_Datatype type, int source, int tag,
                        MPI_Comm comm, MPI_Status* status) {
  if (busy_wait()) return PMPI_Recv(buffer, count, type, source, tag, comm, status);
  MPI_Request request = MPI_REQUEST_NULL;
  const int code = PMPI_Irecv(buffer, count, type, source, tag, comm, &request);
  if (code != MPI_SUCCESS) return code;
  return polite_wait(&request, status);
}

extern "C" int MPI_Sendrecv(const void* send, int send_count, MPI_Datatype send_type,
                            int destination, int send_tag, void* receive, int receive_count,
                            MPI_Datatype receive_type, int source, int receive_tag, MPI_Comm comm,
                            MPI_Status* status) {
  if (busy_wait()) {
    return PMPI_Sendrecv(send, send_count, send_type, destination, send_tag, receive, receive_count,
                         receive_type, source, receive_tag, comm, status);
  }
  MPI_Request receive_request = MPI_REQUEST_NULL;
  MPI_Request send_request = MPI_REQUEST_NULL;
  int code =
      PMPI_Irecv(receive, receive_count, receive_type, source, receive_tag, comm, &receive_request);
  if (code != MPI_SUCCESS) return code;
  code = PMPI_Isend(send, send_count, send_type, destination, send_tag, comm, &send_request);
  if (code != MPI_SUCCESS) return code;
  code = polite_wait(&send_request, MPI_STATUS_IGNORE);
  if (code != MPI_SUCCESS) return code;
  return polite_wait(&receive_request, status);
}

extern "C" int MPI_Probe(int source, int tag, MPI_Comm comm, MPI_Status* status) {
  if (busy_wait()) return PMPI_Probe(source, tag, comm, status);
  return poll_until_done([&](int& done) { return PMPI_Iprobe(source, tag, comm, &done, status); });
}

extern "C" int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  if (busy_wait()) return PMPI_Wait(request, status);
  return polite_wait(request, status);
}

extern "C" int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  if (busy_wait()) return PMPI_Waitall(count, requests, statuses);
  return poll_until_done([&](int& done) { return PMPI_Testall(count, requests, &done, statuses); });
}

extern "C" int MPI_Waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  if (busy_wait()) return PMPI_Waitany(count, requests, index, status);
  return poll_until_done(
      [&](int& done) { return PMPI_Testany(count, requests, index, &done, status); });
}

extern "C" int MPI_Waitsome(int count, MPI_Request requests[], int* completed, int indices[],
                            MPI_Status statuses[]) {
  if (busy_wait()) return PMPI_Waitsome(count, requests, completed, indices, statuses);
  return poll_until_done([&](int& done) {
    const int code = PMPI_Testsome(count, requests, completed, indices, statuses);
    done = *completed != 0 ? 1 : 0;  // MPI_UNDEFINED (no active request) also ends the wait
    return code;
  });
}
