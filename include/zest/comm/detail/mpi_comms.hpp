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

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "zest/core/backoff.hpp"

namespace zest::detail {

// Owns a communicator: frees it when it goes out of scope, an exception's unwinding included.
struct owned_comm {
  MPI_Comm comm = MPI_COMM_NULL;
  owned_comm() = default;
  owned_comm(const owned_comm&) = delete;
  owned_comm& operator=(const owned_comm&) = delete;
  ~owned_comm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

// MPI's text for an error code.
inline std::string mpi_error_text(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  if (MPI_Error_string(code, text.data(), &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text.data(), static_cast<std::size_t>(length));
}

// Waits for the request, polling with backoff; the request's error code, or MPI_SUCCESS.
inline int wait_politely(MPI_Request& request) {
  backoff pause;
  for (;;) {
    int done = 0;
    const int code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (code != MPI_SUCCESS || done != 0) return code;
    pause();
  }
}

// out[i] = a duplicate of comm, for each i, made one after another (each MPI_Comm_idup
// polled to its end: several in flight on one communicator have tripped MPI libraries);
// all or none: on an error the duplicates already made are freed and out is MPI_COMM_NULL
// throughout. Collective over comm, like MPI_Comm_dup.
inline int duplicate_politely(MPI_Comm comm, std::span<MPI_Comm> out) {
  for (auto& c : out) c = MPI_COMM_NULL;
  for (std::size_t i = 0; i < out.size(); ++i) {
    MPI_Request request = MPI_REQUEST_NULL;
    int code = MPI_Comm_idup(comm, &out[i], &request);
    if (code == MPI_SUCCESS) code = wait_politely(request);
    if (code != MPI_SUCCESS) {
      for (std::size_t k = 0; k < i; ++k) MPI_Comm_free(&out[k]);
      for (auto& c : out) c = MPI_COMM_NULL;  // one whose idup failed is MPI's to release
      return code;
    }
  }
  return MPI_SUCCESS;
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
