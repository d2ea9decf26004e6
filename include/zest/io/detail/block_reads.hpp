// zest/io/detail/block_reads.hpp — what a rank reads on load: the parts of the saved
// blocks (boxes in global index space) that overlap the block it holds now, whatever mesh
// and layout either side has, as runs of contiguous bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/io/checksum.hpp"
#include "zest/io/detail/checkpoint_files.hpp"
#include "zest/io/manifest.hpp"
#include "zest/io/tensor_record.hpp"

namespace zest::io {

namespace detail {

// -----------------------------------------------------------------------------------------
// Boxes: a block's place in global index space.

struct box {
  std::span<const std::size_t> offsets, extents;
};

// The intersection of a and b; false when it is empty.
inline bool intersect(const box& a, const box& b, std::vector<std::size_t>& off,
                      std::vector<std::size_t>& ext) {
  const std::size_t n = a.offsets.size();
  off.resize(n);
  ext.resize(n);
  bool any = true;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t lo = std::max(a.offsets[k], b.offsets[k]);
    const std::size_t hi = std::min(a.offsets[k] + a.extents[k], b.offsets[k] + b.extents[k]);
    off[k] = lo;
    ext[k] = hi > lo ? hi - lo : 0;
    if (ext[k] == 0) any = false;
  }
  return any;
}

// The contiguous runs of an intersection box, in increasing order of their place in the
// source box (both boxes row-major): src(), dst() are byte offsets into the source and
// destination blocks, bytes() the run's length. Trailing dims that all three boxes cover
// whole are merged into one run.
class run_walker {
 public:
  run_walker(const box& src, const box& dst, std::span<const std::size_t> off,
             std::span<const std::size_t> ext, std::size_t element_bytes) {
    const std::size_t n = off.size();
    run_bytes_ = element_bytes;
    if (n == 0) return;
    std::size_t j = n - 1;
    std::size_t run = ext[j];
    while (j > 0 && ext[j] == src.extents[j] && ext[j] == dst.extents[j]) {
      --j;
      run *= ext[j];
    }
    run_bytes_ = run * element_bytes;
    outer_ = j;
    src_stride_.resize(n);
    dst_stride_.resize(n);
    std::size_t ss = element_bytes, ds = element_bytes;
    for (std::size_t k = n; k-- > 0;) {
      src_stride_[k] = ss;
      dst_stride_[k] = ds;
      ss *= src.extents[k];
      ds *= dst.extents[k];
      src_ += (off[k] - src.offsets[k]) * src_stride_[k];
      dst_ += (off[k] - dst.offsets[k]) * dst_stride_[k];
    }
    ext_.assign(ext.begin(), ext.begin() + static_cast<std::ptrdiff_t>(j));
    index_.assign(j, 0);
  }

  std::size_t src() const { return src_; }
  std::size_t dst() const { return dst_; }
  std::size_t bytes() const { return run_bytes_; }

  // Moves to the next run; false after the last.
  bool advance() {
    for (std::size_t k = outer_; k-- > 0;) {
      src_ += src_stride_[k];
      dst_ += dst_stride_[k];
      if (++index_[k] < ext_[k]) return true;
      src_ -= ext_[k] * src_stride_[k];
      dst_ -= ext_[k] * dst_stride_[k];
      index_[k] = 0;
    }
    return false;
  }

 private:
  std::size_t outer_ = 0;
  std::size_t run_bytes_ = 0, src_ = 0, dst_ = 0;
  std::vector<std::size_t> src_stride_, dst_stride_, ext_, index_;
};

// One saved block to read for one target, and the piece of it the target takes.
struct read_task {
  std::size_t target = 0;
  const saved_tensor* tensor = nullptr;
  const saved_block* block = nullptr;
  std::vector<std::size_t> off, ext;  // the intersection, global indices
};

// Reads and verifies one block, copying its intersection with the target's box into
// `staging` (the target's block).
inline void read_block(const input_file& in, const read_task& task, const tensor_record& target,
                       std::span<std::byte> staging, std::vector<std::byte>& chunk,
                       std::string_view op, const std::filesystem::path& file) {
  const saved_block& b = *task.block;
  run_walker runs(box{b.box_offsets, b.box_extents},
                  box{target.local_offsets, target.local_extents}, task.off, task.ext,
                  task.tensor->element_bytes);
  bool more = true;
  xxh64_state hash;
  for (std::uint64_t pos = 0; pos < b.bytes;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), b.bytes - pos));
    const std::span<std::byte> piece(chunk.data(), n);
    in.read_at(b.offset + pos, piece);
    hash.update(piece);
    const std::uint64_t end = pos + n;
    while (more) {
      const std::uint64_t s = runs.src(), e = s + runs.bytes();
      if (s >= end) break;
      const std::uint64_t lo = std::max<std::uint64_t>(s, pos), hi = std::min(e, end);
      if (lo < hi) {
        std::memcpy(staging.data() + runs.dst() + (lo - s), chunk.data() + (lo - pos), hi - lo);
      }
      if (e > end) break;
      more = runs.advance();
    }
    pos = end;
  }
  const std::uint64_t got = hash.digest();
  if (got != b.checksum) {
    throw checkpoint_error(zest::detail::message(
        "zest: ", op, ": checksum mismatch in ", file, " (bytes ", b.offset, " to ",
        b.offset + b.bytes, ", the block ", join_extents(b.box_offsets), " + ",
        join_extents(b.box_extents), " of tensor \"", task.tensor->name, "\"): the manifest says ",
        format_checksum(b.checksum), ", the data gives ", format_checksum(got),
        "; the file is corrupt"));
  }
}

