// zest/comm/mpi_communicator.hpp — collectives over an MPI communicator.
//
//   zest::mpi_environment mpi(&argc, &argv);
//   zest::mpi_communicator dp(MPI_COMM_WORLD, "dp");
//   dp.all_gather(std::span<const float>(shard), std::span<float>(full));   // equal chunks
//   dp.reduce_scatter(std::span<const float>(grad), std::span<float>(mine), counts);
//   zest::request r = dp.iall_reduce(std::span<float>(loss)); ... r.wait();
//
// Unchecked (the default) every call checks its buffer sizes on this rank, updates the byte
// counters of communicator.hpp's model, and starts the non-blocking MPI collective: the even
// ones (MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall) for equal chunks, the
// v-variants otherwise. Counts above INT_MAX are rejected: MPI's counts are int.
//
// The watchdog (checked.hpp; always on unless ZEST_WATCHDOG_MS=0): every wait polls MPI_Test
// against a deadline, because a blocking MPI call cannot be interrupted. Past it the rank
// throws collective_timeout naming the call, the axis, the element count, the caller's
// source location and the world ranks of the axis. Before throwing, it tells the other
// ranks of the axis which call it is stuck in (a small send on a third duplicate) and
// listens for theirs for a moment, so the message says which ranks wait in the same call
// and which sent no word (skipped it, still busy, or stopped). Unchecked, a timeout leaves
// the communicator unusable: it cannot tell a skipped call from a slow one. With
// ZEST_WATCHDOG_MS=0 the blocking MPI calls are used, exactly as before the watchdog.
//
// What the default mode cannot see: ranks that pass different counts for the same call
// (an all_gather of 8x4 on one rank, 6x4 on another) are not compared, since no counts are
// exchanged; MPI then fails with a truncation error or moves wrong data. Checked mode is the
// mode that compares.
//
// Checked mode (zest::checked_mode().enabled, or set_checked(true) on one communicator) turns
// the classic silent hang into an error. Before each call, the ranks allgather a fixed-size
// fingerprint on a second, private communicator:
//
//   kind, element type, reduce op or root, hash of the axis name, call number on this
//   communicator, element count, hash of the counts, whether the buffers fit, hash of the
//   caller's collective_context (the layouts of a redistribution, the spec of an einsum),
//   and for all_to_all two sums that agree only if every recv_counts[j] matches rank j's
//   send count.
//
// Every rank receives every fingerprint, so every rank reaches the same verdict: if they
// differ, all throw collective_mismatch naming each rank's call, then (after a second
// exchange, made only then) where each rank called it, file:line and context; otherwise the real
// collective is issued non-blocking. Both waits are polled against checked_mode().watchdog
// and throw collective_timeout instead of blocking forever.
//
// Non-blocking calls in checked mode issue the fingerprint exchange at once and the data
// transfer when the request is polled. Data transfers are issued strictly in call order (a
// later request's poll first settles earlier ones), because MPI matches collectives on a
// communicator by order alone.
//
// After a collective_timeout: a call whose fingerprint exchange timed out stays queued; when
// the missing rank arrives later, a mismatching call resolves it cleanly, while an agreeing
// one cannot be served (its buffers are gone) and marks the communicator broken. A timed-out
// data transfer marks it broken at once. A broken communicator throws communicator_error on
// every further call; buffers MPI may still write into are kept alive deliberately.
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

#include "zest/comm/checked.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/comm/mpi_datatype.hpp"
#include "zest/comm/mpi_environment.hpp"
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
  source_site where;  // the caller's call of the public entry point
  std::string context;         // checked mode: collective_context::current()'s text

  // Filled only in checked mode, for the fingerprint.
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
    if (at.checked) call.counts_key = hash_equal_counts(n, send_n);
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
  if (at.checked) call.counts_key = hash_counts(counts);
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
    if (at.checked) call.counts_key = hash_equal_counts(n, recv_n);
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
  if (at.checked) call.counts_key = hash_counts(counts);
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

// The fingerprint: fixed size, so one MPI_Iallgather carries every rank's.
namespace fp {
inline constexpr std::size_t version = 0, kind = 1, type = 2, op_or_root = 3, axis = 4, number = 5,
                             elements = 6, counts = 7, invalid = 8, pairs_sent = 9,
                             pairs_received = 10, context = 11, counts_size = 12, first_count = 13,
                             site = 17, words = 49;
inline constexpr std::size_t shown_counts = site - first_count;
// Where the rank made its call, for a mismatch's message: "at file:line in <context>", as
// characters (truncated, zero-terminated). It travels with every fingerprint because a
// verdict may not need a second round: a rank that gave up on a call (timeout) decides it
// only when it makes its next call, long after the others.
inline constexpr std::size_t site_chars = (words - site) * sizeof(std::uint64_t);
inline constexpr std::uint64_t current_version = 0x7a65737402ULL;  // "zest" 2
}  // namespace fp
using fingerprint = std::array<std::uint64_t, fp::words>;

using watchdog_clock = std::chrono::steady_clock;

