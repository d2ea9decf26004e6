// zest/comm/detail/pending_collectives.hpp — the collectives a communicator queued on the
// device and has not yet seen complete, and the watchdog's verdict on them.
//
//   pending_collectives<std::shared_ptr<cuda::event>> pending;
//   pending.push(done, {"all_reduce", "float", number, elements}, clock::now());
//   pending.prune([](const auto& e) { return e->ready(); }, now);   // drops completed ones
//   if (const auto* late = pending.overdue(watchdog, now)) throw ...;  // the oldest, if late
//
// Host code only, templated on the event (a `ready` callable says whether one is done), so
// that a test without a GPU drives it with fake events. nccl_communicator.hpp keeps one per
// communicator; the host's waits ask it through cuda::detail::host_wait_hook.
//
// Order. A communicator runs its collectives on one stream, so they complete in the order
// they were queued: the oldest incomplete one is the front, and only it needs a deadline.
// Its clock starts when it is queued or, if later, when it was first seen at the front
// (the one before it seen complete): collectives queued behind a slow one are not blamed
// for its time, and a deadline is never earlier than it would be for that call alone.
//
// Bound. At most `capacity` entries: past it, the second oldest is dropped (the front keeps
// its deadline, the newest are tracked); if a dropped one hangs, a later tracked one cannot
// complete either and times out in its place, with a note that earlier calls were untracked.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iomanip>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "zest/comm/detail/rank_list.hpp"

namespace zest::detail {

// What a timeout message names: "all_reduce<float>[1024] #3".
struct pending_call {
  std::string_view op;    // static storage (name_of(collective))
  std::string_view type;  // static storage (name_of(dtype))
  std::uint64_t number = 0;
  std::uint64_t elements = 0;
};

template <class Event>
class pending_collectives {
 public:
  using clock = std::chrono::steady_clock;

  struct entry {
    Event done;
    pending_call call;
    clock::time_point since;  // when its deadline started
    bool after_gap = false;   // calls queued just before it were dropped (the bound)
  };

  explicit pending_collectives(std::size_t capacity = 1024)
      : capacity_(capacity < 2 ? 2 : capacity) {}

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::size_t capacity() const { return capacity_; }
  const entry& front() const { return entries_.front(); }
  void clear() { entries_.clear(); }

  void push(Event done, pending_call call, clock::time_point now) {
    bool gap = false;
    if (entries_.size() >= capacity_) {
      entries_.erase(entries_.begin() + 1);
      if (entries_.size() > 1) {
        entries_[1].after_gap = true;
      } else {
        gap = true;
      }
    }
    entries_.push_back(entry{std::move(done), call, now, gap});
  }

  // Drops completed entries from the front (ready(done) says whether one is done), at most
  // `limit` of them. The new front's deadline starts now unless it started later. Returns
  // whether nothing is pending any more.
  template <class Ready>
  bool prune(Ready&& ready, clock::time_point now, std::size_t limit = SIZE_MAX) {
    bool dropped = false;
    while (!entries_.empty() && limit > 0 && ready(entries_.front().done)) {
      entries_.pop_front();
      dropped = true;
      --limit;
    }
    if (dropped && !entries_.empty() && entries_.front().since < now) {
      entries_.front().since = now;
    }
    return entries_.empty();
  }

  // The front when it is past the watchdog at `now` (call prune first: it must be seen
  // incomplete), else null. A zero watchdog means no deadline.
  const entry* overdue(std::chrono::milliseconds watchdog, clock::time_point now) const {
    if (watchdog.count() <= 0 || entries_.empty()) return nullptr;
    const entry& e = entries_.front();
    return now - e.since >= watchdog ? &e : nullptr;
  }

 private:
  std::size_t capacity_;
  std::deque<entry> entries_;
};

// What a device collective past the watchdog throws (collective_timeout's message):
//
//   zest: collective timeout on axis 'dp': all_reduce<float>[1024] #3 on rank 0 of 2 not
//   complete after 300.0 s (on the device, outside checked mode: the ranks' calls were not
//   compared, so some rank skipped this call, called another collective, is still busy
//   before it, or stopped; ZEST_CHECKED=1 compares them and names what each rank called);
//   the axis spans world ranks 0-1; NCCL was aborted, the communicator refuses further
//   calls. ZEST_WATCHDOG_MS sets the deadline (now 300000 ms; 0: none)
template <class Entry>
std::string pending_timeout_message(std::string_view axis, const Entry& late,
                                    std::chrono::steady_clock::time_point now, std::size_t rank,
                                    std::size_t size, std::span<const int> world_ranks,
                                    bool checked, std::chrono::milliseconds watchdog) {
  std::ostringstream out;
  out << "zest: collective timeout on axis '" << axis << "': " << late.call.op << '<'
      << late.call.type << ">[" << late.call.elements << "] #" << late.call.number;
  if (late.after_gap) out << " (or a call queued before it: too many were pending to track)";
  out << " on rank " << rank << " of " << size << " not complete after " << std::fixed
      << std::setprecision(1) << std::chrono::duration<double>(now - late.since).count() << " s";
  if (checked) {
    out << " (moving the data on the device: all ranks agreed on the call, but it did not "
           "finish)";
  } else {
    out << " (on the device, outside checked mode: the ranks' calls were not compared, so "
           "some rank skipped this call, called another collective, is still busy before "
           "it, or stopped; ZEST_CHECKED=1 compares them and names what each rank called)";
  }
  out << "; the axis spans world ranks " << rank_list(world_ranks)
      << "; NCCL was aborted, the communicator refuses further calls. ZEST_WATCHDOG_MS sets "
         "the deadline (now "
      << watchdog.count() << " ms; 0: none)";
  return out.str();
}

}  // namespace zest::detail
