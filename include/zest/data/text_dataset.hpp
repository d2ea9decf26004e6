// zest/data/text_dataset.hpp — a character-level dataset from a text corpus on disk.
//
//   auto data = zest::text_dataset::from_path();              // /usr/share/common-licenses
//   data.vocab_size();               // 86 on Debian 12: the distinct bytes of the corpus
//   data.train(), data.validation(); // token ids (int32): the first 90% and the last 10%
//   data.unigram_entropy().nats;     // 3.197 nats = 4.612 bits per token (Debian 12)
//   data.decode(data.encode("GNU")) == "GNU"
//   data.identity();                 // "xxh64:...": the byte-to-id mapping, for checkpoints
//
// Default corpus: every regular file of /usr/share/common-licenses (present on every
// Debian system), in sorted name order, concatenated. Symbolic links (GPL -> GPL-3, ...)
// are skipped so that no text is counted twice. On Debian 12 these are 14 files,
// 237,320 bytes, all ASCII: 213,588 training and 23,732 validation tokens.
//
// Tokens are bytes, numbered densely over the bytes that occur in the corpus (sorted):
// - bytes rather than Unicode characters: any file is read losslessly (a UTF-8 character
//   becomes several tokens) and decoding never fails;
// - a vocabulary built from the corpus rather than all 256 bytes: the licenses use 86,
//   and the embedding, the output projection and the softmax of a small model scale
//   with the vocabulary, so a 3x smaller one is a sizeable share of a CPU training step.
// The vocabulary covers the whole corpus (training and validation), so the validation
// text has no unknown tokens. The split is by position: validation is the last part.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/io/checksum.hpp"

namespace zest {

// An entropy in both units: cross-entropy losses are in nats (natural log).
struct token_entropy {
  double nats = 0;
  double bits = 0;
};

class text_dataset {
 public:
  static constexpr std::string_view default_corpus = "/usr/share/common-licenses";
  static constexpr double default_validation_fraction = 0.1;
  // The most text from_path reads: the dataset keeps the text and a 4-byte id per byte (5x
  // the corpus in memory), and a device or a pipe (/dev/zero) would never end.
  static constexpr std::size_t max_corpus_bytes = std::size_t{1} << 30;  // 1 GiB

