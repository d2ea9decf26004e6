// zest/data/stream.hpp — a data stream whose position is global: the same batches on any
// number of ranks and any layout, and a position a checkpoint keeps.
//
//   struct my_loader {                                     // a zest::token_stream
//     std::string identity() const;                        // what the data and its order are
//     std::size_t batch_size() const;                      // rows of a global batch
//     std::size_t sequence_length() const;
//     void row(std::uint64_t batch, std::size_t row,       // row `row` of global batch
//              std::span<std::int32_t> inputs,             // `batch`: its token ids and the
//              std::span<std::int32_t> targets) const;     // next-token targets
//   };
//   zest::stream_cursor cursor(loader);                          // at batch 0
//   auto [in, tg] = cursor.next<zest::layout<zest::split<'b', "dp">>>(mesh);
//   zest::save_training_state("ckpt", engine, step, config, corpus, cursor.state());
//   cursor.restore(*zest::stream_state_of(info));                // on any rank count
//
// The contract that makes a reshard keep the data order: batch k is a pure function of k
// (and of the stream's own settings, which its identity names), never of the ranks, the
// layout or the batches read before. Each rank asks only for the rows its block of "bt"
// holds; a layout that splits t (sequence or tensor parallelism) takes its columns of
// them, one that replicates b over an axis asks for the same rows on each of its ranks. So
// a run saved at position p on 2 ranks and resumed on 4, with tp, sp or ep, sees batch p,
// p + 1, ... exactly as the uninterrupted run does. zest::batch_sampler is one such stream.
//
// stream_state is what a checkpoint records: the identity, the batch shape and the position
// (the index of the next batch). restore() refuses another identity or shape, naming what
// differs, unless told to take it (stream_restore::allow_other): a loader's order under
// another global batch is another order, and silently continuing would skip or repeat data.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

// A batch's inputs and its next-token targets, of the same type and layout.
template <class Tokens>
struct token_batch {
  Tokens inputs;
  Tokens targets;
};

template <class S>
concept token_stream = requires(const S& s, std::uint64_t batch, std::size_t row,
                                std::span<std::int32_t> ids) {
  { s.identity() } -> std::convertible_to<std::string>;
  { s.batch_size() } -> std::convertible_to<std::size_t>;
  { s.sequence_length() } -> std::convertible_to<std::size_t>;
  s.row(batch, row, ids, ids);
};

// Where a stream is, as a checkpoint keeps it.
struct stream_state {
  std::string identity;
  std::size_t batch_size = 0, sequence_length = 0;
  std::uint64_t position = 0;  // the index of the next batch
  friend bool operator==(const stream_state&, const stream_state&) = default;
};

// The first way in which `saved` is another stream than `now` (identity, batch size,
// sequence length), as "batch size: saved 8, this run 16"; empty when it is the same one.
inline std::string stream_difference(const stream_state& saved, const stream_state& now) {
  if (saved.identity != now.identity) {
    return detail::message("identity: saved \"", saved.identity, "\", this run \"", now.identity,
                           "\"");
  }
  if (saved.batch_size != now.batch_size) {
    return detail::message("global batch: saved ", saved.batch_size, " rows, this run ",
                           now.batch_size);
  }
  if (saved.sequence_length != now.sequence_length) {
    return detail::message("sequence length: saved ", saved.sequence_length, ", this run ",
                           now.sequence_length);
  }
  return {};
}

// Batch `index` of the stream as "bt" tensors with any layout (inputs, targets): each rank
// asks the stream for the rows its block holds, once each.
template <class Layout, token_stream S, class Mesh>
token_batch<tensor<std::int32_t, Mesh, "bt", Layout>> stream_batch(const S& stream,
                                                                   const Mesh& mesh,
                                                                   std::uint64_t index) {
  using tokens_t = tensor<std::int32_t, Mesh, "bt", Layout>;
  static_assert(!tokens_t::layout.any_partial(),
                "zest stream_batch: token ids cannot be a partial sum; split the batch dim "
                "'b' over the data axes, or replicate it");
  const std::size_t rows = stream.batch_size(), length = stream.sequence_length();
  std::vector<std::int32_t> inputs(length), targets(length);
  // The targets of the rows this rank holds, kept from the inputs' pass: one call of row()
  // per row (generate() visits this rank's elements row by row).
  std::map<std::size_t, std::vector<std::int32_t>> kept;
  std::size_t held = static_cast<std::size_t>(-1);
  auto in = tokens_t::generate(mesh, {rows, length}, [&](const typename tokens_t::extents_type& i) {
    if (i[0] != held) {
      held = i[0];
      stream.row(index, held, std::span<std::int32_t>(inputs), std::span<std::int32_t>(targets));
      kept.emplace(held, targets);
    }
    return inputs[i[1]];
  });
  auto row_of = kept.end();
  auto tg = tokens_t::generate(mesh, {rows, length}, [&](const typename tokens_t::extents_type& i) {
    if (row_of == kept.end() || row_of->first != i[0]) row_of = kept.find(i[0]);
    return row_of->second[i[1]];
  });
  return {std::move(in), std::move(tg)};
}

// Batch `index` whole, row-major [batch_size, sequence_length]: for references.
template <token_stream S>
token_batch<std::vector<std::int32_t>> stream_global_batch(const S& stream, std::uint64_t index) {
  const std::size_t rows = stream.batch_size(), length = stream.sequence_length();
  token_batch<std::vector<std::int32_t>> out;
  out.inputs.resize(rows * length);
  out.targets.resize(rows * length);
  for (std::size_t r = 0; r < rows; ++r) {
    stream.row(index, r, std::span<std::int32_t>(out.inputs).subspan(r * length, length),
               std::span<std::int32_t>(out.targets).subspan(r * length, length));
  }
  return out;
}

struct stream_restore {
  // Take a saved state of another stream (identity, global batch or sequence length) and
  // continue at its position: the data order changes there; the caller reports it.
  bool allow_other = false;
};

// A position in a stream (which it views, not owns) and the batches from it.
template <token_stream S>
class stream_cursor {
 public:
  explicit stream_cursor(const S& stream, std::uint64_t position = 0)
      : stream_(&stream), position_(position) {}

  std::uint64_t position() const { return position_; }
  const S& stream() const { return *stream_; }
  stream_state state() const {
    return {std::string(stream_->identity()), stream_->batch_size(), stream_->sequence_length(),
            position_};
  }

  // The next batch, laid out as Layout on `mesh`; the position moves on by one.
  template <class Layout, class Mesh>
  token_batch<tensor<std::int32_t, Mesh, "bt", Layout>> next(const Mesh& mesh) {
    return stream_batch<Layout>(*stream_, mesh, position_++);
  }

  // Continues where `saved` stopped. Throws checkpoint_error naming what differs when it
  // is another stream, unless `options.allow_other`; returns that difference (empty when
  // none), for the caller to report.
  std::string restore(const stream_state& saved, const stream_restore& options = {}) {
    std::string difference = stream_difference(saved, state());
    if (!difference.empty() && !options.allow_other) {
      throw checkpoint_error(detail::message(
          "zest: stream_cursor::restore: the saved position is in another data stream (",
          difference,
          "): its batches from here would skip or repeat data; resume with the same stream, "
          "or allow another (stream_restore::allow_other) to continue at position ",
          saved.position, " of this one"));
    }
    position_ = saved.position;
    return difference;
  }

 private:
  const S* stream_;
  std::uint64_t position_;
};

}  // namespace zest
