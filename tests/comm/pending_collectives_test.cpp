// The host side of nccl_communicator's watchdog outside checked mode, without a GPU: the
// bookkeeping of pending collectives (zest/comm/detail/pending_collectives.hpp), driven by
// fake events (a flag per collective says whether it completed) and an explicit clock, and
// the poll loop of the host's waits (zest/backend/cuda/host_wait.hpp) with a fake hook.
#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "zest/backend/cuda/host_wait.hpp"
#include "zest/comm/detail/pending_collectives.hpp"

namespace {

using namespace std::chrono_literals;
using fake_event = std::shared_ptr<bool>;  // true: complete
using pending = zest::detail::pending_collectives<fake_event>;
using clock_type = pending::clock;

bool is_done(const fake_event& e) { return *e; }

fake_event incomplete() { return std::make_shared<bool>(false); }

zest::detail::pending_call call(std::uint64_t number, std::uint64_t elements = 1024) {
  return {"all_reduce", "float", number, elements};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const clock_type::time_point t0 = clock_type::now();

}  // namespace

TEST_CASE("pending collectives: an overdue incomplete collective is named in the message") {
  pending p;
  const auto e = incomplete();
  p.push(e, call(3), t0);
  CHECK_FALSE(p.prune(is_done, t0 + 3500ms));
  const auto* late = p.overdue(3000ms, t0 + 3500ms);
  REQUIRE(late != nullptr);
  CHECK(late->call.number == 3);
  const std::array<int, 4> world{4, 5, 6, 7};
  const std::string what = zest::detail::pending_timeout_message(
      "dp", *late, t0 + 3500ms, 1, 4, std::span<const int>(world), false, 3000ms);
  INFO(what);
  CHECK(what.rfind("zest: collective timeout on axis 'dp': all_reduce<float>[1024] #3 on rank 1 "
                   "of 4 not complete after 3.5 s (on the device, outside checked mode: the "
                   "ranks' calls were not compared",
                   0) == 0);
  CHECK(contains(what, "ZEST_CHECKED=1 compares them and names what each rank called"));
  CHECK(contains(what, "the axis spans world ranks 4-7"));
  CHECK(contains(what, "NCCL was aborted, the communicator refuses further calls"));
  CHECK(contains(what, "ZEST_WATCHDOG_MS sets the deadline (now 3000 ms; 0: none)"));
  CHECK_FALSE(contains(what, "queued before it"));

  const std::array<int, 2> scattered{0, 2};
  const std::string checked = zest::detail::pending_timeout_message(
      "tp", *late, t0 + 3500ms, 0, 2, std::span<const int>(scattered), true, 3000ms);
  CHECK(contains(checked, "all ranks agreed on the call, but it did not finish"));
  CHECK(contains(checked, "the axis spans world ranks 0,2"));
  CHECK_FALSE(contains(checked, "outside checked mode"));
}

TEST_CASE("pending collectives: completed collectives are dropped, never blamed") {
  pending p;
  const auto a = incomplete(), b = incomplete();
  p.push(a, call(0), t0);
  p.push(b, call(1), t0 + 1ms);
  *a = true;
  *b = true;
  CHECK(p.prune(is_done, t0 + 1h));  // long past any deadline, but both finished
  CHECK(p.empty());
  CHECK(p.overdue(3000ms, t0 + 1h) == nullptr);
}

TEST_CASE("pending collectives: a young incomplete collective is not overdue") {
  pending p;
  p.push(incomplete(), call(0), t0);
  CHECK_FALSE(p.prune(is_done, t0 + 2999ms));
  CHECK(p.overdue(3000ms, t0 + 2999ms) == nullptr);
  CHECK(p.overdue(3000ms, t0 + 3000ms) != nullptr);
}

TEST_CASE("pending collectives: watchdog 0 means no deadline") {
  pending p;
  p.push(incomplete(), call(0), t0);
  CHECK_FALSE(p.prune(is_done, t0 + 24h));
  CHECK(p.overdue(0ms, t0 + 24h) == nullptr);
}

TEST_CASE(
    "pending collectives: completion is in queue order; the front's clock starts when "
    "it is reached") {
  pending p;
  const auto a = incomplete(), b = incomplete(), c = incomplete();
  p.push(a, call(0), t0);
  p.push(b, call(1), t0 + 100ms);
  p.push(c, call(2), t0 + 200ms);
  *c = true;  // a later one done while the front is not: the front stays, so does b
  CHECK_FALSE(p.prune(is_done, t0 + 1s));
  CHECK(p.size() == 3);
  REQUIRE(p.overdue(3000ms, t0 + 3s) != nullptr);
  CHECK(p.overdue(3000ms, t0 + 3s)->call.number == 0);

  *a = true;  // seen complete at t0 + 5 s: b's deadline counts from then, not from its queueing
  CHECK_FALSE(p.prune(is_done, t0 + 5s));
  CHECK(p.front().call.number == 1);
  CHECK(p.overdue(3000ms, t0 + 7s) == nullptr);
  const auto* late = p.overdue(3000ms, t0 + 8s);
  REQUIRE(late != nullptr);
  CHECK(late->call.number == 1);
  const std::array<int, 1> world{0};
  CHECK(contains(zest::detail::pending_timeout_message("dp", *late, t0 + 8s, 0, 1,
                                                       std::span<const int>(world), false, 3000ms),
                 "not complete after 3.0 s"));

  *b = true;  // c was already done: all gone at once
  CHECK(p.prune(is_done, t0 + 9s));
}

TEST_CASE("pending collectives: prune stops at its limit") {
  pending p;
  std::array<fake_event, 5> events{};
  for (std::uint64_t i = 0; i < events.size(); ++i) {
    events[i] = std::make_shared<bool>(true);
    p.push(events[i], call(i), t0);
  }
  CHECK_FALSE(p.prune(is_done, t0, 2));
  CHECK(p.size() == 3);
  CHECK(p.front().call.number == 2);
  CHECK(p.prune(is_done, t0));
}

TEST_CASE("pending collectives: bounded; the front keeps its deadline, the newest are tracked") {
  pending p(4);
  CHECK(p.capacity() == 4);
  for (std::uint64_t i = 0; i < 6; ++i)
    p.push(incomplete(), call(i), t0 + std::chrono::milliseconds(static_cast<long long>(i)));
  CHECK(p.size() == 4);
  CHECK(p.front().call.number == 0);
  const auto* late = p.overdue(3000ms, t0 + 3s);
  REQUIRE(late != nullptr);
  CHECK(late->call.number == 0);
  CHECK_FALSE(late->after_gap);

  pending tiny(1);  // at least 2
  CHECK(tiny.capacity() == 2);
  const auto first = incomplete();
  tiny.push(first, call(0), t0);
  tiny.push(incomplete(), call(1), t0);
  tiny.push(incomplete(), call(2), t0);  // drops #1; #2 follows a gap
  CHECK(tiny.size() == 2);
  *first = true;
  CHECK_FALSE(tiny.prune(is_done, t0 + 1s));
  const auto* next = tiny.overdue(1000ms, t0 + 2s);
  REQUIRE(next != nullptr);
  CHECK(next->call.number == 2);
  CHECK(next->after_gap);
  const std::array<int, 2> world{0, 1};
  CHECK(contains(zest::detail::pending_timeout_message("dp", *next, t0 + 2s, 0, 2,
                                                       std::span<const int>(world), false, 1000ms),
                 "all_reduce<float>[1024] #2 (or a call queued before it: too many were "
                 "pending to track) on rank 0 of 2"));
}

// ---- the host wait's poll loop (zest/backend/cuda/host_wait.hpp), with a fake hook --------

namespace {

namespace host_wait = zest::cuda::detail;

struct fake_hook_state {
  host_wait::wait_check answer = host_wait::wait_check::pending;
  int calls = 0;
  int throw_after = -1;  // calls before the hook throws; -1: never
};
fake_hook_state hook_state;

host_wait::wait_check fake_hook() {
  ++hook_state.calls;
  if (hook_state.throw_after >= 0 && hook_state.calls > hook_state.throw_after) {
    throw std::runtime_error("overdue");
  }
  return hook_state.answer;
}

struct wait_counts {
  int polls = 0;
  int blocks = 0;
};

}  // namespace

TEST_CASE("host wait: done at once asks nobody; idle or no deadline blocks at once") {
  wait_counts w;
  hook_state = {};
  host_wait::poll_under_hook(
      &fake_hook, [&] { return ++w.polls, true; }, [&] { ++w.blocks; });
  CHECK(w.polls == 1);
  CHECK(hook_state.calls == 0);
  CHECK(w.blocks == 0);

  for (const auto answer : {host_wait::wait_check::idle, host_wait::wait_check::no_deadline}) {
    w = {};
    hook_state = {};
    hook_state.answer = answer;
    host_wait::poll_under_hook(
        &fake_hook, [&] { return ++w.polls, false; }, [&] { ++w.blocks; });
    CHECK(w.polls == 1);
    CHECK(hook_state.calls == 1);
    CHECK(w.blocks == 1);
  }
}

TEST_CASE("host wait: pending polls until done, asking the hook now and then") {
  wait_counts w;
  hook_state = {};
  const auto until = clock_type::now() + 20ms;
  host_wait::poll_under_hook(
      &fake_hook, [&] { return ++w.polls, clock_type::now() >= until; }, [&] { ++w.blocks; });
  CHECK(w.blocks == 0);
  CHECK(hook_state.calls >= 2);   // first, then about every millisecond
  CHECK(hook_state.calls <= 25);  // not at every poll
  CHECK(w.polls > hook_state.calls);
}

TEST_CASE("host wait: the hook's throw leaves the wait; a hook turning idle blocks") {
  wait_counts w;
  hook_state = {};
  hook_state.throw_after = 3;
  CHECK_THROWS_WITH(host_wait::poll_under_hook(
                        &fake_hook, [&] { return ++w.polls, false; }, [&] { ++w.blocks; }),
                    "overdue");
  CHECK(hook_state.calls == 4);
  CHECK(w.blocks == 0);

  w = {};
  hook_state = {};
  // Done only after 10 s, far past the 3 ms the hook's fourth call comes at.
  const auto give_up = clock_type::now() + 10s;
  host_wait::poll_under_hook(
      &fake_hook,
      [&] {
        if (hook_state.calls == 3) hook_state.answer = host_wait::wait_check::idle;
        return clock_type::now() >= give_up;
      },
      [&] { ++w.blocks; });
  CHECK(w.blocks == 1);
  CHECK(hook_state.calls == 4);
}