  // Reads a file, or every regular file of a directory (not recursive, sorted by name,
  // symbolic links skipped). Throws std::runtime_error naming the path when it is missing,
  // unreadable, holds no text, or holds more than max_corpus_bytes (found while reading,
  // so that a file without a size, such as a device, is bounded too).
  static text_dataset from_path(
      const std::filesystem::path& path = std::filesystem::path(default_corpus),
      double validation_fraction = default_validation_fraction) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status)) {
      throw std::runtime_error(
          detail::message("zest: text_dataset: corpus '", path.string(),
                          "' does not exist; give a text file or a directory of them"));
    }
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(status)) {
      for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
        if (entry.is_symlink() || !entry.is_regular_file()) continue;
        files.push_back(entry.path());
      }
      if (ec) {
        throw std::runtime_error(detail::message("zest: text_dataset: cannot list directory '",
                                                 path.string(), "': ", ec.message()));
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    std::string text;
    for (const auto& file : files) read_file(file, text, path);
    if (text.empty()) {
      throw std::runtime_error(detail::message(
          "zest: text_dataset: corpus '", path.string(), "' is empty (", files.size(),
          files.size() == 1 ? " file" : " files", ", 0 bytes); it needs some text"));
    }
    text_dataset d(std::move(text), path.string(), validation_fraction);
    d.files_ = std::move(files);
    return d;
  }

  // A dataset from text in memory (`name` appears in messages and describe()).
  static text_dataset from_text(std::string text, std::string name = "<memory>",
                                double validation_fraction = default_validation_fraction) {
    if (text.empty()) {
      throw std::runtime_error(
          detail::message("zest: text_dataset: text '", name, "' is empty; it needs some text"));
    }
    return text_dataset(std::move(text), std::move(name), validation_fraction);
  }

  // Where the text came from, and the files read (in order; empty for from_text).
  const std::string& source() const { return source_; }
  const std::vector<std::filesystem::path>& files() const { return files_; }
  const std::string& text() const { return text_; }

  std::size_t vocab_size() const { return vocabulary_.size(); }
  // Token id -> byte, sorted: vocabulary()[id].
  const std::string& vocabulary() const { return vocabulary_; }
  // What the token ids mean: XXH64 of vocabulary() (the byte-to-id mapping), "xxh64:" and 16
  // hex digits. A model trained on one corpus reads another's ids as other characters; a
  // checkpoint records this and a resumed run compares it (zest/train/checkpoint.hpp).
  std::string identity() const {
    return io::format_checksum(io::xxh64(std::as_bytes(std::span(vocabulary_))));
  }

  // All tokens, then the two parts: train() is the first tokens, validation() the rest.
  std::span<const std::int32_t> tokens() const { return tokens_; }
  std::span<const std::int32_t> train() const { return tokens().first(train_size_); }
  std::span<const std::int32_t> validation() const { return tokens().subspan(train_size_); }

  // Throws shape_error for a byte that is not in the vocabulary.
  std::int32_t encode(char c) const {
    const std::int32_t id = id_of_[static_cast<unsigned char>(c)];
    if (id < 0) {
      throw shape_error(detail::message("zest: text_dataset::encode: byte ",
                                        static_cast<int>(static_cast<unsigned char>(c)),
                                        " does not occur in corpus '", source_, "'"));
    }
    return id;
  }
  std::vector<std::int32_t> encode(std::string_view s) const {
    std::vector<std::int32_t> out;
    out.reserve(s.size());
    for (char c : s) out.push_back(encode(c));
    return out;
  }
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string out;
    out.reserve(ids.size());
    for (std::int32_t id : ids) {
      if (id < 0 || static_cast<std::size_t>(id) >= vocabulary_.size()) {
        throw shape_error(detail::message("zest: text_dataset::decode: token id ", id,
                                          " is outside the vocabulary [0, ", vocabulary_.size(),
                                          ")"));
      }
      out += vocabulary_[static_cast<std::size_t>(id)];
    }
    return out;
  }

  // -sum p log p of the token frequencies of the training text: the loss of the best model
  // that ignores context. A language model has learnt something once it is well below.
  token_entropy unigram_entropy() const { return unigram_entropy(train()); }
  static token_entropy unigram_entropy(std::span<const std::int32_t> ids) {
    std::vector<std::size_t> count;
    for (std::int32_t id : ids) {
      const auto k = static_cast<std::size_t>(id);
      if (k >= count.size()) count.resize(k + 1, 0);
      ++count[k];
    }
    double nats = 0;
    const auto n = static_cast<double>(ids.size());
    for (std::size_t c : count) {
      if (c == 0) continue;
      const double p = static_cast<double>(c) / n;
      nats -= p * std::log(p);
    }
    return {nats, nats / std::numbers::ln2};
  }

  // "/usr/share/common-licenses: 14 files, 237320 bytes, vocabulary 86, 213588 train + 23732 validation tokens"
  std::string describe() const {
    return detail::message(
        source_, ": ", files_.empty() ? std::string() : std::to_string(files_.size()) + " files, ",
        text_.size(), " bytes, vocabulary ", vocab_size(), ", ", train().size(), " train + ",
        validation().size(), " validation tokens");
  }

 private:
  text_dataset(std::string text, std::string source, double validation_fraction)
      : source_(std::move(source)), text_(std::move(text)) {
    if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
      throw shape_error(detail::message("zest: text_dataset: validation fraction ",
                                        validation_fraction, " is outside [0, 1)"));
    }
    id_of_.fill(-1);
    std::array<bool, 256> present{};
    for (char c : text_) present[static_cast<unsigned char>(c)] = true;
    for (std::size_t b = 0; b < present.size(); ++b) {
      if (!present[b]) continue;
      id_of_[b] = static_cast<std::int32_t>(vocabulary_.size());
      vocabulary_ += static_cast<char>(static_cast<unsigned char>(b));
    }
    tokens_.reserve(text_.size());
    for (char c : text_) tokens_.push_back(id_of_[static_cast<unsigned char>(c)]);
    // The last round(n * fraction) tokens validate: 237320 * 0.1 -> 23732.
    const auto validation_size = static_cast<std::size_t>(
        std::llround(static_cast<double>(tokens_.size()) * validation_fraction));
    train_size_ = tokens_.size() - std::min(validation_size, tokens_.size());
  }

  // Appends the file to `text`, in blocks, refusing to go beyond max_corpus_bytes.
  static void read_file(const std::filesystem::path& file, std::string& text,
                        const std::filesystem::path& corpus) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      throw std::runtime_error(
          detail::message("zest: text_dataset: cannot open '", file.string(), "'"));
    }
    const auto too_large = [&] {
      throw std::runtime_error(detail::message("zest: text_dataset: corpus '", corpus.string(),
                                               "' holds more than ", max_corpus_bytes >> 20,
                                               " MiB, the most it reads (at '", file.string(),
                                               "'); give a smaller text file or folder"));
    };
    std::error_code ec;
    if (const auto size = std::filesystem::file_size(file, ec);
        !ec && size > max_corpus_bytes - std::min(text.size(), max_corpus_bytes))
      too_large();  // a regular file says its size: refused before reading
    constexpr std::size_t block = std::size_t{1} << 20;
    while (in) {
      const std::size_t at = text.size();
      text.resize(at + block);
      in.read(text.data() + at, static_cast<std::streamsize>(block));
      text.resize(at + static_cast<std::size_t>(in.gcount()));
      if (text.size() > max_corpus_bytes) too_large();
    }
    if (in.bad()) {
      throw std::runtime_error(
          detail::message("zest: text_dataset: error while reading '", file.string(), "'"));
    }
  }

  std::string source_;
  std::string text_;
  std::vector<std::filesystem::path> files_;
  std::string vocabulary_;
  std::array<std::int32_t, 256> id_of_{};
  std::vector<std::int32_t> tokens_;
  std::size_t train_size_ = 0;
};

}  // namespace zest
