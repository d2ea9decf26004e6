// zest/data/batches.hpp — deterministic batches of token windows, split over the data axis.
//
//   zest::batch_sampler sampler(data.train(), /*batch*/ 6, /*length*/ 64, /*seed*/ 1234);
//   auto [inputs, targets] = sampler.batch<"dp">(mesh, step);
//   // inputs, targets: tensor<int32_t, Mesh, "bt", layout<split<'b', "dp">>>, global {6, 64}
//
// Row r of step k's global batch is the window tokens[s, s + T] with
//   s = start(k, r) = mix(seed, k, r) mod (n - T)        (n tokens, T = sequence length)
// inputs hold tokens[s .. s+T-1], targets the next tokens[s+1 .. s+T]. mix is a
// counter-based generator (three rounds of splitmix64): no state, so the batch of step k
// is a pure function of (seed, k). It does not depend on the number of ranks, on which
// steps ran before (a run resumed from a checkpoint at step k sees the same data), or on
// the layout: each rank computes only the rows its block holds. Rows are split into
// zest's balanced blocks, so an uneven batch works: 6 rows over 4 ranks -> 2, 2, 1, 1.
// (The modulo's bias is below (n - T) / 2^64: nil for any corpus.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/random.hpp"
#include "zest/data/stream.hpp"
#include "zest/io/checksum.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/placement.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

// A random word for (seed, step, row): for fixed seed and step, distinct rows give
// distinct words (each round is a bijection).
constexpr std::uint64_t counter_hash(std::uint64_t seed, std::uint64_t step, std::uint64_t row) {
  return splitmix64(splitmix64(splitmix64(seed) ^ step) ^ row);
}

// Token ids "bt" with the batch dim split over mesh axis Axis: the data-parallel layout.
template <class Mesh, fixed_string Axis>
using batch_tensor = tensor<std::int32_t, Mesh, "bt", layout<split<'b', Axis>>>;

class batch_sampler {
 public:
  // Copies the tokens (a training text is small; the sampler cannot dangle).
  batch_sampler(std::span<const std::int32_t> tokens, std::size_t batch_size,
                std::size_t sequence_length, std::uint64_t seed)
      : tokens_(tokens.begin(), tokens.end()),
        batch_size_(batch_size),
        length_(sequence_length),
        seed_(seed),
        identity_(detail::message("batch_sampler seed=", seed, " tokens=", tokens.size(), " ",
                                  io::format_checksum(io::xxh64(std::as_bytes(tokens))))) {
    if (batch_size_ == 0 || length_ == 0) {
      throw shape_error(detail::message("zest: batch_sampler: batch size ", batch_size_,
                                        " and sequence length ", length_,
                                        " must both be positive"));
    }
    if (tokens_.size() < length_ + 1) {
      throw shape_error(detail::message(
          "zest: batch_sampler: a sequence of length ", length_, " needs ", length_ + 1,
          " tokens (inputs and the next-token targets), the text has ", tokens_.size()));
    }
  }

  std::size_t batch_size() const { return batch_size_; }
  std::size_t sequence_length() const { return length_; }
  std::uint64_t seed() const { return seed_; }
  std::span<const std::int32_t> tokens() const { return tokens_; }
  // How many distinct windows there are: start() takes values in [0, window_count()).
  std::size_t window_count() const { return tokens_.size() - length_; }

  // Where row `row` of step `step`'s global batch starts in tokens().
  std::size_t start(std::uint64_t step, std::size_t row) const {
    return static_cast<std::size_t>(counter_hash(seed_, step, row) % window_count());
  }

  // As a zest::token_stream (zest/data/stream.hpp): what decides the batches (the seed and
  // the text: "batch_sampler seed=1234 tokens=N xxh64:..."), and row `row` of batch `step`.
  const std::string& identity() const { return identity_; }
  void row(std::uint64_t step, std::size_t row, std::span<std::int32_t> inputs,
           std::span<std::int32_t> targets) const {
    const std::size_t s = start(step, row);
    for (std::size_t t = 0; t < length_; ++t) {
      inputs[t] = tokens_[s + t];
      targets[t] = tokens_[s + 1 + t];
    }
  }

  // The global batch as row-major B x T arrays, the same on every rank: for references
  // and for code that does not use a mesh.
  token_batch<std::vector<std::int32_t>> global_batch(std::uint64_t step) const {
    token_batch<std::vector<std::int32_t>> out;
    out.inputs.reserve(batch_size_ * length_);
    out.targets.reserve(batch_size_ * length_);
    for (std::size_t r = 0; r < batch_size_; ++r) {
      const std::size_t s = start(step, r);
      out.inputs.insert(out.inputs.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(s),
                        tokens_.begin() + static_cast<std::ptrdiff_t>(s + length_));
      out.targets.insert(out.targets.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(s + 1),
                         tokens_.begin() + static_cast<std::ptrdiff_t>(s + 1 + length_));
    }
    return out;
  }

  // Step `step`'s batch as "bt" tensors with any layout: each rank fills only its block.
  //   sampler.batch<zest::layout<>>(local, k)                       // whole batch, one process
  //   sampler.batch<zest::layout<zest::split<'b', "dp">>>(mesh, k)  // as batch<"dp">(mesh, k)
  template <class Layout, class Mesh>
  token_batch<tensor<std::int32_t, Mesh, "bt", Layout>> batch(const Mesh& mesh,
                                                              std::uint64_t step) const {
    return stream_batch<Layout>(*this, mesh, step);
  }

  // The data-parallel batch: rows split over mesh axis Axis in balanced blocks.
  template <fixed_string Axis, class Mesh>
  token_batch<batch_tensor<Mesh, Axis>> batch(const Mesh& mesh, std::uint64_t step) const {
    return batch<layout<split<'b', Axis>>>(mesh, step);
  }

 private:
  std::vector<std::int32_t> tokens_;
  std::size_t batch_size_;
  std::size_t length_;
  std::uint64_t seed_;
  std::string identity_;
};

}  // namespace zest
