// What the tests of checked mode and the watchdog share: a scoped watchdog setting, the
// message of an expected exception, and a clock.
#pragma once

#include <chrono>
#include <string>

#include "zest/comm/checked.hpp"

namespace zest_test {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// Sets the watchdog for one test and restores it after.
class watchdog_scope {
 public:
  explicit watchdog_scope(std::chrono::milliseconds timeout)
      : saved_(zest::checked_mode().watchdog) {
    zest::set_watchdog(timeout);
  }
  watchdog_scope(const watchdog_scope&) = delete;
  watchdog_scope& operator=(const watchdog_scope&) = delete;
  ~watchdog_scope() { zest::set_watchdog(saved_); }

 private:
  std::chrono::milliseconds saved_;
};

inline double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs call, which must throw E; returns the message ("" if it did not throw E).
template <class E, class Call>
std::string message_of(Call call) {
  try {
    call();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace zest_test
