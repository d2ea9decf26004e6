// zest/comm/detail/mpi_call.hpp — one rank's MPI collective call as data: its kind,
// element type, counts and buffers, validated against the communicator (sizes, counts that
// fit MPI's int), the keys checked mode compares, and the MPI call that starts or runs it.
// Type-erased, so that the plumbing is compiled once, not once per element type
// (zest/comm/mpi_communicator.hpp says how the calls are used).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <iomanip>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/comm/communicator.hpp"
#include "zest/comm/mpi_datatype.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/source_site.hpp"

namespace zest {
namespace detail {

// Fingerprints describe the five collectives and barrier (which moves no data).
inline constexpr std::uint64_t barrier_kind = collective_kinds;

inline std::string_view call_name(std::uint64_t kind) {
  if (kind == barrier_kind) return "barrier";
  if (kind < collective_kinds) return name_of(static_cast<collective>(kind));
  return "?";
}

inline std::string_view reduce_op_name(std::uint64_t op) {
  switch (op) {
    case static_cast<std::uint64_t>(reduce_op::sum): return "sum";
    case static_cast<std::uint64_t>(reduce_op::max): return "max";
    case static_cast<std::uint64_t>(reduce_op::min): return "min";
    default: return "?";
  }
}

// splitmix64's finaliser: cheap, and every input bit affects every output bit.
constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27U)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31U);
}
constexpr std::uint64_t hash_combine(std::uint64_t seed, std::uint64_t value) {
  return mix(seed ^ mix(value + 0x632be59bd9b4e019ULL));
}
inline std::uint64_t hash_name(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}
// One entry of the all_to_all count matrix. Rank j adds pair(j, k, send_counts[k]) over k,
// rank k adds pair(j, k, recv_counts[j]) over j; the two global sums agree exactly when the
// matrices agree (barring a 2^-64 accident), and each rank contributes just two words.
constexpr std::uint64_t count_pair(std::uint64_t from, std::uint64_t to, std::uint64_t count) {
  return hash_combine(hash_combine(mix(from), to), count);
}

inline constexpr std::uint64_t int_max = INT_MAX;

// A buffer that a never-completing MPI request may still touch must never be freed: leak it,
// on purpose (this only happens after a collective_timeout).
template <class T>
void keep_forever(T&& value) {
  static_cast<void>(new std::decay_t<T>(std::forward<T>(value)));  // NOLINT
}

// One rank's collective call after validation: everything MPI needs, type-erased so that the
// plumbing below is compiled once instead of once per element type.
struct mpi_call {
  std::uint64_t kind = 0;
  dtype type = dtype::f32;
  std::size_t element_bytes = 0;
  MPI_Datatype datatype = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  reduce_op reduction = reduce_op::sum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  int count = 0;         // block of the even variants; whole count of all_reduce and broadcast
  bool varying = false;  // use the v-variant with the arrays below
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  std::uint64_t elements = 0;  // the count shown in messages (all_to_all: elements sent)
  std::uint64_t bytes = 0;     // what this rank sends, per communicator.hpp's model
  std::string invalid;         // why the buffers do not fit; empty when they do
  source_site where;           // the caller's call of the public entry point
  std::string context;         // checked mode: collective_context::current()'s text

  // For the fingerprint (counts_key always: the schedule's record; the rest in checked mode).
  std::uint64_t counts_key = 0;                      // hash of the counts; all_to_all: counts given
  std::vector<std::uint64_t> counts_shown;           // the counts, when uneven (messages show 4)
  std::uint64_t pairs_sent = 0, pairs_received = 0;  // all_to_all, see count_pair
  std::vector<std::uint64_t> send_row, recv_row;     // all_to_all, for a detailed message
};

struct call_site {
  std::size_t size;
  std::size_t rank;
  bool checked;
};

inline void reject(mpi_call& call, std::string why) {
  if (call.invalid.empty()) call.invalid = std::move(why);
}
inline std::string too_large(std::string_view what, std::uint64_t value) {
  return message(what, " = ", value, " exceeds INT_MAX (", int_max,
                 "), the largest count MPI accepts");
}

inline std::uint64_t hash_counts(std::span<const std::size_t> counts) {
  std::uint64_t h = mix(counts.size());
  for (const std::size_t c : counts) h = hash_combine(h, c);
  return h;
}
inline std::uint64_t hash_equal_counts(std::size_t n, std::uint64_t each) {
  std::uint64_t h = mix(n);
  for (std::size_t i = 0; i < n; ++i) h = hash_combine(h, each);
  return h;
}