// Which saved tensor each target is; throws "does not match" naming every difference.
inline std::vector<const saved_tensor*> match_targets(std::string_view op,
                                                      const std::filesystem::path& dir,
                                                      const manifest& m,
                                                      std::span<const tensor_record> targets) {
  std::unordered_map<std::string_view, const saved_tensor*> saved;
  for (const auto& s : m.tensors) saved.emplace(s.name, &s);
  std::vector<std::string> problems;
  std::vector<const saved_tensor*> out;
  std::set<std::string_view> wanted;
  for (const auto& t : targets) {
    wanted.insert(t.name);
    const auto it = saved.find(t.name);
    if (it == saved.end()) {
      problems.push_back(zest::detail::message("tensor \"", t.name,
                                               "\" is in the model but not in the checkpoint"));
      out.push_back(nullptr);
      continue;
    }
    const saved_tensor& s = *it->second;
    out.push_back(&s);
    if (s.dims != t.dims) {
      problems.push_back(zest::detail::message("tensor \"", t.name, "\": dims \"", s.dims,
                                               "\" in the checkpoint, \"", t.dims,
                                               "\" in the model"));
    }
    if (s.dtype_name != name_of(t.type) || s.element_bytes != element_size(t.type)) {
      problems.push_back(zest::detail::message("tensor \"", t.name, "\": dtype ", s.dtype_name,
                                               " in the checkpoint, ", name_of(t.type),
                                               " in the model"));
    }
    if (s.extents != t.global_extents) {
      problems.push_back(zest::detail::message("tensor \"", t.name, "\": extents ",
                                               join_extents(s.extents), " in the checkpoint, ",
                                               join_extents(t.global_extents), " in the model"));
    }
  }
  for (const auto& s : m.tensors) {
    if (!wanted.contains(s.name)) {
      problems.push_back(zest::detail::message("tensor \"", s.name,
                                               "\" is in the checkpoint but not in the model"));
    }
  }
  if (!problems.empty()) {
    std::string list;
    constexpr std::size_t shown = 8;
    for (std::size_t i = 0; i < problems.size() && i < shown; ++i) {
      list += (i ? "; " : "") + problems[i];
    }
    if (problems.size() > shown) {
      list += zest::detail::message("; and ", problems.size() - shown, " more");
    }
    throw checkpoint_error(zest::detail::message(
        "zest: ", op, ": ", dir, ": the checkpoint does not match the model: ", list));
  }
  return out;
}

inline bool overlap(const read_task& a, const read_task& b) {
  for (std::size_t k = 0; k < a.off.size(); ++k) {
    if (a.off[k] >= b.off[k] + b.ext[k] || b.off[k] >= a.off[k] + a.ext[k]) return false;
  }
  return true;
}

// The saved blocks each target needs, after checking that they cover its box exactly once.
inline std::vector<read_task> plan_reads(std::string_view op,
                                         std::span<const tensor_record> targets,
                                         const std::vector<const saved_tensor*>& sources) {
  std::vector<read_task> tasks;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const tensor_record& t = targets[i];
    const box want{t.local_offsets, t.local_extents};
    const std::size_t need = volume(t.local_extents);
    if (need == 0) continue;
    const std::size_t first = tasks.size();
    std::size_t covered = 0;
    for (const auto& b : sources[i]->blocks) {
      read_task task{i, sources[i], &b, {}, {}};
      if (!intersect(box{b.box_offsets, b.box_extents}, want, task.off, task.ext)) continue;
      covered += volume(task.ext);
      tasks.push_back(std::move(task));
    }
    // Saved blocks never overlap; a manifest whose blocks do is corrupt (and could hide a
    // gap from the count below).
    for (std::size_t a = first; a < tasks.size(); ++a) {
      for (std::size_t b = a + 1; b < tasks.size(); ++b) {
        if (overlap(tasks[a], tasks[b])) {
          throw checkpoint_error(zest::detail::message(
              "zest: ", op, ": tensor \"", t.name, "\": the saved blocks at ",
              join_extents(tasks[a].block->box_offsets), " and ",
              join_extents(tasks[b].block->box_offsets), " overlap; the manifest is corrupt"));
        }
      }
    }
    if (covered != need) {
      throw checkpoint_error(zest::detail::message(
          "zest: ", op, ": tensor \"", t.name, "\": the checkpoint holds ", covered, " of the ",
          need, " elements of this rank's block ", join_extents(t.local_offsets), " + ",
          join_extents(t.local_extents), "; data is missing"));
    }
  }
  return tasks;
}

}  // namespace detail

}  // namespace zest::io
