// zest/io/detail/rank_agreement.hpp — every rank learns whether every rank succeeded.
//
// A step of a save or a load runs on each rank inside attempt(), which turns an exception
// into an outcome, and ends in agree(), a collective that throws on every rank the error of
// the lowest failing rank: a failure is never a hang, and never seen by one rank only. The
// records passed to a save or a load are checked here too, and agreed on across ranks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/io/checksum.hpp"
#include "zest/io/detail/checkpoint_files.hpp"
#include "zest/io/tensor_record.hpp"

namespace zest::io {

namespace detail {

// -----------------------------------------------------------------------------------------
// Agreement between ranks.

enum class failure : std::int64_t { none = 0, shape = 1, checkpoint = 2 };

struct outcome {
  failure kind = failure::none;
  std::string message;
};

// Runs f, turning an exception into an outcome (so that this rank still reaches the next
// collective). Messages that are not zest's get the operation's name in front.
template <class F>
outcome attempt(std::string_view op, F&& f) {
  auto wrap = [&](failure kind, std::string what) {
    if (what.rfind("zest:", 0) != 0) what = zest::detail::message("zest: ", op, ": ", what);
    return outcome{kind, std::move(what)};
  };
  try {
    std::forward<F>(f)();
    return {};
  } catch (const shape_error& e) {
    return wrap(failure::shape, e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    // zest/core/files.hpp's errors read "zest: <op>: ..." after the library's prefix.
    std::string what = e.what();
    if (const std::size_t at = what.find("zest: "); at != std::string::npos) what.erase(0, at);
    return wrap(failure::checkpoint, std::move(what));
  } catch (const std::exception& e) {
    return wrap(failure::checkpoint, e.what());
  } catch (...) {
    return wrap(failure::checkpoint, "unknown exception");
  }
}

// Collective: returns when every rank succeeded; otherwise throws, on every rank, the
// error of the lowest failing rank (its message, and which ranks failed).
template <class Comm>
void agree(Comm& comm, const outcome& mine) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::array<std::int64_t, 2> word{
      static_cast<std::int64_t>(mine.kind),
      static_cast<std::int64_t>(mine.kind == failure::none ? 0 : mine.message.size())};
  std::vector<std::int64_t> all(2 * n);
  comm.template all_gather<std::int64_t>(std::span<const std::int64_t>(word),
                                         std::span<std::int64_t>(all));
  std::vector<std::size_t> counts(n);
  std::size_t first = n, failed = 0, total = 0;
  for (std::size_t r = 0; r < n; ++r) {
    counts[r] = static_cast<std::size_t>(all[2 * r + 1]);
    total += counts[r];
    if (all[2 * r] != 0) {
      ++failed;
      if (first == n) first = r;
    }
  }
  if (failed == 0) return;
  std::vector<std::uint8_t> text(total);
  const std::string_view own = mine.kind == failure::none ? std::string_view() : mine.message;
  comm.template all_gather<std::uint8_t>(
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(own.data()), own.size()),
      std::span<std::uint8_t>(text), std::span<const std::size_t>(counts));
  std::size_t at = 0;
  for (std::size_t r = 0; r < first; ++r) at += counts[r];
  std::string what(reinterpret_cast<const char*>(text.data() + at), counts[first]);
  if (n > 1) {
    what += zest::detail::message(" [on rank ", first);
    if (failed > 1) {
      what +=
          zest::detail::message(" and ", failed - 1, failed == 2 ? " other rank" : " other ranks");
    }
    what += ']';
  }
  if (static_cast<failure>(all[2 * first]) == failure::shape) throw shape_error(what);
  throw checkpoint_error(what);
}

// A canonical text of the tensor list: one line per record.
inline std::string describe_records(std::span<const tensor_record> tensors) {
  std::string s;
  for (const auto& t : tensors) {
    s += zest::detail::message("\"", t.name, "\" ", t.dims, " ", name_of(t.type), " ",
                               join_extents(t.global_extents), "\n");
  }
  return s;
}

// Collective: throws shape_error on every rank unless all ranks pass the same list.
template <class Comm>
void agree_on_list(Comm& comm, std::string_view op, std::span<const tensor_record> tensors) {
  const std::string mine = describe_records(tensors);
  const auto n = static_cast<std::size_t>(comm.size());
  const std::array<std::int64_t, 2> word{
      std::bit_cast<std::int64_t>(xxh64(std::as_bytes(std::span(mine.data(), mine.size())))),
      static_cast<std::int64_t>(mine.size())};
  std::vector<std::int64_t> all(2 * n);
  comm.template all_gather<std::int64_t>(std::span<const std::int64_t>(word),
                                         std::span<std::int64_t>(all));
  std::size_t differs = n;
  for (std::size_t r = 1; r < n && differs == n; ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differs = r;
  }
  if (differs == n) return;
  // Everyone saw the mismatch: gather the lists to say what differs.
  std::vector<std::size_t> counts(n);
  std::size_t total = 0;
  for (std::size_t r = 0; r < n; ++r) total += counts[r] = static_cast<std::size_t>(all[2 * r + 1]);
  std::vector<std::uint8_t> text(total);
  comm.template all_gather<std::uint8_t>(
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(mine.data()),
                                    mine.size()),
      std::span<std::uint8_t>(text), std::span<const std::size_t>(counts));
  auto lines_of = [&](std::size_t r) {
    std::size_t at = 0;
    for (std::size_t q = 0; q < r; ++q) at += counts[q];
    std::vector<std::string> lines;
    std::string line;
    for (std::size_t i = 0; i < counts[r]; ++i) {
      const char c = static_cast<char>(text[at + i]);
      if (c == '\n') {
        lines.push_back(std::move(line));
        line.clear();
      } else {
        line += c;
      }
    }
    return lines;
  };
  const auto a = lines_of(0), b = lines_of(differs);
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const std::string left = i < a.size() ? a[i] : std::string("absent");
  const std::string right = i < b.size() ? b[i] : std::string("absent");
  throw shape_error(zest::detail::message(
      "zest: ", op, ": the ranks pass different tensor lists: rank 0 has ", a.size(),
      " tensors, rank ", differs, " has ", b.size(), "; tensor #", i, " is ", left,
      " on rank 0 and ", right, " on rank ", differs, "; every rank must pass the same list"));
}