// Fills int count/displacement arrays from counts; false (with call.invalid set) when a
// count or an offset does not fit an int.
inline bool to_int_counts(mpi_call& call, std::span<const std::size_t> counts,
                          std::string_view what, std::vector<int>& ints, std::vector<int>* displs) {
  ints.resize(counts.size());
  if (displs != nullptr) displs->resize(counts.size());
  std::uint64_t offset = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] > int_max) {
      reject(call, too_large(message(what, "[", j, "]"), counts[j]));
      return false;
    }
    if (displs != nullptr) {
      if (offset > int_max) {
        reject(call, too_large(message("the offset of ", what, "[", j, "]"), offset));
        return false;
      }
      (*displs)[j] = static_cast<int>(offset);
    }
    ints[j] = static_cast<int>(counts[j]);
    offset += counts[j];
  }
  return true;
}

// Checked before the sizes: a count MPI cannot take is the root problem, whatever else is off.
inline bool counts_fit_int(mpi_call& call, std::span<const std::size_t> counts) {
  for (std::size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] > int_max) {
      reject(call, too_large(message("counts[", j, "]"), counts[j]));
      return false;
    }
  }
  return true;
}

inline bool all_equal(std::span<const std::size_t> counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}
inline std::uint64_t sum_of(std::span<const std::size_t> counts) {
  std::uint64_t total = 0;
  for (const std::size_t c : counts) total += c;
  return total;
}

inline void prepare_all_gather(mpi_call& call, const call_site& at, std::size_t send_n,
                               std::size_t recv_n, std::span<const std::size_t> counts) {
  const std::size_t n = at.size;
  call.elements = recv_n;
  call.bytes = (n - 1) * send_n * call.element_bytes;
  call.count = static_cast<int>(std::min<std::uint64_t>(send_n, int_max));
  if (send_n > int_max) reject(call, too_large("the send buffer's size", send_n));
  if (counts.empty()) {
    if (recv_n != n * send_n) {
      reject(call, message("recv buffer has ", recv_n, " elements, expected ", n * send_n, " = ", n,
                           " ranks x ", send_n, " (the send buffer's size)"));
    }
    call.counts_key = hash_equal_counts(n, send_n);
    return;
  }
  if (counts.size() != n) {
    reject(call,
           message("counts has ", counts.size(), " entries, expected one per rank (", n, ")"));
    return;
  }
  if (!counts_fit_int(call, counts)) return;
  const std::uint64_t total = sum_of(counts);
  call.elements = total;
  if (counts[at.rank] != send_n) {
    reject(call, message("send buffer has ", send_n, " elements, but counts[", at.rank,
                         "] = ", counts[at.rank]));
  }
  if (total != recv_n) {
    reject(call, message("recv buffer has ", recv_n, " elements, but the counts sum to ", total));
  }
  call.counts_key = hash_counts(counts);
  if (all_equal(counts)) return;  // the same on every rank that agrees on counts: even variant
  call.varying = true;
  if (at.checked) call.counts_shown.assign(counts.begin(), counts.end());
  to_int_counts(call, counts, "counts", call.recv_counts, &call.recv_displs);
}

inline void prepare_reduce_scatter(mpi_call& call, const call_site& at, std::size_t send_n,
                                   std::size_t recv_n, std::span<const std::size_t> counts) {
  const std::size_t n = at.size;
  call.elements = send_n;
  call.count = static_cast<int>(std::min<std::uint64_t>(recv_n, int_max));
  if (recv_n > int_max) reject(call, too_large("the recv buffer's size", recv_n));
  if (counts.empty()) {
    if (send_n != n * recv_n) {
      reject(call, message("send buffer has ", send_n, " elements, expected ", n * recv_n, " = ", n,
                           " ranks x ", recv_n, " (the recv buffer's size)"));
    }
    call.bytes = (send_n - std::min(send_n, recv_n)) * call.element_bytes;
    call.counts_key = hash_equal_counts(n, recv_n);
    return;
  }
  if (counts.size() != n) {
    reject(call,
           message("counts has ", counts.size(), " entries, expected one per rank (", n, ")"));
    return;
  }
  if (!counts_fit_int(call, counts)) return;
  const std::uint64_t total = sum_of(counts);
  call.bytes = (total - counts[at.rank]) * call.element_bytes;
  if (counts[at.rank] != recv_n) {
    reject(call, message("recv buffer has ", recv_n, " elements, but counts[", at.rank,
                         "] = ", counts[at.rank]));
  }
  if (total != send_n) {
    reject(call, message("send buffer has ", send_n, " elements, but the counts sum to ", total));
  }
  call.counts_key = hash_counts(counts);
  if (all_equal(counts)) return;
  call.varying = true;
  if (at.checked) call.counts_shown.assign(counts.begin(), counts.end());
  to_int_counts(call, counts, "counts", call.recv_counts, nullptr);
}

