// zest/core/files.hpp — writing a file so that readers never see half of it.
//
//   zest::write_text_file_atomically("runs/a/log.json", text);  // all of text, or the old file
//   std::string back = zest::read_text_file("runs/a/log.json");
//
//   zest::atomic_file_writer out("ckpt/shard.bin", "save_checkpoint");  // pieces of any size
//   out.write(bytes); out.write(more);
//   out.commit();                                  // the file appears whole, or not at all
//
// An atomic write goes to a temporary file next to the target (same folder, so the rename
// cannot cross file systems), flushes it to disk (fsync), renames it over the target and
// flushes the folder, so that a crash or a reader at any moment sees either the previous
// file or the complete new one. Missing parent folders are created. POSIX only. Errors
// throw std::filesystem::filesystem_error with a "zest: <op>: ..." message, the path and
// the errno; the temporary file is removed.
//
// Every write-side file operation of this header (and of zest/io/checkpoint.hpp, which
// writes through it) goes through one function per operation in zest::detail, each of which
// first asks the test-only fault hook, detail::file_fault(): a test counts the operations
// and makes the K-th fail with EIO, or ends the process there, to check that no crash or
// I/O error at any point leaves a broken result (tests/io/checkpoint_fault.cpp).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "zest/core/error.hpp"

namespace zest {

namespace detail {

// -----------------------------------------------------------------------------------------
// The file operations, each behind the fault hook.

enum class file_op : std::uint8_t {
  create_folder,  // create_directories
  open,           // a new file, for writing
  write,          // one write(2) call's worth
  fsync,          // a file's data
  close,
  rename,
  fsync_folder,  // a folder's entries (makes a rename durable)
  remove,
};

inline const char* file_op_name(file_op op) {
  switch (op) {
    case file_op::create_folder: return "create_folder";
    case file_op::open: return "open";
    case file_op::write: return "write";
    case file_op::fsync: return "fsync";
    case file_op::close: return "close";
    case file_op::rename: return "rename";
    case file_op::fsync_folder: return "fsync_folder";
    case file_op::remove: return "remove";
  }
  return "?";
}

// Test-only. When set, called before every operation above with the path it concerns:
// returning an errno (EIO, ENOSPC, ...) makes the operation fail with it without doing it
// (a close still releases the descriptor); returning 0 lets it run. A hook may also end the
// process (_exit, SIGKILL) to stand for a crash at that point. Set it while no file is being
// written; production code never sets it.
using file_fault_hook = int (*)(file_op op, const std::filesystem::path& path);
inline file_fault_hook& file_fault() {
  static file_fault_hook hook = nullptr;
  return hook;
}
inline int injected_fault(file_op op, const std::filesystem::path& path) {
  const file_fault_hook hook = file_fault();
  return hook == nullptr ? 0 : hook(op, path);
}

// Each returns 0 or the errno of the failure.
inline int create_folders(const std::filesystem::path& folder) {
  if (const int err = injected_fault(file_op::create_folder, folder)) return err;
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  return ec ? ec.value() : 0;
}
// A new file (O_EXCL: never one that exists); `fd` receives the descriptor.
inline int open_new_file(const std::filesystem::path& path, int& fd) {
  fd = -1;
  if (const int err = injected_fault(file_op::open, path)) return err;
  fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  return fd < 0 ? errno : 0;
}
// All of `data` (several write(2) calls if need be, each one operation).
inline int write_all(int fd, std::span<const std::byte> data, const std::filesystem::path& path) {
  while (!data.empty()) {
    if (const int err = injected_fault(file_op::write, path)) return err;
    const std::size_t piece = std::min<std::size_t>(data.size(), std::size_t{1} << 30U);
    const ssize_t n = ::write(fd, data.data(), piece);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data = data.subspan(static_cast<std::size_t>(n));
  }
  return 0;
}
inline int fsync_file(int fd, const std::filesystem::path& path) {
  if (const int err = injected_fault(file_op::fsync, path)) return err;
  return ::fsync(fd) == 0 ? 0 : errno;
}
inline int close_file(int fd, const std::filesystem::path& path) {
  const int injected = injected_fault(file_op::close, path);
  const int rc = ::close(fd);
  if (injected != 0) return injected;
  return rc == 0 ? 0 : errno;
}
inline int rename_file(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (const int err = injected_fault(file_op::rename, to)) return err;
  return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}
// Makes the folder's entries (a rename, a new file) durable. A file system that cannot
// flush a folder (EINVAL, ENOTSUP) is not an error: its renames are as durable as it gets.
inline int fsync_folder(const std::filesystem::path& folder) {
  if (const int err = injected_fault(file_op::fsync_folder, folder)) return err;
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = ::fsync(fd) == 0 ? 0 : errno;
  if (err == EINVAL || err == ENOTSUP || err == EOPNOTSUPP) err = 0;
  ::close(fd);
  return err;
}
inline int remove_file(const std::filesystem::path& path) {
  if (const int err = injected_fault(file_op::remove, path)) return err;
  return ::unlink(path.c_str()) == 0 ? 0 : errno;
}

[[noreturn]] inline void throw_file_error(std::string_view what, const std::filesystem::path& p,
                                          int err) {
  throw std::filesystem::filesystem_error(detail::message("zest: ", what), p,
                                          std::error_code(err, std::generic_category()));
}

inline std::filesystem::path folder_of(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

}  // namespace detail

// Writes `target` atomically (see the top of this header): write() any number of pieces,
// then commit(). Destroyed without a commit (an error, an exception elsewhere), it removes
// the temporary file and leaves the target as it was. `op` names the caller in messages.
class atomic_file_writer {
 public:
  atomic_file_writer(std::filesystem::path target, std::string_view op)
      : target_(std::move(target)), op_(op) {
    if (target_.empty() || !target_.has_filename()) fail("not a file path", target_, EINVAL);
    folder_ = detail::folder_of(target_);
    if (const int err = detail::create_folders(folder_))
      fail("cannot create the folder", folder_, err);
    // A name no other writer (thread or process) uses at the same time.
    static std::atomic<unsigned long> counter{0};
    temp_ = folder_ / detail::message(".", target_.filename().string(), ".tmp.", ::getpid(), ".",
                                      counter.fetch_add(1, std::memory_order_relaxed));
    if (const int err = detail::open_new_file(temp_, fd_))
      fail("cannot create a temporary file", temp_, err);
  }
  atomic_file_writer(const atomic_file_writer&) = delete;
  atomic_file_writer& operator=(const atomic_file_writer&) = delete;
  ~atomic_file_writer() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) (void)::unlink(temp_.c_str());
  }

