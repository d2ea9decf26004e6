// zest/comm/detail/schedule_log.hpp — a communicator's running record of the collectives it
// issued: a hash over every call, and the last calls kept for a message.
//
// Every call updates the hash with what the ranks of a communicator must agree on: the kind,
// the element type, the reduction or root, the counts (the element count too, except for
// all_to_all, whose counts legitimately differ per rank) and whether the buffers fit, the
// fields checked mode compares. The ranks compare hashes at cheap points
// (mpi_core::check_schedule: once per training step, zest::check_schedule); when they
// differ, the last `ring_size` calls of each rank, kept here as plain fields, name the first
// call that differs.
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/checked.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/comm/detail/mpi_call.hpp"
#include "zest/comm/detail/mpi_fingerprint.hpp"
#include "zest/comm/detail/rank_list.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/source_site.hpp"

namespace zest::detail {

// One recorded call.
struct schedule_entry {
  std::uint64_t number = 0;  // the communicator's call number
  std::uint64_t hash = 0;    // of the fields below
  std::uint64_t kind = 0, type = 0, op_or_root = 0, elements = 0, counts_key = 0;
  bool invalid = false;
  source_site where{};
  std::array<char, 40> context{};  // the innermost collective_context's name, cut
};

class schedule_log {
 public:
  static constexpr std::size_t ring_size = 32;

  // What a call is, as the ranks must agree on it.
  struct call_fields {
    std::uint64_t kind = 0, type = 0, op_or_root = 0, elements = 0, counts_key = 0;
    bool invalid = false;
    source_site where{};
  };

  // Records call `number` of an MPI communicator.
  void record(const mpi_call& c, std::uint64_t number) {
    call_fields f;
    f.kind = c.kind;
    f.type = c.kind == barrier_kind ? 0 : static_cast<std::uint64_t>(c.type);
    f.op_or_root = c.kind == static_cast<std::uint64_t>(collective::broadcast)
                       ? static_cast<std::uint64_t>(c.root)
                       : static_cast<std::uint64_t>(c.reduction);
    f.elements = c.elements;
    f.counts_key = c.counts_key;
    f.invalid = !c.invalid.empty();
    f.where = c.where;
    record(f, number);
  }

  // Records call `number`: a hash update and a copy of a few fields.
  void record(const call_fields& c, std::uint64_t number) {
    schedule_entry& e = ring_[number % ring_size];
    e.number = number;
    e.kind = c.kind;
    e.type = c.type;
    e.op_or_root = c.op_or_root;
    e.elements = c.elements;
    e.counts_key = c.counts_key;
    e.invalid = c.invalid;
    e.where = c.where;
    e.context[0] = '\0';
    if (const collective_context* context = collective_context::current()) {
      const std::string_view what = context->what();
      const std::size_t n = std::min(what.size(), e.context.size() - 1);
      std::memcpy(e.context.data(), what.data(), n);
      e.context[n] = '\0';
    }
    std::uint64_t h = hash_combine(mix(e.kind), e.type);
    h = hash_combine(h, e.op_or_root);
    h = hash_combine(h, e.counts_key);
    h = hash_combine(h, e.invalid ? 1 : 0);
    if (e.kind != static_cast<std::uint64_t>(collective::all_to_all))
      h = hash_combine(h, e.elements);
    e.hash = h;
    hash_ = hash_combine(hash_, h);
    calls_ = number + 1;
  }

  std::uint64_t hash() const { return hash_; }
  std::uint64_t calls() const { return calls_; }
  // Call `number` if it is among the last ring_size, else null.
  const schedule_entry* find(std::uint64_t number) const {
    if (number >= calls_ || calls_ - number > ring_size) return nullptr;
    const schedule_entry& e = ring_[number % ring_size];
    return e.number == number ? &e : nullptr;
  }

