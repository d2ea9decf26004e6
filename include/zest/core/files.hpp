// zest/core/files.hpp — writing a file so that readers never see half of it.
//
//   zest::write_text_file_atomically("runs/a/log.json", text);  // all of text, or the old file
//   std::string back = zest::read_text_file("runs/a/log.json");
//
// write_text_file_atomically writes a temporary file next to the target (same folder, so
// the rename cannot cross file systems), flushes it to disk (fsync), renames it over the
// target and flushes the folder, so that a crash or a reader at any moment sees either the
// previous file or the complete new one. Missing parent folders are created. POSIX only.
// Errors throw std::filesystem::filesystem_error with a "zest: ..." message, the path and
// the errno; the temporary file is removed.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>

#include "zest/core/error.hpp"

namespace zest {

namespace detail {

[[noreturn]] inline void throw_file_error(std::string_view what, const std::filesystem::path& p,
                                          int err) {
  throw std::filesystem::filesystem_error(detail::message("zest: ", what), p,
                                          std::error_code(err, std::generic_category()));
}

// Closes a file descriptor and, unless released, removes the temporary file it names.
class temp_file_guard {
 public:
  temp_file_guard(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  temp_file_guard(const temp_file_guard&) = delete;
  temp_file_guard& operator=(const temp_file_guard&) = delete;
  ~temp_file_guard() {
    if (fd_ >= 0) ::close(fd_);
    if (!released_) {
      std::error_code ignored;
      std::filesystem::remove(path_, ignored);
    }
  }
  int fd() const { return fd_; }
  // Closes the descriptor now; returns 0 or the errno of close().
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  void release() { released_ = true; }

 private:
  int fd_;
  std::filesystem::path path_;
  bool released_ = false;
};

}  // namespace detail

// Replaces (or creates) `path` with `text`, atomically: see the top of this header.
inline void write_text_file_atomically(const std::filesystem::path& path, std::string_view text) {
  namespace fs = std::filesystem;
  constexpr std::string_view op = "write_text_file_atomically: ";
  if (path.empty() || !path.has_filename())
    detail::throw_file_error(detail::message(op, "not a file path"), path, EINVAL);
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec)
    detail::throw_file_error(detail::message(op, "cannot create the folder"), folder, ec.value());

  // A name no other writer (thread or process) uses at the same time.
  static std::atomic<unsigned long> counter{0};
  const fs::path temp =
      folder / detail::message(".", path.filename().string(), ".tmp.", ::getpid(), ".",
                               counter.fetch_add(1, std::memory_order_relaxed));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0)
    detail::throw_file_error(detail::message(op, "cannot create a temporary file"), temp, errno);
  detail::temp_file_guard guard(fd, temp);

  const char* data = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::throw_file_error(detail::message(op, "cannot write"), temp, errno);
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) detail::throw_file_error(detail::message(op, "fsync failed"), temp, errno);
  if (const int err = guard.close(); err != 0)
    detail::throw_file_error(detail::message(op, "close failed"), temp, err);
  if (::rename(temp.c_str(), path.c_str()) != 0)
    detail::throw_file_error(detail::message(op, "cannot rename the temporary file over it"), path,
                             errno);
  guard.release();

  // Make the rename itself durable. Some file systems cannot fsync a folder; the file is
  // in place either way, so that is not an error.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

// The whole content of `path`; throws std::filesystem::filesystem_error when it cannot be
// read.
inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::throw_file_error("read_text_file: cannot open", path, errno ? errno : ENOENT);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) detail::throw_file_error("read_text_file: cannot read", path, EIO);
  return text;
}

}  // namespace zest
