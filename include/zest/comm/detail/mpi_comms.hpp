// zest/comm/detail/mpi_comms.hpp — creating MPI communicators without holding a core.
//
// MPI's blocking calls spin inside MPI. When ranks outnumber cores, a spinning rank keeps
// the core from the peer it waits for until the scheduler takes it away: at 4 ranks on 2
// cores, MPI_Comm_dup took 8.5 ms and MPI_Comm_split 20 ms, where MPI_Comm_idup polled
// with zest's backoff (core/backoff.hpp) took 0.04 ms and MPI_Comm_create_group over a
// 2-rank group 7 ms. A mesh of two axes made about a dozen such calls, so every test at 4
// ranks paid over 100 ms per mesh it built. Communicators are therefore made from groups
// (each call involves only the new communicator's ranks) and duplicated with idup.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <span>
#include <vector>

#include "zest/core/backoff.hpp"

namespace zest::detail {

// Waits for every request, polling with backoff; the first error code, or MPI_SUCCESS.
inline int wait_all_politely(std::span<MPI_Request> requests) {
  backoff pause;
  for (;;) {
    int done = 0;
    const int code =
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (code != MPI_SUCCESS) return code;
    if (done != 0) return MPI_SUCCESS;
    pause();
  }
}

// out[i] = a duplicate of comm, for each i; all or none (on an error every duplicate made is
// freed and out is MPI_COMM_NULL throughout). Collective over comm, like MPI_Comm_dup.
inline int duplicate_politely(MPI_Comm comm, std::span<MPI_Comm> out) {
  std::vector<MPI_Request> requests(out.size(), MPI_REQUEST_NULL);
  int code = MPI_SUCCESS;
  for (auto& c : out) c = MPI_COMM_NULL;
  for (std::size_t i = 0; i < out.size() && code == MPI_SUCCESS; ++i) {
    code = MPI_Comm_idup(comm, &out[i], &requests[i]);
  }
  // Requests already started complete whatever happened after them.
  const int waited = wait_all_politely(requests);
  if (code == MPI_SUCCESS) code = waited;
  if (code != MPI_SUCCESS) {
    for (auto& c : out) {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
      c = MPI_COMM_NULL;
    }
  }
  return code;
}

// A communicator over the ranks `members` of parent (parent's numbering, in that order:
// member k becomes rank k). Collective over the members only, which must all pass the same
// list and tag; parent's other ranks take no part.
inline int group_communicator(MPI_Comm parent, std::span<const int> members, int tag,
                              MPI_Comm* out) {
  *out = MPI_COMM_NULL;
  MPI_Group all = MPI_GROUP_NULL, some = MPI_GROUP_NULL;
  int code = MPI_Comm_group(parent, &all);
  if (code != MPI_SUCCESS) return code;
  code = MPI_Group_incl(all, static_cast<int>(members.size()), members.data(), &some);
  MPI_Group_free(&all);
  if (code != MPI_SUCCESS) return code;
  code = MPI_Comm_create_group(parent, some, tag, out);
  MPI_Group_free(&some);
  return code;
}

}  // namespace zest::detail