  // The first call whose record differs between the ranks, as a message's detail, once
  // their totals (hash and call count, rank-major pairs) differ: every rank sends the calls it
  // remembers through `exchange` (every rank's words, rank-major), so every rank reaches the
  // same verdict.
  template <class Exchange>
  std::string first_difference(std::size_t size, const std::vector<std::uint64_t>& totals,
                               Exchange exchange) const {
    constexpr std::size_t text_words = 32, entry_words = 3 + text_words;
    constexpr std::size_t ring = ring_size;
    std::vector<std::uint64_t> mine(ring * entry_words, 0);
    pack_calls<text_words>(mine.data());
    const std::vector<std::uint64_t> all = exchange(mine);

    // Each rank's call number n: its words, or null when it has none.
    const auto entry_of = [&](std::size_t r, std::uint64_t n) {
      return packed_call<text_words>(&all[r * ring * entry_words], n);
    };
    std::uint64_t start = 0, end = 0;
    for (std::size_t r = 0; r < size; ++r) {
      const std::uint64_t count = totals[2 * r + 1];
      start = std::max(start, count > ring ? count - ring : 0);
      end = std::max(end, count);
    }
    std::uint64_t differs = end;
    for (std::uint64_t n = start; n < end && differs == end; ++n) {
      const std::uint64_t* first_rank = entry_of(0, n);
      for (std::size_t r = 1; r < size; ++r) {
        const std::uint64_t* e = entry_of(r, n);
        if ((e == nullptr) != (first_rank == nullptr) || (e != nullptr && e[1] != first_rank[1])) {
          differs = n;
          break;
        }
      }
    }
    if (differs == end) {
      return message("the last ", ring,
                     " calls of every rank agree, so the first difference is before call #", start,
                     " (each rank remembers its last ", ring, ")");
    }
    return message("the first that differs is call #", differs, ": ",
                   per_rank(
                       size,
                       [&](std::size_t r) -> std::string {
                         if (const std::uint64_t* e = entry_of(r, differs)) {
                           return packed_text<text_words>(e);
                         }
                         return message("no call #", differs, " (", totals[2 * r + 1],
                                        " calls in all)");
                       },
                       false));
  }

  // ---- a timed-out rank's report (mpi_core::who_else) --------------------------------------

  // [call it waits in, calls so far, then per remembered call: number, hash, hash of where it
  // was made, its description], a fixed size.
  // 418 words, 3,344 bytes: under the MPI libraries' eager limits for shared memory (4 KiB
  // and more), so a report to a rank that never listens does not wait for it.
  static constexpr std::size_t report_text_words = 10, report_entry_words = 3 + report_text_words,
                               report_words = 2 + ring_size * report_entry_words;
  std::vector<std::uint64_t> report(std::uint64_t waiting_in) const {
    std::vector<std::uint64_t> words(report_words, 0);
    words[0] = waiting_in;
    words[1] = calls_;
    pack_calls<report_text_words>(&words[2]);
    return words;
  }

  // The first call in which this rank's record and those the other ranks reported differ, in
  // what was called (kind, type, size, ...) or, where the calls are alike, in where they were
  // made: a rank that skipped a call pairs its next call with the others' skipped one, which
  // MPI lets through when the sizes agree. "" when the remembered calls agree.
  static std::string first_unmatched(std::size_t rank,
                                     const std::vector<std::vector<std::uint64_t>>& reports) {
    const auto entry = [&](std::size_t r, std::uint64_t n) -> const std::uint64_t* {
      if (reports[r].size() != report_words) return nullptr;
      return packed_call<report_text_words>(&reports[r][2], n);
    };
    const auto text = [](const std::uint64_t* w) { return packed_text<report_text_words>(w); };
    const std::vector<std::uint64_t>& mine = reports[rank];
    std::uint64_t best = UINT64_MAX;
    std::size_t other = rank;
    bool alike = false;
    for (std::size_t r = 0; r < reports.size(); ++r) {
      if (r == rank || reports[r].size() != report_words) continue;
      const std::uint64_t end = std::min(mine[1], reports[r][1]);
      const std::uint64_t lo = end > ring_size ? end - ring_size : 0;
      for (std::uint64_t n = lo; n < end && n < best; ++n) {
        const std::uint64_t* a = entry(rank, n);
        const std::uint64_t* b = entry(r, n);
        if (a == nullptr || b == nullptr) continue;
        if (a[1] != b[1] || a[2] != b[2]) {
          best = n;
          other = r;
          alike = a[1] == b[1];
          break;
        }
      }
    }
    if (other == rank) return "";
    if (alike) {
      return message("; the first call made from other lines is #", best, ": this rank's ",
                     text(entry(rank, best)), ", rank ", other, "'s ", text(entry(other, best)),
                     " (alike calls: unless a branch on the rank makes them differ on purpose, "
                     "a rank skipped a call there and paired its next one with it)");
    }
    return message("; the first call that did not match is #", best, ": this rank's ",
                   text(entry(rank, best)), ", rank ", other, "'s ", text(entry(other, best)));
  }