// "comm/checked_mode_test.cpp:120": the last two parts of the caller's path, and the line.
inline std::string site_of(const source_site& where) {
  std::string_view file = where.file_name();
  if (const auto last = file.rfind('/'); last != std::string_view::npos && last > 0) {
    if (const auto before = file.rfind('/', last - 1); before != std::string_view::npos) {
      file.remove_prefix(before + 1);
    }
  }
  return message(file, ':', where.line());
}

// Ranks as runs: "0-3", "1,3", "0,2-5".
inline std::string rank_list(std::span<const int> ranks) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t end = i + 1;
    while (end < ranks.size() && ranks[end] == ranks[end - 1] + 1) ++end;
    out << (i == 0 ? "" : ",") << ranks[i];
    if (end - i > 1) out << '-' << ranks[end - 1];
    i = end;
  }
  return out.str();
}

// "rank 0: <text 0>; ranks 1-3: <text 1>": each rank's text, runs of equal texts merged
// (always, or only beyond 16 ranks).
template <class TextOf>
std::string per_rank(std::size_t size, TextOf text_of, bool merge_always) {
  std::ostringstream out;
  std::size_t r = 0;
  while (r < size) {
    const std::string what = text_of(r);
    std::size_t end = r + 1;
    if (merge_always || size > 16) {
      while (end < size && text_of(end) == what) ++end;
    }
    out << (r == 0 ? "" : "; ");
    if (end - r == 1) out << "rank " << r << ": " << what;
    else out << "ranks " << r << "-" << end - 1 << ": " << what;
    r = end;
  }
  return out.str();
}

// A checked call between its fingerprint exchange and the end of its data transfer.
struct checked_op {
  enum class stage : std::uint8_t { checking, moving, done, failed };

  mpi_call call;
  fingerprint mine{};
  std::vector<std::uint64_t> all;  // every rank's fingerprint, rank-major
  MPI_Request check_request = MPI_REQUEST_NULL;
  MPI_Request data_request = MPI_REQUEST_NULL;
  stage at = stage::checking;
  bool abandoned = false;  // its caller gave up (timeout): its buffers may be gone
  bool counted = false;    // in the stats (taken back if the call fails the check)
  std::exception_ptr error;
};

// State shared by a communicator and its requests in flight, so that moving the
// communicator or outliving it with a request stays safe.
class mpi_core {
 public:
  mpi_core(MPI_Comm comm, std::string axis) : name_(std::move(axis)), name_hash_(hash_name(name_)) {
    if (comm == MPI_COMM_NULL) {
      throw communicator_error(message("zest: mpi_communicator '", name_, "': MPI_COMM_NULL"));
    }
    check_code(MPI_Comm_dup(comm, &data_), "MPI_Comm_dup");
    if (const int code = MPI_Comm_dup(comm, &check_); code != MPI_SUCCESS) {
      MPI_Comm_free(&data_);
      check_code(code, "MPI_Comm_dup");
    }
    if (const int code = MPI_Comm_dup(comm, &report_); code != MPI_SUCCESS) {
      MPI_Comm_free(&check_);
      MPI_Comm_free(&data_);
      check_code(code, "MPI_Comm_dup");
    }
    // Errors come back as codes and leave as communicator_error naming the axis.
    for (MPI_Comm c : {data_, check_, report_}) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    int size = 0, rank = 0;
    MPI_Comm_size(data_, &size);
    MPI_Comm_rank(data_, &rank);
    size_ = static_cast<std::size_t>(size);
    rank_ = static_cast<std::size_t>(rank);
    // The world ranks of this communicator's ranks, for messages.
    world_ranks_.resize(size_);
    std::vector<int> mine(size_);
    for (std::size_t r = 0; r < size_; ++r) mine[r] = static_cast<int>(r);
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(data_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(group, size, mine.data(), world, world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
  }

  mpi_core(const mpi_core&) = delete;
  mpi_core& operator=(const mpi_core&) = delete;

  ~mpi_core() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized != 0) return;  // MPI already released everything
    // An op whose exchange never completed may still be written by MPI: leak it on purpose.
    auto keep_if_pending = [](const std::shared_ptr<checked_op>& op) {
      int check_done = 0, data_done = 0;
      MPI_Test(&op->check_request, &check_done, MPI_STATUS_IGNORE);
      MPI_Test(&op->data_request, &data_done, MPI_STATUS_IGNORE);
      if (check_done == 0 || data_done == 0) keep_forever(op);
    };
    for (const auto& op : undecided_) keep_if_pending(op);
    for (const auto& op : stranded_) keep_if_pending(op);
    drain_reports();
    MPI_Comm_free(&report_);
    MPI_Comm_free(&check_);
    MPI_Comm_free(&data_);
  }