  void write(std::span<const std::byte> data) {
    if (const int err = detail::write_all(fd_, data, temp_)) fail("cannot write", temp_, err);
  }
  void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }

  // fsync, close, rename over the target, fsync of the folder. Once renamed() is true the
  // target holds the new content even if the folder's flush then fails (and throws): the
  // rename is done, only its durability is in doubt.
  void commit() {
    if (const int err = detail::fsync_file(fd_, temp_)) fail("cannot flush (fsync)", temp_, err);
    const int fd = std::exchange(fd_, -1);
    if (const int err = detail::close_file(fd, temp_)) fail("cannot close", temp_, err);
    if (const int err = detail::rename_file(temp_, target_))
      fail("cannot rename the temporary file over", target_, err);
    renamed_ = true;
    if (const int err = detail::fsync_folder(folder_))
      fail("cannot flush the folder", folder_, err);
  }
  bool renamed() const { return renamed_; }
  const std::filesystem::path& target() const { return target_; }

 private:
  [[noreturn]] void fail(std::string_view what, const std::filesystem::path& p, int err) const {
    detail::throw_file_error(detail::message(op_, ": ", what), p, err);
  }

  std::filesystem::path target_, folder_, temp_;
  std::string op_;
  int fd_ = -1;
  bool renamed_ = false;
};

// Replaces (or creates) `path` with `text`, atomically: see the top of this header.
inline void write_text_file_atomically(const std::filesystem::path& path, std::string_view text) {
  atomic_file_writer out(path, "write_text_file_atomically");
  out.write(text);
  out.commit();
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