inline void prepare_all_reduce(mpi_call& call, const call_site& at, std::size_t total) {
  const std::size_t n = at.size;
  call.elements = total;
  call.count = static_cast<int>(std::min<std::uint64_t>(total, int_max));
  if (total > int_max) reject(call, too_large("the buffer's size", total));
  // Balanced split of total into n chunks: chunk r = total/n + (r < total%n).
  const std::size_t my_chunk = total / n + (at.rank < total % n ? 1 : 0);
  call.bytes = 2 * (total - my_chunk) * call.element_bytes;
}

inline void prepare_broadcast(mpi_call& call, const call_site& at, std::size_t total, int root) {
  const std::size_t n = at.size;
  call.elements = total;
  call.root = root;
  call.count = static_cast<int>(std::min<std::uint64_t>(total, int_max));
  if (total > int_max) reject(call, too_large("the buffer's size", total));
  if (root < 0 || static_cast<std::size_t>(root) >= n) {
    reject(call, message("root ", root, " is not a rank of this communicator (size ", n, ")"));
    call.root = 0;
    return;
  }
  // Pipelined ring from the root: everyone forwards except the last rank before the root.
  const auto r = static_cast<std::size_t>(root);
  const bool last = at.rank == (r + n - 1) % n;
  call.bytes = (n == 1 || (last && at.rank != r)) ? 0 : total * call.element_bytes;
}

// One side of an all_to_all with explicit counts; a missing side means equal blocks.
inline bool all_to_all_side(mpi_call& call, const call_site& at, std::span<const std::size_t> given,
                            std::size_t buffer_n, std::string_view side, std::vector<int>& counts,
                            std::vector<int>& displs, std::vector<std::size_t>& effective) {
  const std::size_t n = at.size;
  if (given.empty()) {
    if (buffer_n % n != 0) {
      reject(call, message(side, " buffer has ", buffer_n, " elements, not divisible into ", n,
                           " equal blocks (pass ", side, "_counts)"));
      return false;
    }
    effective.assign(n, buffer_n / n);
  } else if (given.size() != n) {
    reject(call, message(side, "_counts has ", given.size(), " entries, expected one per rank (", n,
                         ")"));
    return false;
  } else {
    effective.assign(given.begin(), given.end());
  }
  const std::uint64_t total = sum_of(effective);
  if (total != buffer_n) {
    reject(call, message(side, " buffer has ", buffer_n, " elements, but ", side, "_counts sum to ",
                         total));
    return false;
  }
  return to_int_counts(call, effective, message(side, "_counts"), counts, &displs);
}

inline void fill_pairs(mpi_call& call, const call_site& at, std::span<const std::size_t> sends,
                       std::span<const std::size_t> receives) {
  for (std::size_t k = 0; k < sends.size(); ++k)
    call.pairs_sent += count_pair(at.rank, k, sends[k]);
  for (std::size_t j = 0; j < receives.size(); ++j) {
    call.pairs_received += count_pair(j, at.rank, receives[j]);
  }
  call.send_row.assign(sends.begin(), sends.end());
  call.recv_row.assign(receives.begin(), receives.end());
}

inline void prepare_all_to_all(mpi_call& call, const call_site& at, std::size_t send_n,
                               std::span<const std::size_t> send_counts, std::size_t recv_n,
                               std::span<const std::size_t> recv_counts) {
  const std::size_t n = at.size;
  call.elements = send_n;
  if (send_counts.empty() && recv_counts.empty()) {
    const std::size_t block = send_n / n;
    call.count = static_cast<int>(std::min<std::uint64_t>(block, int_max));
    call.bytes = (n - 1) * block * call.element_bytes;
    if (send_n % n != 0) {
      reject(call, message("send buffer has ", send_n, " elements, not divisible into ", n,
                           " equal blocks (pass send_counts)"));
    } else if (recv_n != send_n) {
      reject(call, message("recv buffer has ", recv_n, " elements, expected ", send_n, " = ", n,
                           " blocks of ", block));
    } else if (block > int_max) {
      reject(call, too_large("the block size", block));
    }
    if (at.checked) {
      const std::vector<std::size_t> row(n, block);
      fill_pairs(call, at, row, row);
    }
    return;
  }
  // Explicit counts always take MPI_Alltoallv: unlike all_gather's shared counts, one rank's
  // counts being equal says nothing about another's, and every rank must pick the same call.
  call.varying = true;
  call.counts_key = 1;
  std::vector<std::size_t> sends, receives;
  const bool sends_ok = all_to_all_side(call, at, send_counts, send_n, "send", call.send_counts,
                                        call.send_displs, sends);
  const bool receives_ok = all_to_all_side(call, at, recv_counts, recv_n, "recv", call.recv_counts,
                                           call.recv_displs, receives);
  if (sends_ok) {
    for (std::size_t j = 0; j < n; ++j) {
      if (j != at.rank) call.bytes += sends[j] * call.element_bytes;
    }
  }
  if (at.checked && sends_ok && receives_ok) {
    call.counts_shown = std::vector<std::uint64_t>(sends.begin(), sends.end());
    fill_pairs(call, at, sends, receives);
  }
}