  // Receives the timeout reports (who_else) that arrived and were never listened for, so
  // that MPI does not complain of unmatched messages at MPI_Finalize.
  void drain_reports() const {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, report_tag, report_, &flag, &status) != MPI_SUCCESS ||
          flag == 0) {
        return;
      }
      std::uint64_t at = 0;
      MPI_Recv(&at, 1, MPI_UINT64_T, status.MPI_SOURCE, report_tag, report_, MPI_STATUS_IGNORE);
    }
  }

  MPI_Comm data() const { return data_; }
  const std::string& name() const { return name_; }
  int size() const { return static_cast<int>(size_); }
  int rank() const { return static_cast<int>(rank_); }
  const comm_stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  std::optional<bool> checked_override() const { return checked_override_; }
  void set_checked(std::optional<bool> on) { checked_override_ = on; }
  bool checked() const { return checked_override_.value_or(checked_mode().enabled); }
  call_site site() const { return {size_, rank_, checked()}; }

  // Blocking call.
  void run(mpi_call call) {
    ensure_usable(call);
    if (!checked()) {
      if (!call.invalid.empty()) throw_invalid(call);
      settle_all();
      count(call);
      const std::uint64_t number = next_number_++;
      if (checked_mode().watchdog.count() == 0) {  // no deadline: MPI's blocking call
        check_code(run_call(call, data_), call);
        return;
      }
      MPI_Request pending = MPI_REQUEST_NULL;
      check_code(start_call(call, data_, &pending), call);
      try {
        wait_plain(pending, true, call, number);
      } catch (...) {
        keep_forever(std::move(call));  // MPI may still read its count arrays
        throw;
      }
      return;
    }
    const auto op = begin_checked(std::move(call));
    if (!op->call.invalid.empty()) finish_invalid(op);
    try {
      poll(*op, true);
    } catch (...) {
      abandon(op);
      throw;
    }
  }

  // Non-blocking call: the returned request's poll drives it.
  static request start(const std::shared_ptr<mpi_core>& core, mpi_call call) {
    core->ensure_usable(call);
    if (!core->checked()) {
      if (!call.invalid.empty()) core->throw_invalid(call);
      core->settle_all();
      core->count(call);
      ++core->next_number_;
      auto state = std::make_shared<plain_request>(core, std::move(call), core->next_number_ - 1);
      state->core->check_code(start_call(state->call, core->data_, &state->request), state->call);
      return request([state](bool block) { return state->poll(block); });
    }
    auto op = core->begin_checked(std::move(call));
    if (!op->call.invalid.empty()) core->finish_invalid(op);
    auto state = std::make_shared<checked_request>(core, std::move(op));
    return request([state](bool block) { return state->core->poll(*state->op, block); });
  }

 private:
  struct plain_request {
    plain_request(std::shared_ptr<mpi_core> c, mpi_call m, std::uint64_t n)
        : core(std::move(c)), call(std::move(m)), number(n) {}
    plain_request(const plain_request&) = delete;
    plain_request& operator=(const plain_request&) = delete;
    // Unfinished (after a timeout): MPI may still read the count arrays.
    ~plain_request() {
      if (request != MPI_REQUEST_NULL) keep_forever(std::move(call));
    }
    std::shared_ptr<mpi_core> core;
    mpi_call call;  // owns the count arrays MPI reads until completion
    MPI_Request request = MPI_REQUEST_NULL;
    std::uint64_t number = 0;

    bool poll(bool block) { return core->wait_plain(request, block, call, number); }
  };

  struct checked_request {
    checked_request(std::shared_ptr<mpi_core> c, std::shared_ptr<checked_op> o)
        : core(std::move(c)), op(std::move(o)) {}
    checked_request(const checked_request&) = delete;
    checked_request& operator=(const checked_request&) = delete;
    // The request already waited (and timed out) before it dies unfinished.
    ~checked_request() { core->abandon(op); }
    std::shared_ptr<mpi_core> core;
    std::shared_ptr<checked_op> op;
  };

  // ---- errors -------------------------------------------------------------------------

  void check_code(int code, std::string_view what) const {
    if (code == MPI_SUCCESS) return;
    std::array<char, MPI_MAX_ERROR_STRING> text{};
    int length = 0;
    MPI_Error_string(code, text.data(), &length);
    throw communicator_error(
        message("zest: ", what, " on axis '", name_, "' (rank ", rank_, " of ", size_,
                "): MPI error: ", std::string_view(text.data(), static_cast<std::size_t>(length))));
  }
  void check_code(int code, const mpi_call& call) const { check_code(code, call_name(call.kind)); }

  [[noreturn]] void throw_invalid(const mpi_call& call) const {
    throw communicator_error(message("zest: ", call_name(call.kind), " on axis '", name_,
                                     "' (rank ", rank_, " of ", size_, "): ", call.invalid));
  }

  void ensure_usable(const mpi_call& call) const {
    if (broken_.empty()) return;
    throw communicator_error(message("zest: ", call_name(call.kind), " on axis '", name_,
                                     "' (rank ", rank_, " of ", size_,
                                     "): the communicator is unusable: ", broken_));
  }

  static std::string seconds(watchdog_clock::duration d) {
    std::ostringstream out;
    out << std::fixed << std::setprecision(1) << std::chrono::duration<double>(d).count();
    return out.str();
  }

  // The message of a wait that passed its deadline. Before it is thrown, this rank tells
  // the others which call it is stuck in and listens briefly for theirs (report_), so the
  // message can say which ranks arrived.
  collective_timeout timeout(const mpi_call& call, const fingerprint& f,
                             watchdog_clock::time_point started, std::string_view phase) const {
    const std::string waited = seconds(watchdog_clock::now() - started);
    const std::string others = who_else(f[fp::number]);
    return collective_timeout(
        message("zest: collective timeout on axis '", name_, "': ", describe(f.data()), " on rank ",
                rank_, " of ", size_, " not complete after ", waited, " s", phase, "; called at ",
                site_of(call.where), "; the axis spans world ranks ", rank_list(world_ranks_),
                others, ". ZEST_WATCHDOG_MS sets the deadline (now ",
                checked_mode().watchdog.count(), " ms; 0: none)"));
  }
  collective_timeout timeout(const checked_op& op, watchdog_clock::time_point started,
                             bool exchanging) const {
    return timeout(
        op.call, op.mine, started,
        exchanging ? " (checking the call: some rank of this communicator has not reached it; it "
                     "skipped it or is blocked in another collective)"
                   : " (moving the data: all ranks agreed on the call, but it did not finish)");
  }

  // After a timeout in call #number: "; ranks 0,2 wait in this call too; no word from rank 1
  // (...)". Reports are small eager sends on report_ that nobody waits for.
  std::string who_else(std::uint64_t number) const {
    if (size_ < 2) return "";
    auto* mine = new std::uint64_t(number);  // NOLINT: MPI may read it at any time: kept forever
    for (std::size_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request sent = MPI_REQUEST_NULL;
      if (MPI_Isend(mine, 1, MPI_UINT64_T, static_cast<int>(r), report_tag, report_, &sent) ==
          MPI_SUCCESS) {
        MPI_Request_free(&sent);
      }
    }
    std::vector<std::optional<std::uint64_t>> heard(size_);
    const auto listen = std::clamp<std::chrono::milliseconds>(
        checked_mode().watchdog / 10, std::chrono::milliseconds(20), std::chrono::seconds(1));
    const auto until = watchdog_clock::now() + listen;
    const auto all_here = [&] {
      for (std::size_t r = 0; r < size_; ++r) {
        if (r != rank_ && heard[r] != number) return false;
      }
      return true;
    };
    while (!all_here() && watchdog_clock::now() < until) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, report_tag, report_, &flag, &status) != MPI_SUCCESS) break;
      if (flag == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      std::uint64_t at = 0;
      if (MPI_Recv(&at, 1, MPI_UINT64_T, status.MPI_SOURCE, report_tag, report_,
                   MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        break;
      }
      heard[static_cast<std::size_t>(status.MPI_SOURCE)] = at;  // the latest report wins
    }
    std::vector<int> here, silent;
    std::ostringstream elsewhere;
    for (std::size_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (!heard[r]) {
        silent.push_back(static_cast<int>(r));
      } else if (*heard[r] == number) {
        here.push_back(static_cast<int>(r));
      } else {
        elsewhere << "; rank " << r << " waits in call #" << *heard[r] << " instead";
      }
    }
    std::ostringstream out;
    if (!here.empty()) out << "; ranks " << rank_list(here) << " of the axis wait in this call too";
    out << elsewhere.str();
    if (!silent.empty()) {
      out << "; no word from ranks " << rank_list(silent) << " of the axis within "
          << listen.count()
          << " ms (they skipped this call, are still busy before it, or have stopped)";
    }
    return out.str();
  }

  // Waits for the data transfer of an unchecked call; block=false polls once. Past the
  // deadline the communicator is unusable (the ranks' calls no longer line up): throws.
  bool wait_plain(MPI_Request& pending, bool block, const mpi_call& call, std::uint64_t number) {
    int done = 0;
    check_code(MPI_Test(&pending, &done, MPI_STATUS_IGNORE), call);
    if (done != 0) return true;
    if (!block) return false;
    ensure_usable(call);  // another call timed out: do not wait again for a stuck transfer
    const auto limit = checked_mode().watchdog;
    if (limit.count() == 0) {
      check_code(MPI_Wait(&pending, MPI_STATUS_IGNORE), call);
      return true;
    }
    const auto started = watchdog_clock::now();
    if (wait_until(pending, true, started + limit, call)) return true;
    const fingerprint f = fingerprint_of(call, number);
    broken_ = message(describe(f.data()), " timed out");
    throw timeout(call, f, started, "");
  }

  // ---- accounting ---------------------------------------------------------------------

  void count(const mpi_call& call) {
    if (call.kind >= collective_kinds) return;
    auto& counter = stats_[static_cast<collective>(call.kind)];
    counter.calls += 1;
    counter.bytes_sent += call.bytes;
  }
  void uncount(checked_op& op) {
    if (!op.counted || op.call.kind >= collective_kinds) return;
    auto& counter = stats_[static_cast<collective>(op.call.kind)];
    counter.calls -= 1;
    counter.bytes_sent -= op.call.bytes;
    op.counted = false;
  }

  // ---- checked mode -------------------------------------------------------------------

  // What this rank calls, as the fingerprint checked mode exchanges (and messages describe).
  fingerprint fingerprint_of(const mpi_call& c, std::uint64_t number) const {
    fingerprint f{};
    f[fp::version] = fp::current_version;
    f[fp::kind] = c.kind;
    f[fp::type] = c.kind == barrier_kind ? 0 : static_cast<std::uint64_t>(c.type);
    f[fp::op_or_root] = c.kind == static_cast<std::uint64_t>(collective::broadcast)
                            ? static_cast<std::uint64_t>(c.root)
                            : static_cast<std::uint64_t>(c.reduction);
    f[fp::axis] = name_hash_;
    f[fp::number] = number;
    f[fp::elements] = c.elements;
    f[fp::counts] = c.counts_key;
    f[fp::invalid] = c.invalid.empty() ? 0 : 1;
    f[fp::pairs_sent] = c.pairs_sent;
    f[fp::pairs_received] = c.pairs_received;
    f[fp::counts_size] = c.counts_shown.size();
    for (std::size_t i = 0; i < fp::shown_counts && i < c.counts_shown.size(); ++i) {
      f[fp::first_count + i] = c.counts_shown[i];
    }
    f[fp::context] = c.context.empty() ? 0 : hash_name(c.context);
    std::string text = "at " + site_of(c.where);
    if (!c.context.empty()) text += " in " + c.context;
    std::memcpy(&f[fp::site], text.data(), std::min(text.size(), fp::site_chars - 1));
    return f;
  }

  std::shared_ptr<checked_op> begin_checked(mpi_call call) {
    auto op = std::make_shared<checked_op>();
    op->call = std::move(call);
    if (const collective_context* context = collective_context::current()) {
      op->call.context = context->text();
    }
    const mpi_call& c = op->call;
    const fingerprint& f = op->mine = fingerprint_of(c, next_number_++);
    op->all.resize(size_ * fp::words);
    constexpr int words = static_cast<int>(fp::words);
    check_code(MPI_Iallgather(f.data(), words, MPI_UINT64_T, op->all.data(), words, MPI_UINT64_T,
                              check_, &op->check_request),
               c);
    if (c.invalid.empty()) {
      count(c);
      op->counted = true;
    }
    undecided_.push_back(op);
    return op;
  }

  // This rank's buffers do not fit: still take part in the exchange, so that the other
  // ranks learn it and throw too instead of waiting, then throw the local error.
  [[noreturn]] void finish_invalid(const std::shared_ptr<checked_op>& op) {
    const auto started = watchdog_clock::now();
    try {
      settle(true, started, started + checked_mode().watchdog, op.get());
    } catch (const collective_timeout&) {
      op->abandoned = true;  // the buffer error is the more useful one to report
    }
    throw_invalid(op->call);
  }

  // Drives one checked op; returns whether it is complete. Throws its mismatch, or a timeout.
  bool poll(checked_op& op, bool block) {
    const auto started = watchdog_clock::now();
    const auto deadline = started + checked_mode().watchdog;
    if (op.at == checked_op::stage::checking && !settle(block, started, deadline, &op))
      return false;
    if (op.error) std::rethrow_exception(op.error);
    if (op.at == checked_op::stage::moving) {
      if (!wait_until(op.data_request, block, deadline, op.call)) {
        if (!block) return false;
        broken_ = message("the data transfer of ", describe(op.mine.data()), " timed out");
        throw timeout(op, started, false);
      }
      op.at = checked_op::stage::done;
    }
    return true;
  }

  // Unchecked calls go after every earlier checked call has issued its data transfer.
  void settle_all() {
    if (undecided_.empty()) return;
    const auto started = watchdog_clock::now();
    settle(true, started, started + checked_mode().watchdog, nullptr);
  }

  // Decides the queued checked calls in call order, up to `until` (all when null). False
  // when a non-blocking poll finds an exchange still in flight.
  bool settle(bool block, watchdog_clock::time_point started, watchdog_clock::time_point deadline,
              const checked_op* until) {
    while (!undecided_.empty()) {
      const auto front = undecided_.front();
      if (!wait_until(front->check_request, block, deadline, front->call)) {
        if (!block) return false;
        throw timeout(*front, started, true);
      }
      undecided_.pop_front();
      decide(*front, started, deadline);
      if (front.get() == until) break;
    }
    return true;
  }

  static bool same_call(const std::uint64_t* a, const std::uint64_t* b) {
    for (const std::size_t w : {fp::version, fp::kind, fp::type, fp::op_or_root, fp::axis,
                                fp::number, fp::counts, fp::invalid, fp::context}) {
      if (a[w] != b[w]) return false;
    }
    // all_to_all's element count legitimately differs per rank; its pairs decide instead.
    return a[fp::kind] == static_cast<std::uint64_t>(collective::all_to_all) ||
           a[fp::elements] == b[fp::elements];
  }

  // What a fingerprint says was called, e.g. "all_gather<float>[512] counts {1,3} #3".
  std::string describe(const std::uint64_t* f) const {
    std::ostringstream out;
    const std::uint64_t kind = f[fp::kind];
    out << call_name(kind);
    if (kind != barrier_kind) {
      out << '<' << name_of(static_cast<dtype>(f[fp::type])) << ">[" << f[fp::elements] << ']';
    }
    if (f[fp::counts_size] > 0) {
      out << (kind == static_cast<std::uint64_t>(collective::all_to_all) ? " send_counts {"
                                                                         : " counts {");
      for (std::size_t i = 0; i < f[fp::counts_size] && i < fp::shown_counts; ++i) {
        out << (i == 0 ? "" : ",") << f[fp::first_count + i];
      }
      out << (f[fp::counts_size] > fp::shown_counts ? ",...}" : "}");
    }
    if ((kind == static_cast<std::uint64_t>(collective::all_reduce) ||
         kind == static_cast<std::uint64_t>(collective::reduce_scatter)) &&
        f[fp::op_or_root] != static_cast<std::uint64_t>(reduce_op::sum)) {
      out << ' ' << reduce_op_name(f[fp::op_or_root]);
    }
    if (kind == static_cast<std::uint64_t>(collective::broadcast)) {
      out << " root " << f[fp::op_or_root];
    }
    out << " #" << f[fp::number];
    if (f[fp::axis] != name_hash_) out << " (on an axis with another name)";
    if (f[fp::invalid] != 0) out << " (its buffer sizes are wrong)";
    if (f[fp::version] != fp::current_version) out << " (another zest version)";
    return out.str();
  }

  // Every rank's call, in order; beyond 16 ranks, runs of identical calls are merged.
  std::string mismatch_list(const checked_op& op) const {
    return per_rank(
        size_, [&](std::size_t r) { return describe(&op.all[r * fp::words]); }, false);
  }

  // Where every rank made its call and in which context: "rank 0: at a.cpp:10 in
  // redistribute ...; rank 1: at b.cpp:20" (runs of equal sites merged).
  std::string call_sites(const checked_op& op) const {
    return per_rank(
        size_,
        [&](std::size_t r) {
          const auto* chars = reinterpret_cast<const char*>(&op.all[r * fp::words + fp::site]);
          return std::string(chars, strnlen(chars, fp::site_chars));
        },
        true);
  }

  // all_to_all with the same kind everywhere but counts that do not pair up: exchange the
  // count rows (on the data communicator, whose order every rank shares here) and say which.
  std::string all_to_all_details(const checked_op& op, watchdog_clock::time_point started,
                                 watchdog_clock::time_point deadline) {
    const std::size_t n = size_;
    std::vector<std::uint64_t> rows(2 * n, 0), all_rows(2 * n * n, 0);
    std::copy(op.call.send_row.begin(), op.call.send_row.end(), rows.begin());
    std::copy(op.call.recv_row.begin(), op.call.recv_row.end(),
              rows.begin() + static_cast<std::ptrdiff_t>(n));
    MPI_Request exchange = MPI_REQUEST_NULL;
    check_code(MPI_Iallgather(rows.data(), static_cast<int>(2 * n), MPI_UINT64_T, all_rows.data(),
                              static_cast<int>(2 * n), MPI_UINT64_T, data_, &exchange),
               op.call);
    if (!wait_until(exchange, true, deadline, op.call)) {
      keep_forever(std::move(rows));  // MPI may still read or write them
      keep_forever(std::move(all_rows));
      broken_ = "an all_to_all count check timed out";
      throw timeout(op, started, true);
    }
    return describe_count_pairing(all_rows, n);
  }

  void decide(checked_op& op, watchdog_clock::time_point started,
              watchdog_clock::time_point deadline) {
    const std::uint64_t* first = op.all.data();
    bool agree = true;
    std::uint64_t sent = 0, received = 0;
    for (std::size_t r = 0; r < size_; ++r) {
      const std::uint64_t* f = &op.all[r * fp::words];
      agree = agree && same_call(first, f);
      sent += f[fp::pairs_sent];
      received += f[fp::pairs_received];
    }
    const auto fail = [&](std::exception_ptr error) {
      op.at = checked_op::stage::failed;
      op.error = std::move(error);
      uncount(op);
    };
    const std::string prefix = message("zest: collective mismatch on axis '", name_, "': ");
    const std::string_view hint =
        " (all ranks of a communicator must make the same collective calls in the same order)";
    if (!agree) {
      fail(std::make_exception_ptr(collective_mismatch(
          message(prefix, mismatch_list(op), hint, "; called ", call_sites(op)))));
    } else if (first[fp::kind] == static_cast<std::uint64_t>(collective::all_to_all) &&
               first[fp::invalid] == 0 && sent != received) {
      fail(std::make_exception_ptr(collective_mismatch(
          message(prefix, describe(op.mine.data()), ": send and receive counts do not pair up: ",
                  all_to_all_details(op, started, deadline)))));
    } else if (!op.call.invalid.empty()) {
      // Every rank's buffers are wrong: each reports its own.
      fail(std::make_exception_ptr(communicator_error(message(
          "zest: ", call_name(op.call.kind), " on axis '", name_, "': ", op.call.invalid))));
    } else if (!broken_.empty()) {
      // Data transfers no longer line up across ranks; moving more would pair wrong calls.
      fail(std::make_exception_ptr(communicator_error(
          message("zest: ", call_name(op.call.kind), " on axis '", name_, "' (rank ", rank_, " of ",
                  size_, "): the communicator is unusable: ", broken_))));
    } else if (op.abandoned) {
      // The others will move data for this call, but our caller gave up and its buffers are gone.
      broken_ = message("rank ", rank_, " gave up on ", describe(op.mine.data()),
                        " after a collective_timeout, and the other ranks reached it later");
      fail(std::make_exception_ptr(communicator_error(broken_)));
    } else {
      check_code(start_call(op.call, data_, &op.data_request), op.call);
      op.at = checked_op::stage::moving;
    }
  }

  // Nobody will wait for op any more.
  void abandon(const std::shared_ptr<checked_op>& op) {
    if (op->at == checked_op::stage::checking) {
      op->abandoned = true;  // still queued: decided in order, without moving data
    } else if (op->at == checked_op::stage::moving) {
      int done = 0;
      MPI_Test(&op->data_request, &done, MPI_STATUS_IGNORE);
      if (done != 0) return;
      stranded_.push_back(op);
      if (broken_.empty()) {
        broken_ = message(describe(op->mine.data()), " was abandoned while moving data");
      }
    }
  }

  // Polls pending until done or the deadline: 64 polls back to back, then a yield between
  // polls (ranks may outnumber cores: tests run 4 ranks on 2, and a rank that spins keeps
  // the core from the peer it waits for; spinning for 1 ms measured 4 ms per 8-float
  // all_reduce on a loaded machine, yielding 3 us), and past 10 ms a 20 us sleep.
  bool wait_until(MPI_Request& pending, bool block, watchdog_clock::time_point deadline,
                  const mpi_call& call) const {
    const auto started = watchdog_clock::now();
    for (unsigned polls = 0;; ++polls) {
      int done = 0;
      check_code(MPI_Test(&pending, &done, MPI_STATUS_IGNORE), call);
      if (done != 0) return true;
      if (!block) return false;
      if (polls < 64) continue;
      const auto now = watchdog_clock::now();
      if (now >= deadline) return false;
      if (now - started < std::chrono::milliseconds(10)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  MPI_Comm data_ = MPI_COMM_NULL;
  MPI_Comm check_ = MPI_COMM_NULL;
  MPI_Comm report_ = MPI_COMM_NULL;  // where a timed-out rank says which call it is stuck in
  static constexpr int report_tag = 0x7a;
  std::vector<int> world_ranks_;  // world rank of each rank of this communicator
  std::string name_;
  std::uint64_t name_hash_ = 0;
  std::size_t size_ = 1;
  std::size_t rank_ = 0;
  comm_stats stats_;
  std::uint64_t next_number_ = 0;
  std::optional<bool> checked_override_;
  std::deque<std::shared_ptr<checked_op>> undecided_;  // checked calls in order, exchange pending
  std::vector<std::shared_ptr<checked_op>> stranded_;  // abandoned with data in flight
  std::string broken_;  // why the communicator is unusable; empty while it is fine
};

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

// Collectives over an MPI communicator (a mesh axis or the world). See the top of this file.
// Requests may outlive the communicator (they share its state) but not MPI_Finalize; a
// moved-from communicator may only be assigned to or destroyed.
class mpi_communicator {
 public:
  // Duplicates comm twice (data, and checked mode's exchanges), so zest's traffic never
  // matches the application's; the duplicates are freed with the communicator.
  mpi_communicator(MPI_Comm comm, std::string name)
      : core_(std::make_shared<detail::mpi_core>(comm, std::move(name))) {}

  mpi_communicator(mpi_communicator&&) noexcept = default;
  mpi_communicator& operator=(mpi_communicator&&) noexcept = default;
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  ~mpi_communicator() = default;

  int size() const { return core_->size(); }
  int rank() const { return core_->rank(); }
  const std::string& name() const { return core_->name(); }
  const comm_stats& stats() const { return core_->stats(); }
  void reset_stats() { core_->reset_stats(); }
  // The duplicate that carries the data.
  MPI_Comm native() const { return core_->data(); }

  // Checked mode for this communicator only: true/false override checked_mode().enabled,
  // nullopt follows it again. Every rank must make the same choice.
  void set_checked(std::optional<bool> on) { core_->set_checked(on); }
  std::optional<bool> checked_override() const { return core_->checked_override(); }
  bool checked() const { return core_->checked(); }

  // Element type T is deduced from the output span; inputs convert (span<T> to span<const T>).

  // recv = the ranks' send buffers in rank order; counts[r] = rank r's send size (empty: all
  // equal, recv.size() = size() * send.size()).
  template <class T>
  void all_gather(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                  std::span<const std::size_t> counts = {},
                  source_site where = source_site::current()) {
    core_->run(at(prepare_all_gather(send, recv, counts), where));
  }
  template <class T>
  request iall_gather(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                      std::span<const std::size_t> counts = {},
                      source_site where = source_site::current()) {
    return detail::mpi_core::start(core_, at(prepare_all_gather(send, recv, counts), where));
  }

  // recv = chunk rank() of the elementwise reduction of the ranks' send buffers; counts[r] =
  // the size of rank r's chunk (empty: all equal, send.size() = size() * recv.size()).
  template <class T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                      std::span<const std::size_t> counts = {}, reduce_op op = reduce_op::sum,
                      source_site where = source_site::current()) {
    core_->run(at(prepare_reduce_scatter(send, recv, counts, op), where));
  }
  template <class T>
  request ireduce_scatter(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                          std::span<const std::size_t> counts = {}, reduce_op op = reduce_op::sum,
                          source_site where = source_site::current()) {
    return detail::mpi_core::start(core_,
                                   at(prepare_reduce_scatter(send, recv, counts, op), where));
  }

  // inout = the elementwise reduction of every rank's inout.
  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op = reduce_op::sum,
                  source_site where = source_site::current()) {
    core_->run(at(prepare_all_reduce(inout, op), where));
  }
  template <class T>
  request iall_reduce(std::span<T> inout, reduce_op op = reduce_op::sum,
                      source_site where = source_site::current()) {
    return detail::mpi_core::start(core_, at(prepare_all_reduce(inout, op), where));
  }

  // Block j of send (send_counts[j] elements) goes to rank j; block j of recv comes from
  // rank j. Empty counts: equal blocks. All ranks pass counts, or none do.
  template <class T>
  void all_to_all(std::type_identity_t<std::span<const T>> send,
                  std::span<const std::size_t> send_counts, std::span<T> recv,
                  std::span<const std::size_t> recv_counts,
                  source_site where = source_site::current()) {
    core_->run(at(prepare_all_to_all(send, send_counts, recv, recv_counts), where));
  }
  template <class T>
  request iall_to_all(std::type_identity_t<std::span<const T>> send,
                      std::span<const std::size_t> send_counts, std::span<T> recv,
                      std::span<const std::size_t> recv_counts,
                      source_site where = source_site::current()) {
    return detail::mpi_core::start(
        core_, at(prepare_all_to_all(send, send_counts, recv, recv_counts), where));
  }

  // data = root's data on every rank.
  template <class T>
  void broadcast(std::span<T> data, int root,
                 source_site where = source_site::current()) {
    core_->run(at(prepare_broadcast(data, root), where));
  }
  template <class T>
  request ibroadcast(std::span<T> data, int root,
                     source_site where = source_site::current()) {
    return detail::mpi_core::start(core_, at(prepare_broadcast(data, root), where));
  }

  void barrier(source_site where = source_site::current()) {
    detail::mpi_call call;
    call.kind = detail::barrier_kind;
    core_->run(at(std::move(call), where));
  }

 private:
  static detail::mpi_call at(detail::mpi_call call, const source_site& where) {
    call.where = where;
    return call;
  }
  template <class T>
  detail::mpi_call prepare_all_gather(std::span<const T> send, std::span<T> recv,
                                      std::span<const std::size_t> counts) const {
    auto call = detail::typed_call<T>(collective::all_gather);
    call.send = send.data();
    call.recv = recv.data();
    detail::prepare_all_gather(call, core_->site(), send.size(), recv.size(), counts);
    return call;
  }
  template <class T>
  detail::mpi_call prepare_reduce_scatter(std::span<const T> send, std::span<T> recv,
                                          std::span<const std::size_t> counts, reduce_op op) const {
    auto call = detail::typed_call<T>(collective::reduce_scatter);
    call.send = send.data();
    call.recv = recv.data();
    call.reduction = op;
    call.op = mpi_op_of<T>(op);
    detail::prepare_reduce_scatter(call, core_->site(), send.size(), recv.size(), counts);
    return call;
  }
  template <class T>
  detail::mpi_call prepare_all_reduce(std::span<T> inout, reduce_op op) const {
    auto call = detail::typed_call<T>(collective::all_reduce);
    call.recv = inout.data();
    call.reduction = op;
    call.op = mpi_op_of<T>(op);
    detail::prepare_all_reduce(call, core_->site(), inout.size());
    return call;
  }
  template <class T>
  detail::mpi_call prepare_all_to_all(std::span<const T> send,
                                      std::span<const std::size_t> send_counts, std::span<T> recv,
                                      std::span<const std::size_t> recv_counts) const {
    auto call = detail::typed_call<T>(collective::all_to_all);
    call.send = send.data();
    call.recv = recv.data();
    detail::prepare_all_to_all(call, core_->site(), send.size(), send_counts, recv.size(),
                               recv_counts);
    return call;
  }
  template <class T>
  detail::mpi_call prepare_broadcast(std::span<T> data, int root) const {
    auto call = detail::typed_call<T>(collective::broadcast);
    call.recv = data.data();
    detail::prepare_broadcast(call, core_->site(), data.size(), root);
    return call;
  }

  std::shared_ptr<detail::mpi_core> core_;
};

static_assert(communicator<mpi_communicator>);

}  // namespace zest