// Checks the records themselves (not against other ranks).
inline void check_records(std::string_view op, std::span<const tensor_record> tensors,
                          bool loading) {
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    auto fail = [&](auto&&... parts) {
      throw shape_error(
          zest::detail::message("zest: ", op, ": tensor \"", t.name, "\": ", parts...));
    };
    if (t.name.empty()) fail("a tensor needs a name");
    if (!names.insert(t.name).second) fail("the name appears twice in the list");
    const std::size_t n = t.dims.size();
    if (t.global_extents.size() != n || t.local_offsets.size() != n ||
        t.local_extents.size() != n) {
      fail("dims \"", t.dims, "\" but ", t.global_extents.size(), " global extents, ",
           t.local_offsets.size(), " local offsets and ", t.local_extents.size(), " local extents");
    }
    for (std::size_t k = 0; k < n; ++k) {
      if (t.local_offsets[k] + t.local_extents[k] > t.global_extents[k]) {
        fail("the local block ", join_extents(t.local_offsets), " + ",
             join_extents(t.local_extents), " does not fit the extents ",
             join_extents(t.global_extents));
      }
    }
    const std::size_t want = volume(t.local_extents) * element_size(t.type);
    if (t.bytes.size() != want) {
      fail("the local block has ", t.bytes.size(), " bytes, its extents ",
           join_extents(t.local_extents), " of ", name_of(t.type), " need ", want);
    }
    if (loading && t.read_only) {
      fail("recorded from a const tensor; loading writes into it, so record a non-const one");
    }
  }
}

}  // namespace detail

}  // namespace zest::io