  // Where a call was made, as compared between ranks: "nn/linear.hpp:40 in einsum".
  static std::string site_text(const schedule_entry& e) {
    std::string out = e.where.line() != 0 ? site_of(e.where) : std::string();
    if (e.context[0] != '\0') out.append(" in ").append(e.context.data());
    return out;
  }

  // The remembered calls as words, for another rank to read (check_schedule's second round,
  // a timeout's report): call n at entry n % ring_size, each [n + 1 (0: none), hash, hash of
  // site_text, describe() in TextWords words, cut and zero-terminated].
  template <std::size_t TextWords>
  void pack_calls(std::uint64_t* out) const {
    const std::uint64_t first = calls_ > ring_size ? calls_ - ring_size : 0;
    for (std::uint64_t n = first; n < calls_; ++n) {
      const schedule_entry* e = find(n);
      if (e == nullptr) continue;
      std::uint64_t* w = &out[(n % ring_size) * (3 + TextWords)];
      w[0] = n + 1;
      w[1] = e->hash;
      w[2] = hash_name(site_text(*e));
      const std::string text = describe(*e);
      std::memcpy(&w[3], text.data(), std::min(text.size(), TextWords * 8 - 1));
    }
  }
  // Call n in words pack_calls wrote, or null when they hold none.
  template <std::size_t TextWords>
  static const std::uint64_t* packed_call(const std::uint64_t* words, std::uint64_t n) {
    const std::uint64_t* w = &words[(n % ring_size) * (3 + TextWords)];
    return w[0] == n + 1 ? w : nullptr;
  }
  template <std::size_t TextWords>
  static std::string packed_text(const std::uint64_t* w) {
    const auto* chars = reinterpret_cast<const char*>(&w[3]);
    return std::string(chars, strnlen(chars, TextWords * 8));
  }

  // "all_gather<float>[512] #3 at nn/linear.hpp:40 in einsum" (the last two parts of the path)

  static std::string describe(const schedule_entry& e) {
    std::ostringstream out;
    out << call_name(e.kind);
    if (e.kind != barrier_kind) {
      out << '<' << name_of(static_cast<dtype>(e.type)) << ">[" << e.elements << ']';
    }
    if ((e.kind == static_cast<std::uint64_t>(collective::all_reduce) ||
         e.kind == static_cast<std::uint64_t>(collective::reduce_scatter)) &&
        e.op_or_root != static_cast<std::uint64_t>(reduce_op::sum)) {
      out << ' ' << reduce_op_name(e.op_or_root);
    }
    if (e.kind == static_cast<std::uint64_t>(collective::broadcast))
      out << " root " << e.op_or_root;
    if (e.invalid) out << " (its buffer sizes are wrong)";
    out << " #" << e.number;
    if (e.where.line() != 0) out << " at " << site_of(e.where);
    if (e.context[0] != '\0') out << " in " << e.context.data();
    return out.str();
  }

 private:
  std::uint64_t hash_ = 0x7a65737473636864ULL;  // "zestschd"
  std::uint64_t calls_ = 0;
  std::array<schedule_entry, ring_size> ring_{};
};

// check_schedule's error, from first_difference's detail.
inline std::string schedule_mismatch_message(std::string_view axis, std::string_view where,
                                             const source_site& at, std::string_view detail) {
  return message(
      "zest: collective mismatch on axis '", axis, "' found by check_schedule",
      where.empty() ? "" : " at ", where, " (called at ", site_of(at),
      "): the ranks of the axis did not issue the same collectives; ", detail,
      ". Every rank of an axis must issue the same collectives in the same order: a "
      "collective after a branch that depends on the rank or on the data is the usual cause "
      "(set ZEST_CHECKED=1 to stop at the first such call, naming both call sites)");
}

}  // namespace zest::detail
