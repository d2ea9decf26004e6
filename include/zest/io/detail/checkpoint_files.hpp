// zest/io/detail/checkpoint_files.hpp — the files of a checkpoint folder: their names, reading
// them at offsets, the generation a save puts in its shard names, and removing what no
// manifest names (zest/io/checkpoint.hpp says how a save uses them).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "zest/core/bfloat16.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/float16.hpp"

namespace zest::io {

inline constexpr std::string_view manifest_file_name = "manifest.json";

namespace detail {

inline std::size_t element_size(dtype t) {
  switch (t) {
    case dtype::f32: return sizeof(float);
    case dtype::f64: return sizeof(double);
    case dtype::bf16: return sizeof(bfloat16);
    case dtype::f16: return sizeof(float16);
    case dtype::i32: return sizeof(std::int32_t);
    case dtype::i64: return sizeof(std::int64_t);
    case dtype::u8: return sizeof(std::uint8_t);
    case dtype::u16: return sizeof(std::uint16_t);
  }
  return 0;
}

// "step-00000100.gen-3f9a0c2d5e4b1a07.rank-0001.bin": the step for people, the save's
// generation (a random id drawn by rank 0) so that no two saves share a file name.
inline std::string shard_file_name(std::int64_t step, std::uint64_t generation, int rank) {
  std::array<char, 96> buf{};
  std::snprintf(buf.data(), buf.size(), "step-%08lld.gen-%016llx.rank-%04d.bin",
                static_cast<long long>(step), static_cast<unsigned long long>(generation), rank);
  return buf.data();
}

// The names save_checkpoint gives shard files: "step-<digits>.gen-<hex>.rank-<digits>.bin",
// and "step-<digits>.rank-<digits>.bin" of format version 1 (removed as stale).
inline bool is_shard_file_name(std::string_view name) {
  auto run = [&](std::string_view prefix, std::string_view allowed) {
    if (name.substr(0, prefix.size()) != prefix) return false;
    name.remove_prefix(prefix.size());
    std::size_t n = 0;
    while (n < name.size() && allowed.find(name[n]) != std::string_view::npos) ++n;
    if (n == 0) return false;
    name.remove_prefix(n);
    return true;
  };
  constexpr std::string_view digits = "0123456789", hex = "0123456789abcdef";
  if (!run("step-", digits)) return false;
  if (name.substr(0, 5) == ".gen-" && !run(".gen-", hex)) return false;
  return run(".rank-", digits) && name == ".bin";
}

// A file name the manifest may use: no folders, nothing hidden, printable ASCII.
inline bool is_plain_file_name(std::string_view name) {
  if (name.empty() || name.front() == '.' || name.size() > 255) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return c > ' ' && c < 127 && c != '/' && c != '\\'; });
}

inline std::string join_extents(std::span<const std::size_t> e) {
  std::string s = "[";
  for (std::size_t k = 0; k < e.size(); ++k) {
    if (k) s += ", ";
    s += std::to_string(e[k]);
  }
  return s + "]";
}

inline std::size_t volume(std::span<const std::size_t> extents) {
  std::size_t n = 1;
  for (const std::size_t e : extents) n *= e;
  return n;
}

[[noreturn]] inline void throw_io(std::string_view op, std::string_view what,
                                  const std::filesystem::path& path, int err) {
  throw checkpoint_error(zest::detail::message("zest: ", op, ": ", what, " ", path, ": ",
                                               std::generic_category().message(err)));
}

// -----------------------------------------------------------------------------------------
// Files.

// A file open for reading at offsets.
class input_file {
 public:
  input_file(std::filesystem::path path, std::string_view op) : path_(std::move(path)), op_(op) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw_io(op_, "cannot open", path_, errno);
  }
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;
  ~input_file() { ::close(fd_); }

  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_io(op_, "cannot stat", path_, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }
  // Exactly out.size() bytes from `offset`; throws if the file ends first.
  void read_at(std::uint64_t offset, std::span<std::byte> out) const {
    while (!out.empty()) {
      const ssize_t n = ::pread(fd_, out.data(), out.size(), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_io(op_, "cannot read", path_, errno);
      }
      if (n == 0) {
        throw checkpoint_error(zest::detail::message("zest: ", op_, ": ", path_, " ends at byte ",
                                                     offset, ", before the ", out.size(),
                                                     " bytes the manifest promises"));
      }
      offset += static_cast<std::uint64_t>(n);
      out = out.subspan(static_cast<std::size_t>(n));
    }
  }

 private:
  std::filesystem::path path_;
  std::string_view op_;
  int fd_ = -1;
};

