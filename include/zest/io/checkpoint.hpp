// zest/io/checkpoint.hpp — sharded checkpoints of named tensors that load onto another mesh.
//
//   std::vector<zest::io::tensor_record> recs{zest::io::record("wte", wte),
//                                             zest::io::record("adam.m.wte", m_wte)};
//   zest::io::checkpoint_info info;
//   info.step = 100;
//   info.metadata = config;                         // any JSON: config, ZeRO stage, rng...
//   zest::io::save_checkpoint("ckpt", mesh, recs, info);
//   ...                                                   // later, any mesh, any layouts:
//   zest::io::checkpoint_info info = zest::io::read_checkpoint_info("ckpt");  // no MPI
//   zest::io::load_checkpoint("ckpt", other_mesh, other_recs);
//
//   auto pending = zest::io::save_checkpoint_async("ckpt", mesh, recs, info);  // returns at
//   ...                           // once: the shards written on a thread, the tensors unchanged
//   pending.wait();               // until written(); collective: commits (see pending_save)
//
// A checkpoint is a folder:
//
//   manifest.json                                  written last, by rank 0: what is where
//   step-00000100.gen-3f9a0c2d5e4b1a07.rank-0000.bin   one shard file per rank that holds
//   step-00000100.gen-3f9a0c2d5e4b1a07.rank-0001.bin   data: its blocks back to back, raw
//                                                  elements in the host's byte order
//
// Every rank writes the block it holds of each tensor, except that of the ranks holding
// the same block (replicas along the axes where the layout is replicate) only coordinate
// 0 writes it. The manifest lists, per tensor, its dims, dtype, global extents and the
// layout it was saved with (for information), and its blocks as boxes in global index
// space: { file, offset in the file, box_offsets, box_extents, bytes, checksum (XXH64,
// zest/io/checksum.hpp) }, plus each shard file's size, and last "manifest_checksum": the
// XXH64 of the manifest's canonical text (compact json::dump of everything else), so that
// a changed digit anywhere (step, world_size, a scale in the metadata) is refused. Loading
// does not care about the saving mesh or layout: each rank reads the parts of the saved
// boxes that overlap its own block, whatever layout and mesh it loads with.
//
// Safety: every save is atomic, the same step again included, whatever fails on any rank
// at any point (a crash, an I/O error, a full disk): afterwards the folder holds the old
// checkpoint or the new one, never neither and never a mix.
// - Each save is a new generation: rank 0 draws a random 64-bit id that every rank puts in
//   its shard's name, so a save never writes a file that an earlier manifest names;
// - every file is written to a temporary name, flushed (fsync), renamed and its folder
//   flushed (zest/core/files.hpp). Rank 0 writes the manifest only after every rank has
//   reported its shard durable, and the manifest's rename is the one commit point: before
//   it the old manifest names the old files, which are intact; after it the new one names
//   the new files, which are on disk;
// - only after its commit (the rename and the folder's flush) does rank 0 remove what the
//   new manifest does not name: the older generations, and the leftovers of saves that
//   failed, never the files of a save still in progress (an asynchronous one's);
// - a failure on any rank is thrown on every rank (checkpoint_error with the failing
//   rank's message, or shape_error for a misuse), never a hang. A failure after the rename
//   (the folder's flush) throws although the new checkpoint is in place;
// - loading checks the manifest's own checksum, the manifest against the model (names,
//   dims, dtypes, extents), the size of every shard file it reads (truncation) and the
//   checksum of every block it reads (the whole block), into temporary buffers; the ranks
//   agree before any target tensor is written, so a failure anywhere leaves every target
//   as it was. load_checkpoint's `accept` lets the caller refuse the checkpoint from its
//   manifest (a metadata check), before any data is read;
// - save and load are collective over mesh.world(). Every rank takes part in every
//   collective whatever happened locally.
// One save at a time per folder: two jobs saving into the same folder at once are not
// supported (each would remove the other's files).
//
// The folder must be visible to every rank (a shared file system across nodes). Records
// are views: the tensors must outlive the call and keep their storage. A tensor of another
// backend (device memory) is staged: its record views a host copy made when the record is,
// and a load copies the block back into the tensor once every rank has read its part.
//
// The parts, one per header: records (zest/io/tensor_record.hpp), the manifest and its
// reader (zest/io/manifest.hpp), and in zest/io/detail/ the folder's files
// (checkpoint_files.hpp), the agreement of the ranks on every outcome (rank_agreement.hpp)
// and the reads a load plans (block_reads.hpp); this header holds save and load.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zest/backend/host/host_backend.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/json.hpp"
#include "zest/core/source_site.hpp"
#include "zest/io/detail/block_reads.hpp"
#include "zest/io/detail/checkpoint_files.hpp"
#include "zest/io/detail/rank_agreement.hpp"
#include "zest/io/manifest.hpp"
#include "zest/io/tensor_record.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::io {

