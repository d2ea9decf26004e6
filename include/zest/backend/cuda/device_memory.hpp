// zest/backend/cuda/device_memory.hpp — device memory, streams and events for the CUDA backend.
//
//   zest::device_buffer<float> x(1 << 20);          // from the caching pool, contents unspecified
//   zest::memory::device::live_bytes();             // what zest's device buffers hold now
//   zest::memory::device::peak_bytes();             // the most they held since reset_peak()
//   zest::cuda::event done;  done.record(zest::cuda::compute_stream());
//
// The pool keeps freed blocks in size classes (four per power of two, 512 bytes at least)
// and hands them out again without cudaMalloc/cudaFree, which synchronise the device and
// cost far more than a kernel. Reuse is ordered by the compute stream: every kernel, copy
// and GEMM of the CUDA backend runs on compute_stream(), and every collective on another
// stream starts after the compute stream's work so far and makes it wait for the result
// (nccl_communicator.hpp). So a block freed while a kernel still reads it is only handed
// to work that the stream runs after that kernel. Code that touches zest's buffers from
// other streams must order itself the same way (event::record + event::wait_on).
//
// Accounting mirrors zest/core/memory.hpp: live and peak bytes of the device buffers
// (requested sizes, as the host counts them), read by the ZeRO memory tests and benches;
// the pool's own reserve (cached blocks, rounding) is reported apart by pool_stats().
//
// Host waits. Every wait of the host for the device that zest makes goes through
// cuda::wait_for (a stream, an event) or cuda::wait_for_device: stream::synchronize,
// event::synchronize, cuda::synchronize, copy_to_device, copy_to_host and release_cached
// use them. While no NCCL communicator is alive they are the plain blocking calls. While
// one is, a collective that some rank skipped would leave the device waiting for ever, so
// the host polls instead and now and then asks the NCCL layer (a hook it installs:
// detail::host_wait_hook in host_wait.hpp; backend/ knows nothing of comm/) whether a
// collective it queued is past the watchdog; the hook then aborts that communicator and
// throws collective_timeout out of the wait (zest/comm/nccl_communicator.hpp). When the hook
// says that no collective is pending, or that there is no deadline (ZEST_WATCHDOG_MS=0),
// the wait is the blocking call again. Copies from and to pageable host memory can block
// inside cudaMemcpyAsync, so with a communicator alive they first wait for the work before
// them the same way.
//
// Runtime API only (no kernels): host compilers can include this file when the CUDA
// include directory is on their path.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zest/backend/cuda/host_wait.hpp"
#include "zest/core/error.hpp"
#include "zest/core/memory.hpp"

