// zest/comm/detail/schedule_registry.hpp — every MPI communicator this process made, with
// its schedule record, for the check at the end of the run (zest::mpi_environment).
//
// A communicator enters at construction and leaves its last record (hash and call count)
// behind when it is destroyed, so the end of the run compares the collectives of every
// communicator the program used, the ones already freed included. A communicator is known
// across its ranks by a key: its name, its ranks in MPI_COMM_WORLD and how many earlier
// communicators of this process had both (making a communicator is collective over its
// ranks, so the count agrees). One left unusable by a timeout, or whose mismatch a
// check_schedule has already reported, is not compared again. zest calls MPI from one thread
// (MPI_THREAD_FUNNELED), and so does the registry: it takes no lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/comm/detail/mpi_call.hpp"
#include "zest/comm/detail/schedule_log.hpp"

namespace zest::detail {

class schedule_registry {
 public:
  struct entry {
    std::string name;
    std::vector<int> world_ranks;  // of the communicator's ranks, in its order
    int rank = 0;                  // this process's rank in it
    std::uint64_t key = 0;
    std::uint64_t hash = 0, calls = 0;    // the record, once the communicator is gone
    const schedule_log* live = nullptr;   // the communicator's record while it lives
    const std::string* broken = nullptr;  // and why it is unusable (empty: it is not)
    bool excluded = false;                // unusable, or its mismatch already reported
  };

  // Never destroyed: a communicator held by a static object may outlive every other static.
  static schedule_registry& instance() {
    static auto* registry = new schedule_registry;  // NOLINT: leaked on purpose
    return *registry;
  }

  // A new communicator; returns its index here.
  std::size_t add(std::string_view name, std::span<const int> world_ranks, int rank,
                  const schedule_log* live, const std::string* broken) {
    std::uint64_t same = 0;
    for (const entry& e : entries_) {
      if (e.name == name && std::equal(e.world_ranks.begin(), e.world_ranks.end(),
                                       world_ranks.begin(), world_ranks.end())) {
        ++same;
      }
    }
    entry e;
    e.name = std::string(name);
    e.world_ranks.assign(world_ranks.begin(), world_ranks.end());
    e.rank = rank;
    e.key = hash_name(name);
    for (const int r : world_ranks) e.key = hash_combine(e.key, static_cast<std::uint64_t>(r));
    e.key = hash_combine(e.key, same);
    e.live = live;
    e.broken = broken;
    entries_.push_back(std::move(e));
    return entries_.size() - 1;
  }
  // The communicator is gone: its last record stays.
  void close(std::size_t index) {
    entry& e = entries_.at(index);
    if (e.live != nullptr) {
      e.hash = e.live->hash();
      e.calls = e.live->calls();
    }
    if (e.broken != nullptr && !e.broken->empty()) e.excluded = true;
    e.live = nullptr;
    e.broken = nullptr;
  }
  // This entry's record now.
  // Whether the end of the run compares it.
  static bool compared(const entry& e) {
    return !e.excluded && e.world_ranks.size() > 1 && (e.broken == nullptr || e.broken->empty());
  }
  static std::pair<std::uint64_t, std::uint64_t> record_of(const entry& e) {
    return e.live != nullptr ? std::pair{e.live->hash(), e.live->calls()}
                             : std::pair{e.hash, e.calls};
  }
  void exclude(std::size_t index) { entries_.at(index).excluded = true; }

  std::vector<entry>& entries() { return entries_; }

 private:
  std::vector<entry> entries_;
};

}  // namespace zest::detail
