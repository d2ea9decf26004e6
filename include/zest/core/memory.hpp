// zest/core/memory.hpp — accounting of the bytes zest holds.
//
// Every tensor buffer is allocated through tracking_allocator, which keeps the live and the
// peak byte count of this process. ZeRO's memory tests and benches read these numbers
// rather than the operating system's, so they see exactly what the library holds.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

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

// A std::allocator that counts; 64-byte aligned so that vectorised kernels see aligned rows.
template <class T>
struct tracking_allocator {
  using value_type = T;
  static constexpr std::align_val_t alignment{64};

  tracking_allocator() = default;
  template <class U>
  tracking_allocator(const tracking_allocator<U>&) noexcept {}  // NOLINT: rebinding

  T* allocate(std::size_t n) {
    void* p = ::operator new(n * sizeof(T), alignment);
    note_allocated(n * sizeof(T));
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    note_freed(n * sizeof(T));
    ::operator delete(p, alignment);
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