namespace detail {

// One save from its first agreement to its commit, on this rank: what the writer of the
// shard (this thread or a background one) and the commit share.
struct save_state {
  struct written {
    std::size_t tensor;
    std::uint64_t offset, bytes, checksum;
  };
  std::filesystem::path dir, shard;
  std::int64_t step = 0;
  std::uint64_t generation = 0;
  std::vector<tensor_record> tensors;  // views of the blocks, read by write_shard only
  std::vector<written> blocks;         // this rank's, in file order
  bool shard_in_place = false;
  outcome wrote;
  std::thread writer;
  // The rest, in three parts: the shards agreed and listed (collective), rank 0's manifest
  // and cleanup (files only: here or on `committer`), the commit agreed (collective).
  std::function<void()> gather, write_manifest, agree_commit;
  std::thread committer;
  outcome manifest;
  bool manifest_in_place = false;
  enum class phase : std::uint8_t { shards, manifest, done } at = phase::shards;
  bool registered = false;  // rank 0: in saves_in_flight until done or given up
  bool committing = false;  // in saves_in_flight's committing folders

  save_state() = default;
  save_state(const save_state&) = delete;
  save_state& operator=(const save_state&) = delete;
  ~save_state() {
    join_all();
    unregister();
  }

  // Step 2: this rank's shard file, a name no manifest uses: its blocks back to back, each
  // checksummed as it is written, durable before the commit hears of it. No communication,
  // so that it can run beside the training on a thread of its own.
  void write_shard() {
    wrote = attempt("save_checkpoint", [&] {
      if (blocks.empty()) return;
      atomic_file_writer out(shard, "save_checkpoint");
      for (auto& b : blocks) {
        const std::span<const std::byte> data = tensors[b.tensor].bytes;
        xxh64_state hash;
        for (std::size_t at = 0; at < data.size(); at += write_chunk_bytes) {
          const auto piece = data.subspan(at, std::min(write_chunk_bytes, data.size() - at));
          hash.update(piece);
          out.write(piece);
        }
        b.checksum = hash.digest();
      }
      try {
        out.commit();
      } catch (...) {
        shard_in_place = out.renamed();
        throw;
      }
      shard_in_place = true;
    });
  }
  void join() {
    if (writer.joinable()) writer.join();
  }
  void join_all() {
    join();
    if (committer.joinable()) committer.join();
  }
  void unregister() {
    if (registered) saves_in_flight::instance().remove(generation);
    registered = false;
    if (committing) saves_in_flight::instance().end_commit(dir);
    committing = false;
  }
  // Collective: the shards agreed, rank 0's manifest written (on a thread when `background`,
  // or here if no thread can be started). Another save into the folder whose commit has
  // started and not been waited for is refused, on every rank alike (each keeps the list).
  void start_commit(bool background) {
    join();
    at = phase::done;  // unless what follows succeeds
    if (!saves_in_flight::instance().begin_commit(dir)) {
      unregister();
      throw shape_error(zest::detail::message(
          "zest: save_checkpoint: another save into ", dir,
          " has started its commit (pending_save::start_commit) and not been waited for: "
          "two commits would race for its manifest; call wait() on that save first"));
    }
    committing = true;
    try {
      gather();
    } catch (...) {
      unregister();
      throw;
    }
    at = phase::manifest;
    if (background) {
      try {
        committer = std::thread([this] { write_manifest(); });
        return;
      } catch (const std::system_error&) {
        // No thread: the manifest here.
      }
    }
    write_manifest();
  }
  // Collective: the commit agreed (its failure thrown on every rank).
  void finish() {
    join_all();
    at = phase::done;
    try {
      agree_commit();
    } catch (...) {
      unregister();
      throw;
    }
    unregister();
  }
};

}  // namespace detail

