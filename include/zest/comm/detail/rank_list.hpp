// zest/comm/detail/rank_list.hpp — ranks as runs, and each rank's text with runs merged: the
// forms every communicator message (and zero_engine's start-up check) uses.
#pragma once

#include <cstddef>
#include <span>
#include <sstream>
#include <string>

namespace zest::detail {

// Ranks as runs: "0-3", "1,3", "0,2-5".
inline std::string rank_list(std::span<const int> ranks) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t end = i + 1;
    while (end < ranks.size() && ranks[end] == ranks[end - 1] + 1) ++end;
    out << (i == 0 ? "" : ",") << ranks[i];
    if (end - i > 1) out << '-' << ranks[end - 1];
    i = end;
  }
  return out.str();
}

// "rank 0: <text 0>; ranks 1-3: <text 1>": each rank's text, runs of equal texts merged
// (always, or only beyond 16 ranks).
template <class TextOf>
std::string per_rank(std::size_t size, TextOf text_of, bool merge_always) {
  std::ostringstream out;
  std::size_t r = 0;
  while (r < size) {
    const std::string what = text_of(r);
    std::size_t end = r + 1;
    if (merge_always || size > 16) {
      while (end < size && text_of(end) == what) ++end;
    }
    out << (r == 0 ? "" : "; ");
    if (end - r == 1) out << "rank " << r << ": " << what;
    else out << "ranks " << r << "-" << end - 1 << ": " << what;
    r = end;
  }
  return out.str();
}

}  // namespace zest::detail