namespace zest {

// A CUDA runtime or library call failed; the message names the call and the error.
class cuda_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace memory {

// Live and peak bytes of zest's device buffers, like host_counters() for host memory.
inline counters& device_counters() {
  static counters c;
  return c;
}

namespace device {
inline std::int64_t live_bytes() { return device_counters().live.load(); }
inline std::int64_t peak_bytes() { return device_counters().peak.load(); }
// Starts a new peak measurement from the current live bytes.
inline void reset_peak() { device_counters().peak.store(device_counters().live.load()); }
}  // namespace device

}  // namespace memory

namespace cuda {

// Throws cuda_error "zest: <call>: <error string> (<error name>)" unless code is cudaSuccess.
inline void check(cudaError_t code, std::string_view call) {
  if (code == cudaSuccess) return;
  throw cuda_error(zest::detail::message("zest: ", call, ": ", cudaGetErrorString(code), " (",
                                         cudaGetErrorName(code), ")"));
}

// ZEST_CUDA_CHECK(cudaMemsetAsync(p, 0, n, s)) — the failing call is named in the message.
#define ZEST_CUDA_CHECK(call) ::zest::cuda::check((call), #call)

// What CUDA shows this process: its devices and, where there are none, why in CUDA's words.
// None where this machine has no CUDA driver (cudaErrorInsufficientDriver, which is also what
// a missing libcuda gives) or no device (cudaErrorNoDevice). Any other failure of CUDA's start
// throws cuda_error naming it, so that a broken start on a machine with a GPU never reads as
// "no GPU".
struct device_census {
  int count = 0;
  std::string why_none;  // "" where count > 0
};

inline device_census visible_devices() {
  int n = 0;
  const cudaError_t code = cudaGetDeviceCount(&n);
  if (code == cudaSuccess)
    return {n, n > 0 ? std::string() : std::string("the CUDA driver lists no device")};
  static_cast<void>(cudaGetLastError());  // clear the error it leaves behind
  if (code != cudaErrorNoDevice && code != cudaErrorInsufficientDriver)
    check(code, "cudaGetDeviceCount");
  return {0, zest::detail::message(cudaGetErrorString(code), " (", cudaGetErrorName(code), ")")};
}

inline int device_count() { return visible_devices().count; }

inline int current_device() {
  int d = 0;
  ZEST_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

// ---- host waits ------------------------------------------------------------------------

namespace detail {
// The body of both waits below: `block` when no communicator watches, otherwise `query`
// (cudaStreamQuery or cudaEventQuery, named `what` in errors) polled under the hook.
template <class Query, class Block>
void wait_with(Query query, const char* what, Block block) {
  const wait_hook hook = host_wait_hook();
  if (hook == nullptr) {
    block();
    return;
  }
  poll_under_hook(
      hook,
      [query, what] {
        const cudaError_t code = query();
        if (code == cudaErrorNotReady) return false;
        check(code, what);
        return true;
      },
      block);
}
}  // namespace detail

// Blocks until the work queued so far on s is done. See the top of this file: with an NCCL
// communicator alive, a collective past the watchdog throws collective_timeout from here.
inline void wait_for(cudaStream_t s) {
  detail::wait_with([s] { return cudaStreamQuery(s); }, "cudaStreamQuery",
                    [s] { ZEST_CUDA_CHECK(cudaStreamSynchronize(s)); });
}

// Blocks until e's recorded work is done, under the same rule.
inline void wait_for(cudaEvent_t e) {
  detail::wait_with([e] { return cudaEventQuery(e); }, "cudaEventQuery",
                    [e] { ZEST_CUDA_CHECK(cudaEventSynchronize(e)); });
}

// Blocks until the device is idle (every stream). With a communicator alive: the compute
// stream first, then until no collective is pending, both polled under the hook, and only
// then cudaDeviceSynchronize (by then nothing zest queued can hang).
inline void wait_for_device(cudaStream_t compute) {
  const detail::wait_hook hook = detail::host_wait_hook();
  if (hook != nullptr) {
    wait_for(compute);
    detail::poll_under_hook(
        hook, [] { return false; }, [] {});
  }
  ZEST_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- streams and events ----------------------------------------------------------------

// An owning CUDA stream. Non-blocking by default: it does not synchronise with the legacy
// default stream, so collectives on it overlap with compute.
class stream {
 public:
  explicit stream(unsigned flags = cudaStreamNonBlocking) {
    ZEST_CUDA_CHECK(cudaStreamCreateWithFlags(&handle_, flags));
  }
  stream(stream&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      destroy();
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { destroy(); }

  cudaStream_t get() const { return handle_; }
  // Blocks until the work queued so far is done (wait_for: under the watchdog).
  void synchronize() const { wait_for(handle_); }
  // Whether all work queued so far is done.
  bool ready() const {
    const cudaError_t code = cudaStreamQuery(handle_);
    if (code == cudaErrorNotReady) return false;
    check(code, "cudaStreamQuery");
    return true;
  }

 private:
  void destroy() noexcept {
    if (handle_ != nullptr) static_cast<void>(cudaStreamDestroy(handle_));
    handle_ = nullptr;
  }
  cudaStream_t handle_ = nullptr;
};

// An owning CUDA event: record it on one stream, make another wait for it, or poll it.
// Without timing by default (cheaper); pass timing = true for elapsed_ms.
class event {
 public:
  explicit event(bool timing = false) {
    ZEST_CUDA_CHECK(
        cudaEventCreateWithFlags(&handle_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  event(event&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      destroy();
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { destroy(); }

  cudaEvent_t get() const { return handle_; }
  void record(cudaStream_t s) const { ZEST_CUDA_CHECK(cudaEventRecord(handle_, s)); }
  // Work queued on s after this call starts after the work this event recorded.
  void wait_on(cudaStream_t s) const { ZEST_CUDA_CHECK(cudaStreamWaitEvent(s, handle_, 0)); }
  bool ready() const {
    const cudaError_t code = cudaEventQuery(handle_);
    if (code == cudaErrorNotReady) return false;
    check(code, "cudaEventQuery");
    return true;
  }
  // Blocks until the recorded work is done (wait_for: under the watchdog).
  void synchronize() const { wait_for(handle_); }
  // Milliseconds from start to this event (both recorded with timing = true).
  float elapsed_ms(const event& start) const {
    float ms = 0;
    ZEST_CUDA_CHECK(cudaEventElapsedTime(&ms, start.handle_, handle_));
    return ms;
  }

 private:
  void destroy() noexcept {
    if (handle_ != nullptr) static_cast<void>(cudaEventDestroy(handle_));
    handle_ = nullptr;
  }
  cudaEvent_t handle_ = nullptr;
};

namespace detail {
inline cudaStream_t& compute_stream_slot() {
  static cudaStream_t s = cudaStreamLegacy;
  return s;
}
}  // namespace detail

// The stream on which the CUDA backend runs every kernel, copy and GEMM. The legacy
// default stream unless set otherwise, so a user's own kernels launched with <<<g, b>>>
// are ordered with zest's work without further ado.
inline cudaStream_t compute_stream() { return detail::compute_stream_slot(); }
// Moves zest's compute onto another stream (set it before creating buffers and meshes,
// and after synchronising the old one: the pool's reuse is ordered by this stream).
inline void set_compute_stream(cudaStream_t s) { detail::compute_stream_slot() = s; }

// Blocks until the compute stream's work is done (timings, host reads of pinned memory);
// wait_for: under the watchdog while an NCCL communicator is alive.
inline void synchronize() { wait_for(compute_stream()); }

// ---- the caching pool ------------------------------------------------------------------

struct pool_stats {
  std::int64_t reserved_bytes = 0;       // held from cudaMalloc: blocks in use and cached
  std::int64_t cached_bytes = 0;         // free blocks kept for reuse
  std::uint64_t device_allocations = 0;  // cudaMalloc calls so far
  std::uint64_t reuses = 0;              // requests served from the cache
};

namespace detail {

// Size classes: four per power of two, at least 512 bytes. 3000 -> 3072, 2^27 -> 2^27.
constexpr std::size_t size_class(std::size_t bytes) {
  constexpr std::size_t minimum = 512;
  if (bytes <= minimum) return minimum;
  const std::size_t top = std::bit_floor(bytes);  // bytes in [top, 2 top)
  const std::size_t step = top / 4;
  return (bytes + step - 1) / step * step;
}
static_assert(size_class(1) == 512 && size_class(513) == 640 && size_class(3000) == 3072);
static_assert(size_class(std::size_t{1} << 27) == std::size_t{1} << 27);

class device_pool {
 public:
  // A block of at least `bytes` on the current device. Counted in the device counters when
  // `counted` (tensor storage), not when it is a backend's workspace.
  void* allocate(std::size_t bytes, bool counted) {
    if (bytes == 0) return nullptr;
    const std::size_t rounded = size_class(bytes);
    const int device = current_device();
    void* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto& list = free_[key(device, rounded)];
      if (!list.empty()) {
        p = list.back();
        list.pop_back();
        stats_.cached_bytes -= static_cast<std::int64_t>(rounded);
        ++stats_.reuses;
      }
    }
    if (p == nullptr) p = fresh(rounded, device);
    {
      std::lock_guard lock(mutex_);
      blocks_[p] = block{rounded, device, counted ? bytes : 0};
    }
    if (counted) note(static_cast<std::int64_t>(bytes));
    return p;
  }

  // Returns a block to its size class. Never calls CUDA (safe in destructors).
  void deallocate(void* p) noexcept {
    if (p == nullptr) return;
    std::int64_t counted = 0;
    {
      std::lock_guard lock(mutex_);
      const auto it = blocks_.find(p);
      if (it == blocks_.end()) return;  // not ours: ignore rather than corrupt the lists
      const block b = it->second;
      blocks_.erase(it);
      try {
        free_[key(b.device, b.bytes)].push_back(p);
        stats_.cached_bytes += static_cast<std::int64_t>(b.bytes);
      } catch (...) {  // out of host memory for the list: give the block back instead
        static_cast<void>(cudaFree(p));
        stats_.reserved_bytes -= static_cast<std::int64_t>(b.bytes);
      }
      counted = static_cast<std::int64_t>(b.counted);
    }
    if (counted != 0) memory::device_counters().live.fetch_sub(counted);
  }

  // Frees every cached block (after the device finished with them). Live blocks stay.
  void release_cached() {
    wait_for_device(compute_stream());
    std::lock_guard lock(mutex_);
    for (auto& [k, list] : free_) {
      for (void* p : list) {
        static_cast<void>(cudaFree(p));
        stats_.reserved_bytes -= static_cast<std::int64_t>(k.bytes);
        stats_.cached_bytes -= static_cast<std::int64_t>(k.bytes);
      }
      list.clear();
    }
  }

  pool_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  struct block {
    std::size_t bytes = 0;  // the size class
    int device = 0;
    std::size_t counted = 0;  // requested bytes counted in the device counters, or 0
  };
  struct list_key {
    int device = 0;
    std::size_t bytes = 0;
    bool operator==(const list_key&) const = default;
  };
  struct list_hash {
    std::size_t operator()(const list_key& k) const noexcept {
      return std::hash<std::size_t>()(k.bytes * 131 + static_cast<std::size_t>(k.device));
    }
  };
  static list_key key(int device, std::size_t bytes) { return {device, bytes}; }

  static void note(std::int64_t bytes) {
    auto& c = memory::device_counters();
    const std::int64_t now = c.live.fetch_add(bytes) + bytes;
    std::int64_t peak = c.peak.load();
    while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
    }
  }

  void* fresh(std::size_t rounded, int device) {
    void* p = nullptr;
    cudaError_t code = cudaMalloc(&p, rounded);
    if (code == cudaErrorMemoryAllocation) {
      static_cast<void>(cudaGetLastError());
      release_cached();  // cached blocks of other sizes may make room
      code = cudaMalloc(&p, rounded);
    }
    if (code != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      const pool_stats s = stats();
      throw cuda_error(zest::detail::message(
          "zest: cudaMalloc(", rounded, " bytes) on device ", device, ": ",
          cudaGetErrorString(code), " (", cudaGetErrorName(code), "); zest holds ",
          memory::device_counters().live.load(), " bytes in live device buffers, ",
          s.reserved_bytes, " reserved by its pool"));
    }
    std::lock_guard lock(mutex_);
    stats_.reserved_bytes += static_cast<std::int64_t>(rounded);
    ++stats_.device_allocations;
    return p;
  }

  mutable std::mutex mutex_;
  std::unordered_map<list_key, std::vector<void*>, list_hash> free_;
  std::unordered_map<void*, block> blocks_;
  pool_stats stats_;
};

}  // namespace detail

// The process's pool. Never destroyed: at exit the driver reclaims device memory, and
// freeing after the CUDA runtime shut down would fail.
inline detail::device_pool& pool() {
  static auto* p = new detail::device_pool;  // NOLINT(cppcoreguidelines-owning-memory)
  return *p;
}
inline pool_stats memory_pool_stats() { return pool().stats(); }
// Gives cached blocks back to the driver (for another library, or before measuring).
inline void release_cached_memory() { pool().release_cached(); }

}  // namespace cuda

// ---- device_buffer -----------------------------------------------------------------------

// Owning device storage of n elements of T (trivially copyable), the CUDA backend's
// buffer<T>. device_buffer(n) leaves the contents unspecified; copies are deep (a
// device-to-device copy on the compute stream); moves steal.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "zest device_buffer: T must be trivially copyable");

 public:
  using value_type = T;
  using size_type = std::size_t;

  device_buffer() = default;
  explicit device_buffer(std::size_t n) : size_(n) {
    data_ = static_cast<T*>(cuda::pool().allocate(n * sizeof(T), true));
  }
  device_buffer(const device_buffer& o) : device_buffer(o.size_) {
    if (size_ != 0) {
      ZEST_CUDA_CHECK(cudaMemcpyAsync(data_, o.data_, size_ * sizeof(T), cudaMemcpyDeviceToDevice,
                                      cuda::compute_stream()));
    }
  }
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_buffer& operator=(const device_buffer& o) {
    if (this != &o) {
      device_buffer copy(o);
      swap(copy);
    }
    return *this;
  }
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~device_buffer() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }

  void swap(device_buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }

 private:
  void release() noexcept {
    cuda::pool().deallocate(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

namespace cuda {

// Uncounted device scratch of n elements (a backend's workspace, like the host backend's
// per-thread scratch, which zest::memory does not count either).
template <class T>
class workspace {
 public:
  explicit workspace(std::size_t n)
      : data_(static_cast<T*>(pool().allocate(n * sizeof(T), false))) {}
  workspace(workspace&& o) noexcept : data_(std::exchange(o.data_, nullptr)) {}
  workspace& operator=(workspace&& o) noexcept {
    if (this != &o) {
      pool().deallocate(data_);
      data_ = std::exchange(o.data_, nullptr);
    }
    return *this;
  }
  workspace(const workspace&) = delete;
  workspace& operator=(const workspace&) = delete;
  ~workspace() { pool().deallocate(data_); }
  T* data() const { return data_; }

 private:
  T* data_ = nullptr;
};

// Host <-> device copies on the compute stream; both wait for the copy (and for the work
// before it) through wait_for. copy_to_device waits because CUDA does not promise that an
// asynchronous copy from pageable memory has read its source when the call returns, and
// callers free the source right after (a scalar on the stack, generate's staging vector).
// A copy to or from pageable memory may also return only once it is done, so while an NCCL
// communicator is alive both first wait for the work before them (maybe a collective)
// through wait_for, under the watchdog.
template <class T>
void copy_to_device(std::span<const T> from, T* to) {
  if (from.empty()) return;
  if (detail::host_wait_hook() != nullptr) wait_for(compute_stream());
  ZEST_CUDA_CHECK(cudaMemcpyAsync(to, from.data(), from.size_bytes(), cudaMemcpyHostToDevice,
                                  compute_stream()));
  wait_for(compute_stream());
}
template <class T>
void copy_to_host(const T* from, std::size_t n, T* to) {
  if (n == 0) return;
  if (detail::host_wait_hook() != nullptr) wait_for(compute_stream());
  ZEST_CUDA_CHECK(
      cudaMemcpyAsync(to, from, n * sizeof(T), cudaMemcpyDeviceToHost, compute_stream()));
  wait_for(compute_stream());
}

}  // namespace cuda

}  // namespace zest