// A save whose shards are being written (save_checkpoint_async). The records' memory must
// stay as it was until written() returns on this rank; wait() commits the save.
class [[nodiscard]] pending_save {
 public:
  pending_save() = default;
  explicit pending_save(std::shared_ptr<detail::save_state> state) : state_(std::move(state)) {}
  pending_save(pending_save&&) noexcept = default;
  pending_save& operator=(pending_save&& other) noexcept {
    if (this != &other) {
      abandon();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  pending_save(const pending_save&) = delete;
  pending_save& operator=(const pending_save&) = delete;
  // A save given up before start_commit() is not committed: the folder keeps the checkpoint
  // it had (the new shard, named by no manifest, goes with a later save's cleanup). After
  // start_commit(), rank 0 may have committed it already; only the agreement is given up.
  ~pending_save() { abandon(); }

  // Started and not yet committed (or failed).
  bool pending() const { return state_ && state_->at != detail::save_state::phase::done; }
  // This rank's shard is on disk (not collective): the records' memory may change now.
  void written() const {
    if (state_) state_->join();
  }
  // A function that blocks as written() does, for a caller that must not change the
  // records' memory before it (zero_engine::hold_states).
  std::function<void()> written_fence() const {
    return [state = state_] {
      if (state) state->join();
    };
  }
  // Collective over the saving mesh's world: waits for every rank's shard and commits, as
  // save_checkpoint does after writing; throws what save_checkpoint throws, on every rank.
  // Nothing to do when nothing is pending.
  void wait(source_site at = source_site::current()) {
    if (!pending()) return;
    const user_call user(at);
    if (state_->at == detail::save_state::phase::shards) state_->start_commit(false);
    state_->finish();
  }
  // Collective, for a caller that saves again soon: the shards agreed (what wait() throws for
  // a shard that failed, it throws here), and rank 0's manifest written and the old files
  // removed on a thread; wait() then only agrees on the commit. Until then the folder holds
  // the previous checkpoint or this one. Nothing to do unless the shards are pending.
  void start_commit(source_site at = source_site::current()) {
    if (!pending() || state_->at != detail::save_state::phase::shards) return;
    const user_call user(at);
    state_->start_commit(true);
  }

 private:
  void abandon() noexcept {
    if (!state_) return;
    state_->join_all();
    state_->unregister();
  }
  std::shared_ptr<detail::save_state> state_;
};

// Collective over mesh.world(): save_checkpoint, with this rank's shard written on a
// background thread; returns once the ranks agreed on the records and drew the save's
// generation. The records' memory must stay unchanged until the result's written() (a
// training loop keeps the optimizer from updating the states: zero_engine::hold_states),
// and `mesh` must outlive the result. The result's start_commit() and wait() (collective)
// commit it: until then the folder holds the previous checkpoint. Another save into the
// folder may start meanwhile, but its commit may start only once this one was waited for
// (else it throws shape_error, on every rank). No MPI call is made off the calling thread,
// so MPI_THREAD_FUNNELED suffices. Throws what save_checkpoint throws, from here (the
// records, the folder) or from start_commit()/wait() (the files, the commit).
template <class Mesh>
[[nodiscard]] pending_save save_checkpoint_async(const std::filesystem::path& dir, const Mesh& mesh,
                                                 std::span<const tensor_record> tensors,
                                                 const checkpoint_info& info,
                                                 source_site at = source_site::current(),
                                                 bool background = true) {
  const user_call user(at);
  namespace d = detail;
  constexpr std::string_view op = "save_checkpoint";
  auto& world = mesh.world();
  const int rank = world.rank();

  // 1. The records are sound and the same on every rank; rank 0 makes the folder and draws
  // this save's generation, which every rank gets.
  std::array<std::int64_t, 1> generation_word{0};
  bool added = false;  // rank 0: the generation in saves_in_flight
  try {
    d::agree(world, d::attempt(op, [&] {
               if (info.step < 0) {
                 throw shape_error(
                     zest::detail::message("zest: ", op, ": step ", info.step, " is negative"));
               }
               d::check_records(op, tensors, false);
               if (rank == 0) {
                 if (const int err = zest::detail::create_folders(dir)) {
                   d::throw_io(op, "cannot create the folder", dir, err);
                 }
                 const std::uint64_t g = d::new_generation();
                 // Known to be in progress before any rank can make a file of it (they learn
                 // it from the broadcast below): a commit's cleanup leaves its files alone.
                 d::saves_in_flight::instance().add(g);
                 added = true;
                 generation_word[0] = std::bit_cast<std::int64_t>(g);
               }
             }));
    d::agree_on_list(world, op, tensors);
  } catch (...) {
    if (added)
      d::saves_in_flight::instance().remove(std::bit_cast<std::uint64_t>(generation_word[0]));
    throw;
  }
  world.template broadcast<std::int64_t>(std::span<std::int64_t>(generation_word), 0);

  auto state = std::make_shared<d::save_state>();
  d::save_state& s = *state;
  s.dir = dir;
  s.step = info.step;
  s.generation = std::bit_cast<std::uint64_t>(generation_word[0]);
  s.shard = dir / d::shard_file_name(info.step, s.generation, rank);
  s.registered = added;
  s.tensors.assign(tensors.begin(), tensors.end());
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].writes || tensors[i].bytes.empty()) continue;
    s.blocks.push_back({i, offset, tensors[i].bytes.size(), 0});
    offset += tensors[i].bytes.size();
  }

  // 3-5, once every shard is written: the commit (the state outlives it: it holds it).
  // 3. Everyone's block list to everyone (rank 0 writes the manifest): per block the
  // tensor's index, file offset, bytes, checksum, then box offsets and extents.
  auto lists = std::make_shared<std::pair<std::vector<std::size_t>, std::vector<std::int64_t>>>();
  s.gather = [&s, &mesh, lists] {
    auto& world = mesh.world();
    const auto n = static_cast<std::size_t>(world.size());
    try {
      d::agree(world, s.wrote);
    } catch (...) {
      // No manifest names this generation: its shards are garbage already (best effort; a
      // later save removes what is left).
      if (s.shard_in_place) (void)zest::detail::remove_file(s.shard);
      throw;
    }
    std::vector<std::int64_t> words;
    for (const auto& b : s.blocks) {
      const tensor_record& t = s.tensors[b.tensor];
      words.push_back(static_cast<std::int64_t>(b.tensor));
      words.push_back(static_cast<std::int64_t>(b.offset));
      words.push_back(static_cast<std::int64_t>(b.bytes));
      words.push_back(std::bit_cast<std::int64_t>(b.checksum));
      for (const std::size_t x : t.local_offsets) words.push_back(static_cast<std::int64_t>(x));
      for (const std::size_t x : t.local_extents) words.push_back(static_cast<std::int64_t>(x));
    }
    const std::array<std::int64_t, 1> mine{static_cast<std::int64_t>(words.size())};
    std::vector<std::int64_t> sizes(n);
    world.template all_gather<std::int64_t>(std::span<const std::int64_t>(mine),
                                            std::span<std::int64_t>(sizes));
    auto& [counts, all] = *lists;
    counts.assign(n, 0);
    std::size_t total = 0;
    for (std::size_t r = 0; r < n; ++r) total += counts[r] = static_cast<std::size_t>(sizes[r]);
    all.assign(total, 0);
    world.template all_gather<std::int64_t>(std::span<const std::int64_t>(words),
                                            std::span<std::int64_t>(all),
                                            std::span<const std::size_t>(counts));
  };

  // 4. Every shard is durable: rank 0 commits, by renaming the new manifest over the old,
  // then (5) removes what the new manifest does not name. Files only: no communication.
  s.write_manifest = [&s, lists, rank, described = mesh.describe(),
                      n = static_cast<std::size_t>(world.size()), metadata = info.metadata] {
    constexpr std::string_view op = "save_checkpoint";
    std::set<std::string> named;
    s.manifest = d::attempt(op, [&] {
      if (rank != 0) return;
      const auto& [counts, all] = *lists;
      json::value m;
      m["format"] = checkpoint_format_name;
      m["version"] = checkpoint_format_version;
      m["step"] = s.step;
      m["generation"] = d::generation_text(s.generation);
      m["mesh"] = described;
      m["world_size"] = static_cast<std::int64_t>(n);
      m["byte_order"] = d::native_byte_order();
      m["checksum"] = "xxh64";
      m["metadata"] = metadata;
      std::vector<json::value> per_tensor(s.tensors.size());
      for (std::size_t i = 0; i < s.tensors.size(); ++i) {
        const tensor_record& t = s.tensors[i];
        json::value& v = per_tensor[i];
        v["name"] = t.name;
        v["dims"] = t.dims;
        v["dtype"] = name_of(t.type);
        v["element_bytes"] = d::element_size(t.type);
        v["extents"] = d::extents_json(t.global_extents);
        v["layout"] = t.layout;
        v["blocks"] = json::array{};
      }
      json::value files = json::array{};
      std::size_t at = 0;
      for (std::size_t r = 0; r < n; ++r) {
        const std::size_t end = at + counts[r];
        const std::string name = d::shard_file_name(s.step, s.generation, static_cast<int>(r));
        std::int64_t file_bytes = 0;
        while (at < end) {
          const auto i = static_cast<std::size_t>(all[at]);
          const std::size_t rank_of = s.tensors[i].dims.size();
          json::value b;
          b["file"] = name;
          b["offset"] = all[at + 1];
          b["bytes"] = all[at + 2];
          b["checksum"] = format_checksum(std::bit_cast<std::uint64_t>(all[at + 3]));
          json::value off = json::array{}, ext = json::array{};
          for (std::size_t k = 0; k < rank_of; ++k) {
            off.push_back(all[at + 4 + k]);
            ext.push_back(all[at + 4 + rank_of + k]);
          }
          b["box_offsets"] = std::move(off);
          b["box_extents"] = std::move(ext);
          per_tensor[i]["blocks"].push_back(std::move(b));
          file_bytes = std::max(file_bytes, all[at + 1] + all[at + 2]);
          at += 4 + 2 * rank_of;
        }
        if (counts[r] == 0) continue;
        json::value f;
        f["file"] = name;
        f["bytes"] = file_bytes;
        files.push_back(std::move(f));
        named.insert(name);
      }
      m["files"] = std::move(files);
      m["tensors"] = json::value(std::move(per_tensor));
      m[std::string(d::manifest_checksum_key)] = format_checksum(d::manifest_checksum(m));
      atomic_file_writer out(s.dir / manifest_file_name, op);
      out.write(json::dump(m, 1) + "\n");
      try {
        out.commit();
      } catch (...) {
        s.manifest_in_place = out.renamed();
        throw;
      }
    });
    // 5. Committed: what the new manifest does not name goes (not the files of saves
    // still in progress).
    if (rank == 0 && s.manifest.kind == d::failure::none) {
      try {
        d::remove_stale_files(s.dir, named);
      } catch (...) {
        // Best effort, as every cleanup: what stays is garbage, never the checkpoint.
      }
    }
  };

  // The commit agreed.
  s.agree_commit = [&s, &mesh] {
    auto& world = mesh.world();
    try {
      d::agree(world, s.manifest);
    } catch (...) {
      // No commit (a full disk, say): this generation's shards are named by no manifest, so
      // each rank removes its own now rather than leave them to a later save. Unless the new
      // manifest did get renamed in place (only flushing the folder failed): then it names
      // them, and the old manifest, which a crash could still bring back, names the old
      // files, so both generations stay. Rank 0 alone knows which; it tells the others (best
      // effort: if that fails too, the shards stay, as before).
      try {
        std::array<std::int64_t, 1> kept{s.manifest_in_place ? 1 : 0};
        world.template broadcast<std::int64_t>(std::span<std::int64_t>(kept), 0);
        if (kept[0] == 0 && s.shard_in_place) (void)zest::detail::remove_file(s.shard);
      } catch (...) {
      }
      throw;
    }
  };

  // 2. The shard, here or beside the caller.
  if (background) {
    try {
      s.writer = std::thread([&s] { s.write_shard(); });
    } catch (const std::system_error&) {
      s.write_shard();  // no thread: the shard here
    }
  } else {
    s.write_shard();
  }
  return pending_save(std::move(state));
}

