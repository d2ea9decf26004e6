// zest/comm/local_communicator.hpp — the communicator of a one-rank axis, without MPI.
//
// With one rank every collective is a copy (all_reduce and broadcast leave the data as it
// is), so programs, tests and examples run without MPI. The counters count calls; bytes
// sent are 0, which is also what communicator.hpp's model gives for n = 1. Buffer sizes are
// checked exactly as mpi_communicator checks them, so a shape bug shows up here first.
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "zest/comm/communicator.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"

namespace zest {

class local_communicator {
 public:
  explicit local_communicator(std::string name = "local") : name_(std::move(name)) {}

  int size() const { return 1; }
  int rank() const { return 0; }
  const std::string& name() const { return name_; }
  const comm_stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  // Accepted for symmetry with mpi_communicator; with one rank there is nothing to compare.
  void set_checked(std::optional<bool> on) { checked_ = on; }
  std::optional<bool> checked_override() const { return checked_; }

  template <class T>
  void all_gather(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                  std::span<const std::size_t> counts = {}) {
    constexpr auto op = collective::all_gather;
    check_counts(op, "counts", counts, send.size(), "the send buffer's size");
    check_size(op, "recv", recv.size(), send.size());
    copy(send, recv);
    ++stats_[op].calls;
  }

  template <class T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                      std::span<const std::size_t> counts = {}, reduce_op /*op*/ = reduce_op::sum) {
    constexpr auto op = collective::reduce_scatter;
    check_counts(op, "counts", counts, recv.size(), "the recv buffer's size");
    check_size(op, "send", send.size(), recv.size());
    copy(send, recv);
    ++stats_[op].calls;
  }

  template <class T>
  void all_reduce(std::span<T> /*inout*/, reduce_op /*op*/ = reduce_op::sum) {
    static_assert(is_element_type_v<T>, "zest: all_reduce: unsupported element type");
    ++stats_[collective::all_reduce].calls;
  }

  template <class T>
  void all_to_all(std::type_identity_t<std::span<const T>> send,
                  std::span<const std::size_t> send_counts, std::span<T> recv,
                  std::span<const std::size_t> recv_counts) {
    constexpr auto op = collective::all_to_all;
    check_counts(op, "send_counts", send_counts, send.size(), "the send buffer's size");
    check_counts(op, "recv_counts", recv_counts, recv.size(), "the recv buffer's size");
    check_size(op, "recv", recv.size(), send.size());
    copy(send, recv);
    ++stats_[op].calls;
  }

  template <class T>
  void broadcast(std::span<T> /*data*/, int root) {
    static_assert(is_element_type_v<T>, "zest: broadcast: unsupported element type");
    if (root != 0) {
      fail(collective::broadcast,
           detail::message("root ", root, " is not a rank of this communicator (size 1)"));
    }
    ++stats_[collective::broadcast].calls;
  }

  // Non-blocking forms: the work is done at once and the request is already complete.
  template <class T>
  request iall_gather(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                      std::span<const std::size_t> counts = {}) {
    all_gather<T>(send, recv, counts);
    return {};
  }
  template <class T>
  request ireduce_scatter(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                          std::span<const std::size_t> counts = {}, reduce_op op = reduce_op::sum) {
    reduce_scatter<T>(send, recv, counts, op);
    return {};
  }
  template <class T>
  request iall_reduce(std::span<T> inout, reduce_op op = reduce_op::sum) {
    all_reduce<T>(inout, op);
    return {};
  }
  template <class T>
  request iall_to_all(std::type_identity_t<std::span<const T>> send,
                      std::span<const std::size_t> send_counts, std::span<T> recv,
                      std::span<const std::size_t> recv_counts) {
    all_to_all<T>(send, send_counts, recv, recv_counts);
    return {};
  }
  template <class T>
  request ibroadcast(std::span<T> data, int root) {
    broadcast<T>(data, root);
    return {};
  }

  void barrier() {}
  // One rank: its schedule agrees with itself (mpi_communicator::check_schedule).
  void check_schedule(std::string_view = {}) {}

 private:
  template <class T>
  static void copy(std::span<const T> from, std::span<T> to) {
    static_assert(std::is_trivially_copyable_v<T>);
    // memmove: a caller may pass the same buffer (or overlapping views) as send and recv.
    if (!from.empty() && from.data() != to.data()) {
      std::memmove(to.data(), from.data(), from.size_bytes());
    }
  }

  [[noreturn]] void fail(collective op, const std::string& why) const {
    throw communicator_error(
        detail::message("zest: ", name_of(op), " on axis '", name_, "' (rank 0 of 1): ", why));
  }

  void check_size(collective op, std::string_view buffer, std::size_t actual,
                  std::size_t expected) const {
    if (actual != expected) {
      fail(op, detail::message(buffer, " buffer has ", actual, " elements, expected ", expected));
    }
  }

  // Counts are empty (one equal chunk) or one entry that must equal the local size.
  void check_counts(collective op, std::string_view what, std::span<const std::size_t> counts,
                    std::size_t expected, std::string_view expected_what) const {
    if (counts.empty()) return;
    if (counts.size() != 1) {
      fail(op,
           detail::message(what, " has ", counts.size(), " entries, expected one per rank (1)"));
    }
    if (counts[0] != expected) {
      fail(op,
           detail::message(what, "[0] = ", counts[0], ", but ", expected_what, " is ", expected));
    }
  }

  std::string name_;
  comm_stats stats_;
  std::optional<bool> checked_;
};

static_assert(communicator<local_communicator>);

}  // namespace zest
