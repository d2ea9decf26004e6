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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>

#include "zest/comm/checked.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/comm/detail/mpi_call.hpp"
#include "zest/comm/detail/mpi_fingerprint.hpp"
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

  // Records call `number`: a hash update and a copy of a few fields.
  void record(const mpi_call& c, std::uint64_t number) {
    schedule_entry& e = ring_[number % ring_size];
    e.number = number;
    e.kind = c.kind;
    e.type = c.kind == barrier_kind ? 0 : static_cast<std::uint64_t>(c.type);
    e.op_or_root = c.kind == static_cast<std::uint64_t>(collective::broadcast)
                       ? static_cast<std::uint64_t>(c.root)
                       : static_cast<std::uint64_t>(c.reduction);
    e.elements = c.elements;
    e.counts_key = c.counts_key;
    e.invalid = !c.invalid.empty();
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

}  // namespace zest::detail
