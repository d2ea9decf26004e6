// zest/comm/checked.hpp — settings of checked mode.
//
// In checked mode every collective is preceded by a small exchange in which the ranks of
// the communicator compare what they are about to call (kind, axis, element type, counts).
// A disagreement throws collective_mismatch on every rank, naming the ranks; a collective
// (or that exchange) still unfinished after the watchdog's time throws collective_timeout.
// Tests run with it on; users switch it with set_checked_mode() or ZEST_CHECKED=1, and set
// the watchdog with set_watchdog() or ZEST_WATCHDOG_MS.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

namespace zest {

struct checked_mode_settings {
  bool enabled = false;
  std::chrono::milliseconds watchdog{60000};
};

inline checked_mode_settings& checked_mode() {
  static checked_mode_settings settings = [] {
    checked_mode_settings s;
    if (const char* on = std::getenv("ZEST_CHECKED")) s.enabled = std::string(on) != "0";
    if (const char* ms = std::getenv("ZEST_WATCHDOG_MS")) {
      s.watchdog = std::chrono::milliseconds(std::strtoll(ms, nullptr, 10));
    }
    return s;
  }();
  return settings;
}

inline void set_checked_mode(bool enabled) { checked_mode().enabled = enabled; }
inline void set_watchdog(std::chrono::milliseconds timeout) { checked_mode().watchdog = timeout; }

}  // namespace zest
