// zest/zero/setup_check.hpp — the ranks' agreement, before their first collective, on what
// decides the collectives they will issue.
//
// Ranks started with different flags or binaries (another ZeRO stage, another mesh shape, a
// model with a layer more) issue different collectives, and a hang or wrong data follows.
// zero_engine compares, before its first collective, one text per field (the library's
// version, the mesh, the policy, the options that change communication) and one per
// parameter (name and extents), as hashes in one small exchange; when they differ, a second
// exchange brings every rank's text of the first field that differs, and every rank throws
// the same collective_mismatch:
//
//   zest: zero_engine: the ranks were not started alike: the ZeRO policy differs: rank 0:
//   zero_stage<3> sharded over dp ...; rank 1: zero_stage<1> sharded over dp ... (every rank
//   must build the same mesh, policy, options and model: the same binary and flags)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/detail/rank_list.hpp"
#include "zest/core/error.hpp"

namespace zest::detail {

// FNV-1a of a text, folded with more words: what the ranks compare.
inline std::uint64_t setup_hash(std::string_view text, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}
inline std::uint64_t setup_hash(std::uint64_t word, std::uint64_t h) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((word >> (8 * i)) & 0xffU)) * 0x100000001b3ULL;
  return h;
}

struct setup_field {
  std::string_view name;    // "the mesh"
  std::string text;         // "mesh<dp=2, tp=2>"
  std::uint64_t extra = 0;  // also compared, not shown (a type's identity)
};

// All ranks' words, rank-major, from each rank's `mine` (as many on every rank).
using words_exchange = std::function<std::vector<std::uint64_t>(std::span<const std::uint64_t>)>;

// Throws collective_mismatch on every rank when the ranks' fields or parameter lists differ.
inline void agree_on_setup(const words_exchange& exchange, std::span<const setup_field> fields,
                           std::span<const std::string> parameters) {
  constexpr std::size_t shown = 64;  // parameters compared one by one (the rest as a whole)
  const std::size_t nf = fields.size();
  std::vector<std::uint64_t> mine(nf + 2 + shown, 0);
  for (std::size_t f = 0; f < nf; ++f) {
    mine[f] = setup_hash(fields[f].extra, setup_hash(fields[f].text));
  }
  std::uint64_t all_params = setup_hash(parameters.size(), setup_hash(""));
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const std::uint64_t h = setup_hash(parameters[i]);
    all_params = setup_hash(h, all_params);
    if (i < shown) mine[nf + 2 + i] = h;
  }
  mine[nf] = parameters.size();
  mine[nf + 1] = all_params;
  const std::vector<std::uint64_t> all = exchange(mine);
  const std::size_t words = mine.size(), ranks = all.size() / words;
  const auto word = [&](std::size_t r, std::size_t w) { return all[r * words + w]; };
  const auto same = [&](std::size_t w) {
    for (std::size_t r = 1; r < ranks; ++r) {
      if (word(r, w) != word(0, w)) return false;
    }
    return true;
  };

  // The first field that differs, or the parameter list (field index nf).
  std::size_t differs = nf + 1;
  for (std::size_t f = 0; f < nf && differs > nf; ++f) {
    if (!same(f)) differs = f;
  }
  if (differs > nf && !(same(nf) && same(nf + 1))) differs = nf;
  if (differs > nf) return;

  // Within the parameter list: the first index whose parameter differs on some rank.
  std::size_t index = 0;
  if (differs == nf) {
    std::uint64_t fewest = word(0, nf);
    for (std::size_t r = 1; r < ranks; ++r) fewest = std::min(fewest, word(r, nf));
    index = static_cast<std::size_t>(std::min<std::uint64_t>(fewest, shown));
    for (std::size_t i = 0; i < index; ++i) {
      if (!same(nf + 2 + i)) {
        index = i;
        break;
      }
    }
  }
  // Every rank's text of what differs.
  constexpr std::size_t text_words = 32;
  std::vector<std::uint64_t> text(text_words, 0);
  std::string own;
  if (differs < nf) {
    own = fields[differs].text;
  } else if (index < parameters.size()) {
    own = message("parameter #", index, " is ", parameters[index], " (", parameters.size(),
                  " parameters)");
  } else {
    own = message("no parameter #", index, " (", parameters.size(), " parameters)");
  }
  std::memcpy(text.data(), own.data(), std::min(own.size(), text_words * 8 - 1));
  const std::vector<std::uint64_t> texts = exchange(text);
  const std::string what =
      differs < nf ? std::string(fields[differs].name) : std::string("the model's parameters");
  const std::string values = per_rank(
      ranks,
      [&](std::size_t r) {
        const auto* chars = reinterpret_cast<const char*>(&texts[r * text_words]);
        return std::string(chars, std::find(chars, chars + text_words * 8 - 1, '\0'));
      },
      true);
  throw collective_mismatch(message(
      "zest: zero_engine: the ranks were not started alike: ", what, " differs: ", values,
      " (every rank must build the same mesh, policy, options and model: the same binary and "
      "flags)"));
}

}  // namespace zest::detail
