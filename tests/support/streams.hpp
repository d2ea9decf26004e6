// A data loader of the tests' own, written against zest::token_stream only
// (zest/data/stream.hpp): tests/data/stream_test.cpp and tests/train/checkpoint_test.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "zest/core/random.hpp"

namespace zest::testing {

// A user's loader, written against zest::token_stream alone: the sequence 0, 1, 2, ... (mod
// `vocab`) cut into windows of length + 1 tokens, each epoch in its own shuffled order;
// global batch k holds samples k B .. k B + B - 1 of the epochs laid end to end.
class shuffled_windows {
 public:
  shuffled_windows(std::size_t tokens, std::size_t batch, std::size_t length, std::uint64_t seed,
                   std::size_t vocab = std::size_t{1} << 30U)
      : windows_(tokens / (length + 1)),
        batch_(batch),
        length_(length),
        seed_(seed),
        vocab_(vocab) {}
  std::string identity() const {
    return "shuffled_windows windows=" + std::to_string(windows_) +
           " seed=" + std::to_string(seed_) + " vocab=" + std::to_string(vocab_);
  }
  std::size_t batch_size() const { return batch_; }
  std::size_t sequence_length() const { return length_; }
  void row(std::uint64_t batch, std::size_t row, std::span<std::int32_t> inputs,
           std::span<std::int32_t> targets) const {
    const std::uint64_t sample = batch * batch_ + row;
    const std::size_t window = order(sample / windows_)[sample % windows_];
    for (std::size_t t = 0; t < length_; ++t) {
      inputs[t] = static_cast<std::int32_t>((window * (length_ + 1) + t) % vocab_);
      targets[t] = static_cast<std::int32_t>((window * (length_ + 1) + t + 1) % vocab_);
    }
  }

 private:
  std::vector<std::size_t> order(std::uint64_t epoch) const {
    std::vector<std::size_t> p(windows_);
    std::iota(p.begin(), p.end(), std::size_t{0});
    std::uint64_t state = splitmix64(seed_ ^ epoch);
    for (std::size_t i = windows_; i > 1; --i) {
      state = splitmix64(state);
      std::swap(p[i - 1], p[state % i]);
    }
    return p;
  }
  std::size_t windows_, batch_, length_;
  std::uint64_t seed_;
  std::size_t vocab_;
};
}  // namespace zest::testing