// Bytes per read when loading; small values let tests cross block pieces everywhere.
inline std::size_t& read_chunk_bytes() {
  static std::size_t bytes = std::size_t{8} << 20U;
  return bytes;
}
// Bytes per write when saving: each piece is checksummed, then written while it is still
// in cache.
inline constexpr std::size_t write_chunk_bytes = std::size_t{4} << 20U;

// A random id for a save, drawn by rank 0: the generation in its shard names. 64 random
// bits (the device's entropy, the clock and the process id, mixed): two saves into one
// folder never share one in practice.
inline std::uint64_t new_generation() {
  std::uint64_t x =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  x ^= static_cast<std::uint64_t>(::getpid()) << 32U;
  try {
    std::random_device device;
    x ^= (static_cast<std::uint64_t>(device()) << 32U) ^ device();
  } catch (const std::exception&) {
    // No entropy device: the clock and the process id alone.
  }
  auto mix = [](std::uint64_t z) {  // splitmix64's finalizer
    z = (z ^ (z >> 30U)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27U)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31U);
  };
  return mix(x + 0x9e3779b97f4a7c15ULL);
}

inline std::string generation_text(std::uint64_t generation) {
  std::array<char, 24> buf{};
  std::snprintf(buf.data(), buf.size(), "%016llx", static_cast<unsigned long long>(generation));
  return buf.data();
}

// The generations of the saves this process has in progress (drawn by it, as rank 0, and
// not yet committed or given up): an asynchronous save's shards are written while the save
// before it commits, and that commit's cleanup must leave them alone.
class saves_in_flight {
 public:
  static saves_in_flight& instance() {
    static saves_in_flight s;
    return s;
  }
  void add(std::uint64_t generation) {
    const std::lock_guard lock(mutex_);
    generations_.insert(generation_text(generation));
  }
  void remove(std::uint64_t generation) {
    const std::lock_guard lock(mutex_);
    generations_.erase(generation_text(generation));
  }
  // Whether `name` (a shard or its temporary file) belongs to a save in progress.
  bool holds(const std::string& name) const {
    const std::lock_guard lock(mutex_);
    for (const auto& g : generations_)
      if (name.find(".gen-" + g + ".") != std::string::npos) return true;
    return false;
  }
  // The folders whose latest save has started its commit (its manifest may be being
  // written) and not been waited for: a second commit into one of them would race the
  // first for the manifest. Every rank keeps its own list; the ranks make the same calls, so
  // the lists agree.
  bool begin_commit(const std::filesystem::path& dir) {
    const std::lock_guard lock(mutex_);
    return committing_.insert(key(dir)).second;
  }
  void end_commit(const std::filesystem::path& dir) {
    const std::lock_guard lock(mutex_);
    committing_.erase(key(dir));
  }

 private:
  static std::string key(const std::filesystem::path& dir) {
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
    return (ec ? dir : absolute).lexically_normal().string();
  }
  mutable std::mutex mutex_;
  std::set<std::string> generations_;
  std::set<std::string> committing_;
};

// After a commit: removes the shard files `named` does not hold (older generations,
// leftovers of failed saves) and the temporary files of shards and manifests, but not the
// files of saves in progress (saves_in_flight). Best effort: what cannot be removed is
// garbage, never part of the checkpoint.
inline void remove_stale_files(const std::filesystem::path& dir,
                               const std::set<std::string>& named) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (saves_in_flight::instance().holds(name)) continue;
    const std::size_t temp_at = name.find(".tmp.");
    const bool stale_shard = is_shard_file_name(name) && !named.contains(name);
    const bool stale_temp = name.size() > 1 && name.front() == '.' &&
                            temp_at != std::string::npos &&
                            (is_shard_file_name(name.substr(1, temp_at - 1)) ||
                             name.substr(1, temp_at - 1) == manifest_file_name);
    if (stale_shard || stale_temp) stale.push_back(it->path());
  }
  for (const auto& p : stale) (void)zest::detail::remove_file(p);
}

}  // namespace detail

}  // namespace zest::io
