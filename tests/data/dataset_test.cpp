// text_dataset: the default corpus, the split, the vocabulary, the unigram entropy, errors.
// Single process, no MPI.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "zest/data/text_dataset.hpp"

namespace {
namespace fs = std::filesystem;
using zest::text_dataset;

// What the default corpus should hold, counted independently: the sizes of the regular
// files (not symbolic links) of the folder.
std::uintmax_t default_corpus_bytes(std::size_t& files) {
  std::uintmax_t bytes = 0;
  files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(text_dataset::default_corpus))) {
    if (e.is_symlink() || !e.is_regular_file()) continue;
    bytes += e.file_size();
    ++files;
  }
  return bytes;
}

// A fresh empty folder under the system's temporary folder, removed at scope exit.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) : path(fs::temp_directory_path() / name) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}
}  // namespace

TEST_CASE("the default corpus: Debian's license texts, read whole, in name order") {
  const auto d = text_dataset::from_path();
  MESSAGE(d.describe());
  std::size_t files = 0;
  const auto bytes = default_corpus_bytes(files);
  CHECK(d.source() == text_dataset::default_corpus);
  CHECK(d.files().size() == files);
  CHECK(d.text().size() == bytes);
  CHECK(d.tokens().size() == bytes);
  CHECK(bytes > 100'000);  // 237,320 bytes on Debian 12
  CHECK(std::is_sorted(d.files().begin(), d.files().end()));
  for (const auto& f : d.files()) CHECK_FALSE(fs::is_symlink(f));
  // The first file's text opens the corpus.
  std::ifstream first(d.files().front(), std::ios::binary);
  std::string head(64, '\0');
  first.read(head.data(), static_cast<std::streamsize>(head.size()));
  CHECK(d.text().substr(0, static_cast<std::size_t>(first.gcount())) ==
        head.substr(0, static_cast<std::size_t>(first.gcount())));

  // Non-trivial: an English text's alphabet, and an entropy like English letters'.
  CHECK(d.vocab_size() >= 60);
  CHECK(d.vocab_size() <= 256);
  const auto h = d.unigram_entropy();
  MESSAGE("unigram entropy of the training text: ", h.nats, " nats = ", h.bits, " bits per token");
  CHECK(h.bits > 4.0);
  CHECK(h.bits < 5.5);
  CHECK(h.bits == doctest::Approx(h.nats / std::log(2.0)));
  // Every token decodes back to its byte.
  CHECK(d.decode(d.tokens()) == d.text());
  CHECK(d.decode(d.encode("GNU General Public License")) == "GNU General Public License");
}

TEST_CASE("loading is deterministic") {
  const auto a = text_dataset::from_path();
  const auto b = text_dataset::from_path(fs::path(text_dataset::default_corpus));
  CHECK(a.vocabulary() == b.vocabulary());
  CHECK(std::equal(a.tokens().begin(), a.tokens().end(), b.tokens().begin(), b.tokens().end()));
  CHECK(a.unigram_entropy().nats == b.unigram_entropy().nats);
}

TEST_CASE("a single file by path") {
  const fs::path gpl3 = fs::path(text_dataset::default_corpus) / "GPL-3";
  if (!fs::exists(gpl3)) return;
  const auto d = text_dataset::from_path(gpl3);
  CHECK(d.files().size() == 1);
  CHECK(d.text().size() == fs::file_size(gpl3));
  CHECK(d.text().starts_with("                    GNU GENERAL PUBLIC LICENSE"));
}

TEST_CASE("the split: the last 10% validates, rounded") {
  const std::string text(100, 'x');
  auto d = text_dataset::from_text(text);
  CHECK(d.train().size() == 90);
  CHECK(d.validation().size() == 10);
  CHECK(d.validation().data() == d.tokens().data() + 90);

  d = text_dataset::from_text(std::string(12, 'x'), "twelve", 0.25);
  CHECK(d.train().size() == 9);
  d = text_dataset::from_text(std::string(7, 'x'), "seven");  // 0.7 rounds to 1
  CHECK(d.train().size() == 6);
  CHECK(d.validation().size() == 1);
  d = text_dataset::from_text("abc", "no validation", 0.0);
  CHECK(d.train().size() == 3);
  CHECK(d.validation().empty());

  // The default corpus: n - round(n / 10) training tokens.
  const auto c = text_dataset::from_path();
  const auto n = c.tokens().size();
  CHECK(c.validation().size() ==
        static_cast<std::size_t>(std::llround(static_cast<double>(n) * 0.1)));
  CHECK(c.train().size() + c.validation().size() == n);
}

TEST_CASE("vocabulary and unigram entropy of \"abracadabra\", by hand") {
  const auto d = text_dataset::from_text("abracadabra", "abracadabra", 0.0);
  CHECK(d.vocabulary() == "abcdr");  // sorted bytes: ids 0..4
  CHECK(d.encode("abracadabra") == std::vector<std::int32_t>{0, 1, 4, 0, 2, 0, 3, 0, 1, 4, 0});
  // Counts a 5, b 2, r 2, c 1, d 1 of 11.
  const double p[] = {5.0 / 11, 2.0 / 11, 2.0 / 11, 1.0 / 11, 1.0 / 11};
  double nats = 0;
  for (double q : p) nats -= q * std::log(q);
  const auto h = d.unigram_entropy();
  CHECK(h.nats == doctest::Approx(nats).epsilon(1e-14));
  CHECK(h.nats == doctest::Approx(1.4142790651247086).epsilon(1e-12));
  CHECK(h.bits == doctest::Approx(2.0403733936884962).epsilon(1e-12));
  // The entropy is that of the training part only: "aaaab" + validation "bbbbb".
  const auto e = text_dataset::from_text("aaaabbbbbb", "split", 0.5);
  CHECK(e.unigram_entropy().bits ==
        doctest::Approx(-(0.8 * std::log2(0.8) + 0.2 * std::log2(0.2))));
  // One symbol: zero.
  CHECK(text_dataset::from_text("zzzz", "z", 0.0).unigram_entropy().nats == 0.0);
}

TEST_CASE("bytes beyond ASCII are tokens too") {
  const auto d = text_dataset::from_text("caf\xc3\xa9 caf\xc3\xa9", "utf-8", 0.0);
  CHECK(d.vocab_size() == 6);  // ' ', a, c, f, 0xa9, 0xc3
  CHECK(d.decode(d.tokens()) == d.text());
}

TEST_CASE("errors name the path and the fix") {
  const std::string missing = "/nonexistent/zest-corpus";
  auto what = error_of([&] { (void)text_dataset::from_path(missing); });
  CHECK(what.find("zest: text_dataset") == 0);
  CHECK(what.find(missing) != std::string::npos);
  CHECK(what.find("does not exist") != std::string::npos);
  CHECK_THROWS_AS((void)text_dataset::from_path(missing), std::runtime_error);

  const temp_dir dir("zest-dataset-test-empty");
  what = error_of([&] { (void)text_dataset::from_path(dir.path); });
  CHECK(what.find(dir.path.string()) != std::string::npos);
  CHECK(what.find("is empty (0 files, 0 bytes)") != std::string::npos);
  { std::ofstream(dir.path / "empty.txt"); }
  what = error_of([&] { (void)text_dataset::from_path(dir.path / "empty.txt"); });
  CHECK(what.find("empty.txt' is empty") != std::string::npos);
  CHECK_THROWS_AS((void)text_dataset::from_path(dir.path), std::runtime_error);
  {
    std::ofstream(dir.path / "b.txt") << "world";
    std::ofstream(dir.path / "a.txt") << "hello ";
  }
  fs::create_symlink(dir.path / "a.txt", dir.path / "c-link.txt");
  fs::create_directory(dir.path / "sub");
  const auto d = text_dataset::from_path(dir.path);
  CHECK(d.text() == "hello world");  // a, b, empty; the link and the folder are skipped
  CHECK(d.files().size() == 3);

  CHECK_THROWS_AS((void)text_dataset::from_text(""), std::runtime_error);
  CHECK_THROWS_AS((void)text_dataset::from_text("abc", "bad fraction", 1.0), zest::shape_error);
  CHECK_THROWS_AS((void)text_dataset::from_text("abc", "bad fraction", -0.1), zest::shape_error);
  what = error_of([&] { (void)d.encode('!'); });
  CHECK(what.find("byte 33 does not occur") != std::string::npos);
  const std::vector<std::int32_t> bad{0, 99};
  what = error_of([&] { (void)d.decode(bad); });
  CHECK(what.find("token id 99 is outside the vocabulary [0, ") != std::string::npos);
}
