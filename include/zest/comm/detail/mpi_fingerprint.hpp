// zest/comm/detail/mpi_fingerprint.hpp — what the ranks of a communicator exchange in
// checked mode before a collective: a fixed-size fingerprint of each rank's call, and the
// helpers that word a mismatch (where each rank called, which ranks did what).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <iomanip>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/comm/detail/mpi_call.hpp"
#include "zest/comm/detail/rank_list.hpp"
#include "zest/core/error.hpp"
#include "zest/core/source_site.hpp"

namespace zest {
namespace detail {

// The fingerprint: fixed size, so one MPI_Iallgather carries every rank's.
namespace fp {
inline constexpr std::size_t version = 0, kind = 1, type = 2, op_or_root = 3, axis = 4, number = 5,
                             elements = 6, counts = 7, invalid = 8, pairs_sent = 9,
                             pairs_received = 10, context = 11, counts_size = 12, first_count = 13,
                             site = 17, words = 49;
inline constexpr std::size_t shown_counts = site - first_count;
// Where the rank made its call, for a mismatch's message: "at file:line in <context>", as
// characters (truncated, zero-terminated). It travels with every fingerprint because a
// verdict may not need a second round: a rank that gave up on a call (timeout) decides it
// only when it makes its next call, long after the others.
inline constexpr std::size_t site_chars = (words - site) * sizeof(std::uint64_t);
inline constexpr std::uint64_t current_version = 0x7a65737402ULL;  // "zest" 2
}  // namespace fp
using fingerprint = std::array<std::uint64_t, fp::words>;

using watchdog_clock = std::chrono::steady_clock;

// "comm/checked_mode_test.cpp:120": the last two parts of the caller's path, and the line.
inline std::string site_of(const source_site& where) {
  std::string_view file = where.file_name();
  if (const auto last = file.rfind('/'); last != std::string_view::npos && last > 0) {
    if (const auto before = file.rfind('/', last - 1); before != std::string_view::npos) {
      file.remove_prefix(before + 1);
    }
  }
  return message(file, ':', where.line());
}

// A checked call between its fingerprint exchange and the end of its data transfer.
struct checked_op {
  enum class stage : std::uint8_t { checking, moving, done, failed };

  mpi_call call;
  fingerprint mine{};
  std::vector<std::uint64_t> all;  // every rank's fingerprint, rank-major
  MPI_Request check_request = MPI_REQUEST_NULL;
  MPI_Request data_request = MPI_REQUEST_NULL;
  stage at = stage::checking;
  bool abandoned = false;  // its caller gave up (timeout): its buffers may be gone
  bool counted = false;    // in the stats (taken back if the call fails the check)
  std::exception_ptr error;
};

}  // namespace detail
}  // namespace zest
