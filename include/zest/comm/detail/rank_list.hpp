// zest/comm/detail/rank_list.hpp — ranks as runs, the form every communicator message uses.
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

}  // namespace zest::detail