inline int start_call(const mpi_call& c, MPI_Comm comm, MPI_Request* request) {
  switch (c.kind) {
    case static_cast<std::uint64_t>(collective::all_gather):
      return c.varying ? MPI_Iallgatherv(c.send, c.count, c.datatype, c.recv, c.recv_counts.data(),
                                         c.recv_displs.data(), c.datatype, comm, request)
                       : MPI_Iallgather(c.send, c.count, c.datatype, c.recv, c.count, c.datatype,
                                        comm, request);
    case static_cast<std::uint64_t>(collective::reduce_scatter):
      return c.varying ? MPI_Ireduce_scatter(c.send, c.recv, c.recv_counts.data(), c.datatype, c.op,
                                             comm, request)
                       : MPI_Ireduce_scatter_block(c.send, c.recv, c.count, c.datatype, c.op, comm,
                                                   request);
    case static_cast<std::uint64_t>(collective::all_reduce):
      return MPI_Iallreduce(MPI_IN_PLACE, c.recv, c.count, c.datatype, c.op, comm, request);
    case static_cast<std::uint64_t>(collective::all_to_all):
      return c.varying ? MPI_Ialltoallv(c.send, c.send_counts.data(), c.send_displs.data(),
                                        c.datatype, c.recv, c.recv_counts.data(),
                                        c.recv_displs.data(), c.datatype, comm, request)
                       : MPI_Ialltoall(c.send, c.count, c.datatype, c.recv, c.count, c.datatype,
                                       comm, request);
    case static_cast<std::uint64_t>(collective::broadcast):
      return MPI_Ibcast(c.recv, c.count, c.datatype, c.root, comm, request);
    default: return MPI_Ibarrier(comm, request);
  }
}

inline int run_call(const mpi_call& c, MPI_Comm comm) {
  switch (c.kind) {
    case static_cast<std::uint64_t>(collective::all_gather):
      return c.varying
                 ? MPI_Allgatherv(c.send, c.count, c.datatype, c.recv, c.recv_counts.data(),
                                  c.recv_displs.data(), c.datatype, comm)
                 : MPI_Allgather(c.send, c.count, c.datatype, c.recv, c.count, c.datatype, comm);
    case static_cast<std::uint64_t>(collective::reduce_scatter):
      return c.varying
                 ? MPI_Reduce_scatter(c.send, c.recv, c.recv_counts.data(), c.datatype, c.op, comm)
                 : MPI_Reduce_scatter_block(c.send, c.recv, c.count, c.datatype, c.op, comm);
    case static_cast<std::uint64_t>(collective::all_reduce):
      return MPI_Allreduce(MPI_IN_PLACE, c.recv, c.count, c.datatype, c.op, comm);
    case static_cast<std::uint64_t>(collective::all_to_all):
      return c.varying
                 ? MPI_Alltoallv(c.send, c.send_counts.data(), c.send_displs.data(), c.datatype,
                                 c.recv, c.recv_counts.data(), c.recv_displs.data(), c.datatype,
                                 comm)
                 : MPI_Alltoall(c.send, c.count, c.datatype, c.recv, c.count, c.datatype, comm);
    case static_cast<std::uint64_t>(collective::broadcast):
      return MPI_Bcast(c.recv, c.count, c.datatype, c.root, comm);
    default: return MPI_Barrier(comm);
  }
}

template <class T>
mpi_call typed_call(collective kind) {
  mpi_call call;
  call.kind = static_cast<std::uint64_t>(kind);
  call.type = dtype_of<T>();
  call.element_bytes = sizeof(T);
  call.datatype = mpi_datatype_of<T>();
  return call;
}

}  // namespace detail
}  // namespace zest
