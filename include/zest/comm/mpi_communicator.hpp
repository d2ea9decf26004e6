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
//
// The parts, one per header in zest/comm/detail/: a call as data, validated and issued
// (mpi_call.hpp), checked mode's fingerprints and the wording of a mismatch
// (mpi_fingerprint.hpp), and the state that runs the watchdog, the exchanges and the
// transfers (mpi_core.hpp); this header holds the communicator, the public face.
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
#include "zest/comm/detail/mpi_call.hpp"
#include "zest/comm/detail/mpi_core.hpp"
#include "zest/comm/mpi_datatype.hpp"
#include "zest/comm/mpi_environment.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/source_site.hpp"

namespace zest {

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
  void broadcast(std::span<T> data, int root, source_site where = source_site::current()) {
    core_->run(at(prepare_broadcast(data, root), where));
  }
  template <class T>
  request ibroadcast(std::span<T> data, int root, source_site where = source_site::current()) {
    return detail::mpi_core::start(core_, at(prepare_broadcast(data, root), where));
  }

  // Compares the collectives this communicator issued on each of its ranks so far (kind,
  // element type, counts, reduction or root: a running hash, one update per call) with one
  // small collective: on a difference, collective_mismatch on every rank, naming `where`
  // (e.g. "optimizer step 12") and the first call that differs on each rank. Every rank of
  // the communicator calls it at the same point. zest::check_schedule(mesh) checks a mesh.
  void check_schedule(std::string_view where = {}, source_site at = source_site::current()) {
    core_->check_schedule(where, at);
  }
  // This rank's record of the collectives issued so far, the value check_schedule compares:
  // for tests and tools that compare schedules across runs (a run under adversarial data
  // against a balanced one).
  schedule_fingerprint schedule() const {
    return {core_->schedule().hash(), core_->schedule().calls()};
  }

  // Every rank's `mine` (as many words on each), rank-major, through the communicator's
  // check channel: not a counted collective, not in the schedule, under the watchdog. For
  // agreements outside the data path (zero_engine's start-up check).
  std::vector<std::uint64_t> exchange_words(std::span<const std::uint64_t> mine,
                                            std::string_view what,
                                            source_site at = source_site::current()) {
    return core_->exchange_words(mine, what, at);
  }

  void barrier(source_site where = source_site::current()) {
    detail::mpi_call call;
    call.kind = detail::barrier_kind;
    core_->run(at(std::move(call), where));
  }

 private:
  static detail::mpi_call at(detail::mpi_call call, const source_site& where) {
    call.where = user_call::or_else(where);
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