// Collective over mesh.world(): saves the tensors as the checkpoint of `info.step` in `dir`
// (created if missing), atomically (see the top of this header). info.mesh and
// info.world_size are ignored: they come from `mesh`. Throws shape_error for bad records (a
// repeated name, ranks passing different lists) and checkpoint_error for I/O failures, on
// every rank.
template <class Mesh>
void save_checkpoint(const std::filesystem::path& dir, const Mesh& mesh,
                     std::span<const tensor_record> tensors, const checkpoint_info& info,
                     source_site at = source_site::current()) {
  save_checkpoint_async(dir, mesh, tensors, info, at, false).wait(at);
}

// The step, metadata and saving mesh of the checkpoint in `dir` (reads the manifest only;
// not collective). Throws checkpoint_error when there is none or it is unreadable.
inline checkpoint_info read_checkpoint_info(const std::filesystem::path& dir) {
  constexpr std::string_view op = "read_checkpoint_info";
  const std::string text = detail::read_manifest_text(op, dir);
  return detail::manifest_reader(std::string(op), (dir / manifest_file_name).string())
      .read(text)
      .info;
}

// Collective over mesh.world(): fills the targets from the checkpoint in `dir`, whatever
// mesh and layouts it was saved with. The checkpoint must hold exactly the targets' names,
// with the same dims, dtypes and global extents. `accept`, when given, sees the manifest's
// step, metadata and mesh on every rank before any data is read, and refuses the checkpoint
// by throwing (checkpoint_error, or shape_error). On any failure, on any rank, every rank
// throws (checkpoint_error; shape_error for bad records) and no target is modified.
// Returns the checkpoint's step, metadata and saving mesh.
template <class Mesh>
checkpoint_info load_checkpoint(const std::filesystem::path& dir, const Mesh& mesh,
                                std::span<const tensor_record> tensors,
                                const std::function<void(const checkpoint_info&)>& accept = {},
                                source_site at = source_site::current()) {
  const user_call user(at);
  namespace d = detail;
  constexpr std::string_view op = "load_checkpoint";
  auto& world = mesh.world();
  const int rank = world.rank();

  // 1. The records are sound and the same on every rank; rank 0 reads the manifest.
  std::string text;
  d::agree(world, d::attempt(op, [&] {
             d::check_records(op, tensors, true);
             if (rank == 0) text = d::read_manifest_text(op, dir);
           }));
  d::agree_on_list(world, op, tensors);

  // 2. Every rank parses the same text (broadcast from rank 0) and matches the targets.
  std::array<std::int64_t, 1> length{static_cast<std::int64_t>(text.size())};
  world.template broadcast<std::int64_t>(std::span<std::int64_t>(length), 0);
  text.resize(static_cast<std::size_t>(length[0]));
  world.template broadcast<std::uint8_t>(
      std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(text.data()), text.size()), 0);
  d::manifest m;
  std::vector<const d::saved_tensor*> sources;
  std::vector<d::read_task> tasks;
  d::agree(
      world, d::attempt(op, [&] {
        m = d::manifest_reader(std::string(op), (dir / manifest_file_name).string()).read(text);
        // The caller's checks of the metadata first: they say why a model differs (its
        // config) where the tensors would only say that it does.
        if (accept) accept(m.info);
        sources = d::match_targets(op, dir, m, tensors);
        tasks = d::plan_reads(op, tensors, sources);
      }));

  // 3. Read, verify and stage this rank's parts, file by file in file order.
  std::vector<std::unique_ptr<std::byte[]>> staging(tensors.size());
  d::agree(
      world, d::attempt(op, [&] {
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          staging[i] = std::make_unique_for_overwrite<std::byte[]>(tensors[i].bytes.size());
        }
        std::sort(tasks.begin(), tasks.end(), [](const d::read_task& a, const d::read_task& b) {
          return std::tie(a.block->file, a.block->offset) <
                 std::tie(b.block->file, b.block->offset);
        });
        std::vector<std::byte> chunk(std::max<std::size_t>(d::read_chunk_bytes(), 1));
        for (std::size_t i = 0; i < tasks.size();) {
          const std::string& name = tasks[i].block->file;
          const std::filesystem::path path = dir / name;
          const d::input_file in(path, op);
          const std::uint64_t expected = m.file_sizes.at(name);
          if (const std::uint64_t size = in.size(); size != expected) {
            throw checkpoint_error(zest::detail::message(
                "zest: ", op, ": ", path, " has ", size, " bytes, the manifest says ", expected,
                size < expected ? " (the file is truncated)" : " (the file was changed)"));
          }
          for (; i < tasks.size() && tasks[i].block->file == name; ++i) {
            const std::size_t t = tasks[i].target;
            d::read_block(in, tasks[i], tensors[t],
                          std::span<std::byte>(staging[t].get(), tensors[t].bytes.size()), chunk,
                          op, path);
          }
        }
      }));

  // 4. Every rank succeeded: only now do the targets change.
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].bytes.empty()) {
      std::memcpy(tensors[i].bytes.data(), staging[i].get(), tensors[i].bytes.size());
    }
    if (tensors[i].write_back) tensors[i].write_back();
  }
  return m.info;
}

}  // namespace zest::io
