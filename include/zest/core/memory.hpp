// zest/core/memory.hpp — accounting of the bytes zest holds.
//
// Every tensor buffer is allocated through tracking_allocator, which keeps the live and the
// peak byte count of this process. ZeRO's memory tests and benches read these numbers
// rather than the operating system's, so they see exactly what the library holds.
//
// Large blocks that zest frees are kept in a cache and handed out again for the next
// request of the same size class (fresh pages from the operating system cost a page fault
// each, which measured ~15% of a training step). A block of 64 KiB or more is allocated at
// its class's size: the request rounded up to one of 16 sizes per power of two, at most
// 1/16 more. So a request whose size changes a little from step to step (an expert's rows
// under dropless routing, a batch of another length) still finds last step's block. The
// counters count the bytes requested, not the rounding, so that they equal the formulas of
// the planner; cached_bytes() counts whole blocks. Cached blocks are not live. The cache
// holds at most cache_limit() bytes (256 MiB unless set_cache_limit says otherwise), making
// room by freeing cached blocks when it is full; release_cache() returns everything.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zest::memory {

struct counters {
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};
};

inline counters& host_counters() {
  static counters c;
  return c;
}

inline std::int64_t live_bytes() { return host_counters().live.load(); }
inline std::int64_t peak_bytes() { return host_counters().peak.load(); }
// Starts a new peak measurement from the current live bytes.
inline void reset_peak() { host_counters().peak.store(host_counters().live.load()); }

inline void note_allocated(std::size_t bytes) {
  auto& c = host_counters();
  const std::int64_t now =
      c.live.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
  std::int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}
inline void note_freed(std::size_t bytes) {
  host_counters().live.fetch_sub(static_cast<std::int64_t>(bytes));
}

// Frees a container's storage now (`v = {}` and clear() keep the capacity).
template <class Container>
void release(Container& v) noexcept {
  Container().swap(v);
}

// The cache of freed large blocks, by size class (64-byte aligned).
class block_cache {
 public:
  static constexpr std::size_t min_block = std::size_t{64} << 10;  // smaller: plain new
  static constexpr std::align_val_t alignment{64};
  static constexpr std::size_t classes_per_octave = 16;

  // The size a request of `bytes` is allocated at: below min_block the request itself;
  // from there on, rounded up to a multiple of 1/16 of the power of two at or below it.
  static constexpr std::size_t block_size(std::size_t bytes) noexcept {
    if (bytes < min_block) return bytes;
    const std::size_t grain = std::bit_floor(bytes) / classes_per_octave;
    if (bytes > static_cast<std::size_t>(-1) - grain) return bytes;  // cannot be allocated
    return (bytes + grain - 1) / grain * grain;
  }

  // A cached block for a request of `bytes`, of block_size(bytes); nullptr: none.
  void* take(std::size_t bytes) {
    if (bytes < min_block) return nullptr;
    bytes = block_size(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= bytes;
    return p;
  }
  // Keeps a block allocated for a request of `bytes` if there is room; false: the caller
  // frees it.
  bool give(void* p, std::size_t bytes) noexcept {
    if (bytes < min_block) return false;
    bytes = block_size(bytes);
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (bytes > limit_) return false;
      // Full: blocks of other sizes make room (the sizes in use change between phases).
      for (auto it = free_.begin(); cached_ + bytes > limit_ && it != free_.end(); ++it) {
        while (!it->second.empty() && cached_ + bytes > limit_) {
          ::operator delete(it->second.back(), alignment);
          it->second.pop_back();
          cached_ -= it->first;
        }
      }
      free_[bytes].push_back(p);
      cached_ += bytes;
      return true;
    } catch (...) {  // no room for the bookkeeping: free the block instead
      return false;
    }
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [bytes, blocks] : free_) {
      for (void* p : blocks) ::operator delete(p, alignment);
    }
    free_.clear();
    cached_ = 0;
  }
  void set_limit(std::size_t bytes) {
    limit_ = bytes;
    if (cached_ > limit_) release();
  }
  std::size_t limit() const { return limit_; }
  std::size_t cached() const { return cached_; }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
  std::size_t limit_ = std::size_t{256} << 20;
};
// Never destroyed: buffers in static objects may be freed after any destructor would run.
inline block_cache& cache() {
  static block_cache* c = new block_cache;  // NOLINT(cppcoreguidelines-owning-memory)
  return *c;
}
inline void set_cache_limit(std::size_t bytes) { cache().set_limit(bytes); }
inline std::size_t cache_limit() { return cache().limit(); }
inline std::size_t cached_bytes() { return cache().cached(); }
inline void release_cache() { cache().release(); }

// A std::allocator that counts; 64-byte aligned so that vectorised kernels see aligned rows.
template <class T>
struct tracking_allocator {
  using value_type = T;
  static constexpr std::align_val_t alignment{64};

  tracking_allocator() = default;
  template <class U>
  tracking_allocator(const tracking_allocator<U>&) noexcept {}  // NOLINT: rebinding

  T* allocate(std::size_t n) {
    void* p = cache().take(n * sizeof(T));
    if (p == nullptr) p = ::operator new(block_cache::block_size(n * sizeof(T)), alignment);
    note_allocated(n * sizeof(T));
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    note_freed(n * sizeof(T));
    if (!cache().give(p, n * sizeof(T))) ::operator delete(p, alignment);
  }
  // `vector<T>(n)` leaves trivial elements uninitialised: every buffer zest sizes this way
  // is overwritten at once (a collective's output, a kernel's result), and zeroing large
  // buffers first would cost a pass over memory. Code that needs zeros asks for them.
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0 && std::is_trivially_default_constructible_v<U>) {
      ::new (static_cast<void*>(p)) U;
    } else {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  }
  template <class U>
  bool operator==(const tracking_allocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace zest::memory
