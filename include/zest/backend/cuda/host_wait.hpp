// zest/backend/cuda/host_wait.hpp — how a host wait for the device polls under the watchdog:
// the hook the NCCL layer installs, and the poll loop of cuda::wait_for
// (zest/backend/cuda/device_memory.hpp).
//
//   cuda::detail::poll_under_hook(hook, [&] { return stream_done(); }, [&] { block(); });
//
// No CUDA here (the loop takes a `done` and a `block` callable), so a test without a GPU
// drives it with fakes, and backend/ stays free of comm/: the hook is a plain function
// pointer that zest/comm/nccl_communicator.hpp sets while a communicator is alive.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "zest/core/backoff.hpp"

namespace zest::cuda::detail {

// What the hook says to a host wait that asks it.
enum class wait_check {
  no_deadline,  // no watchdog (ZEST_WATCHDOG_MS=0): block as CUDA does
  idle,         // no collective is pending: nothing queued can hang on a peer; block
  pending,      // some collective is queued and not yet seen complete: keep polling
};
// Installed by the NCCL layer while a communicator is alive; null otherwise. It checks the
// pending collectives against the watchdog and throws (collective_timeout) past it.
using wait_hook = wait_check (*)();
inline std::atomic<wait_hook>& host_wait_hook_slot() {
  static std::atomic<wait_hook> hook{nullptr};
  return hook;
}
inline wait_hook host_wait_hook() { return host_wait_hook_slot().load(std::memory_order_acquire); }
inline void set_host_wait_hook(wait_hook hook) {
  host_wait_hook_slot().store(hook, std::memory_order_release);
}

// How often a polling wait asks the hook.
inline constexpr std::chrono::milliseconds hook_interval{1};

// Polls done() until it is true, asking the hook first and then every hook_interval;
// `block` is the plain blocking wait, used as soon as the hook says nothing can hang (idle)
// or there is no deadline. Pauses between polls as zest/core/backoff.hpp says. Whatever
// the hook throws leaves the wait.
template <class Done, class Block>
void poll_under_hook(wait_hook hook, Done&& done, Block&& block) {
  if (done()) return;
  if (hook() != wait_check::pending) {
    block();
    return;
  }
  auto asked = std::chrono::steady_clock::now();
  for (::zest::detail::backoff pause; !done(); pause()) {
    const auto now = std::chrono::steady_clock::now();
    if (now - asked >= hook_interval) {
      asked = now;
      if (hook() != wait_check::pending) {
        block();
        return;
      }
    }
  }
}

}  // namespace zest::cuda::detail
