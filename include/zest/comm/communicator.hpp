// zest/comm/communicator.hpp — the communicator concept: collectives over one mesh axis.
//
// A communicator connects the ranks of one mesh axis (or of the whole world). It offers
// the five collectives that layout transitions need, blocking and non-blocking, with
// uneven counts, and it counts, per collective kind, the calls and the bytes this rank
// sent. The byte counts follow the bandwidth-optimal (ring) model, the formulas that
// explain() and the planners price transitions with (docs/design-notes.md, "Byte counters
// follow the ring model"), so tests can compare counters with formulas exactly:
//
//   all_gather      my chunk sent to n-1 peers          (n-1) * my_count
//   reduce_scatter  everything but my own chunk         total - my_count
//   all_reduce      reduce-scatter + all-gather         2 * (total - my_chunk)
//   all_to_all      every block not addressed to me     sum_{j != me} send_counts[j]
//   broadcast       pipelined ring                      root: total, others: total unless last
//
// (times sizeof(T)). Implementations: local_communicator (one rank, no MPI),
// mpi_communicator (MPI), nccl_communicator (GPU issue).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace zest {

enum class collective : std::uint8_t {
  all_gather,
  reduce_scatter,
  all_reduce,
  all_to_all,
  broadcast
};
inline constexpr std::size_t collective_kinds = 5;

constexpr std::string_view name_of(collective c) {
  switch (c) {
    case collective::all_gather: return "all_gather";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_reduce: return "all_reduce";
    case collective::all_to_all: return "all_to_all";
    case collective::broadcast: return "broadcast";
  }
  return "?";
}

enum class reduce_op : std::uint8_t { sum, max, min };

struct collective_counter {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
};

// What a communicator's ranks must agree on about the collectives it issued so far, as one
// value (mpi_communicator::schedule()): a running hash over each call's kind, element type,
// reduction or root and counts (not an all_to_all's element count, which the data decides:
// its per-rank counts travel with it), and the number of calls. Two runs, or two ranks,
// that issued the same sequence of collectives on a communicator made alike have equal
// fingerprints; check_schedule compares them across the ranks.
struct schedule_fingerprint {
  std::uint64_t hash = 0;
  std::uint64_t calls = 0;
  friend bool operator==(const schedule_fingerprint&, const schedule_fingerprint&) = default;
};

// Per-kind counters of one communicator.
struct comm_stats {
  std::array<collective_counter, collective_kinds> by_kind{};

  collective_counter& operator[](collective c) { return by_kind[static_cast<std::size_t>(c)]; }
  const collective_counter& operator[](collective c) const {
    return by_kind[static_cast<std::size_t>(c)];
  }
  std::uint64_t bytes_sent() const {
    std::uint64_t total = 0;
    for (const auto& k : by_kind) total += k.bytes_sent;
    return total;
  }
  std::uint64_t calls() const {
    std::uint64_t total = 0;
    for (const auto& k : by_kind) total += k.calls;
    return total;
  }
  comm_stats& operator+=(const comm_stats& o) {
    for (std::size_t i = 0; i < collective_kinds; ++i) {
      by_kind[i].calls += o.by_kind[i].calls;
      by_kind[i].bytes_sent += o.by_kind[i].bytes_sent;
    }
    return *this;
  }
  friend comm_stats operator-(comm_stats a, const comm_stats& b) {
    for (std::size_t i = 0; i < collective_kinds; ++i) {
      a.by_kind[i].calls -= b.by_kind[i].calls;
      a.by_kind[i].bytes_sent -= b.by_kind[i].bytes_sent;
    }
    return a;
  }
};

// Handle of a non-blocking collective. wait() blocks until it is complete (and runs any
// unpacking step that belongs to it); test() polls. Destroying an unfinished request waits.
class request {
 public:
  // poll(true) blocks until done; poll(false) returns whether it is done. Must be
  // idempotent once it returned true.
  using poll_fn = std::function<bool(bool block)>;

  request() = default;
  explicit request(poll_fn poll) : poll_(std::move(poll)) {}
  request(request&& o) noexcept : poll_(std::exchange(o.poll_, nullptr)), done_(o.done_) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      poll_ = std::exchange(o.poll_, nullptr);
      done_ = o.done_;
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish_quietly(); }

  void wait() {
    if (!done_ && poll_) done_ = poll_(true);
    done_ = true;
  }
  bool test() {
    if (!done_ && poll_) done_ = poll_(false);
    return done_ || !poll_;
  }

 private:
  void finish_quietly() noexcept {
    try {
      wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
    }
  }
  poll_fn poll_;
  bool done_ = false;
};

namespace detail {
// Checked mode's report for an all_to_all whose counts do not pair up. `rows` holds, for
// each rank r, its send counts then its receive counts (2n words per rank):
//   "rank 1 expects 3 elements from rank 0, which sends it 2; ..."
inline std::string describe_count_pairing(std::span<const std::uint64_t> rows, std::size_t n) {
  std::ostringstream out;
  std::size_t shown = 0, found = 0;
  for (std::size_t to = 0; to < n; ++to) {
    for (std::size_t from = 0; from < n; ++from) {
      const std::uint64_t sent = rows[from * 2 * n + to];
      const std::uint64_t expected = rows[to * 2 * n + n + from];
      if (sent == expected) continue;
      ++found;
      if (shown++ < 8) {
        out << (shown == 1 ? "" : "; ") << "rank " << to << " expects " << expected
            << " elements from rank " << from << ", which sends it " << sent;
      }
    }
  }
  if (found > shown) out << "; and " << found - shown << " more";
  return out.str();
}
}  // namespace detail

// The concept, checked with float; implementations provide the same members for every
// element type of zest/core/dtype.hpp. Empty `counts` mean equal chunks.
template <class C>
concept communicator = requires(C& c, const C& cc, std::span<const float> in, std::span<float> out,
                                std::span<const std::size_t> counts, int root) {
  { cc.size() } -> std::convertible_to<int>;
  { cc.rank() } -> std::convertible_to<int>;
  { cc.name() } -> std::convertible_to<std::string_view>;
  { cc.stats() } -> std::convertible_to<const comm_stats&>;
  c.reset_stats();
  c.all_gather(in, out, counts);
  c.reduce_scatter(in, out, counts, reduce_op::sum);
  c.all_reduce(out, reduce_op::sum);
  c.all_to_all(in, counts, out, counts);
  c.broadcast(out, root);
  { c.iall_gather(in, out, counts) } -> std::same_as<request>;
  { c.ireduce_scatter(in, out, counts, reduce_op::sum) } -> std::same_as<request>;
  { c.iall_reduce(out, reduce_op::sum) } -> std::same_as<request>;
  { c.iall_to_all(in, counts, out, counts) } -> std::same_as<request>;
  { c.ibroadcast(out, root) } -> std::same_as<request>;
  c.barrier();
};

}  // namespace zest
