// zest/comm/nccl_communicator.hpp — collectives over NCCL, on device memory.
//
//   zest::mpi_environment mpi(&argc, &argv);
//   zest::nccl_communicator dp(MPI_COMM_WORLD, "dp");   // one GPU per rank, id sent over MPI
//   dp.all_gather(std::span<const float>(shard), std::span<float>(full));   // device pointers
//   zest::request r = dp.iall_reduce(std::span<float>(grad)); ...; r.wait();
//
// The same concept, signatures, size checks and byte counters as mpi_communicator
// (zest/comm/communicator.hpp's ring model), so zest::basic_mesh<nccl_communicator, ...> (see
// zest/mesh/cuda_mesh.hpp) runs every layout transition on GPUs; `backend_type` tells
// tensors on such a mesh to keep their shards in device memory (cuda_backend).
//
// Streams. Each communicator has its own stream. A call starts after the work queued so far
// on cuda::compute_stream() (an event), and:
//   blocking      the compute stream waits for the collective (an event), and the call
//                 returns: later kernels and copies see the result, without a host stall
//                 (outside checked mode; the watchdog then runs in the host's waits);
//   non-blocking  nothing waits until request::wait(), which makes the compute stream wait
//                 (test() says whether the collective is done), so compute queued in the
//                 meantime overlaps with it. Buffers must stay alive until then, as with MPI.
// Uneven counts: all_gather is one ncclBroadcast per rank and reduce_scatter one ncclReduce
// per rank, fused in a group; all_to_all is grouped ncclSend/ncclRecv (own block: a copy).
// Host memory (a loss, a norm on the world communicator) goes through MPI instead.
//
// The watchdog (zest/comm/checked.hpp: ZEST_WATCHDOG_MS, default 300 s, 0: none), in every
// mode. A blocking call only makes the compute stream wait, so outside checked mode no host
// thread waits for the collective itself; a rank whose peer skipped it would hang later, in
// whatever host wait comes next (reading a loss, a synchronize). So each communicator keeps
// the collectives it queued and has not yet seen complete (their done events, kind, call
// number, count; zest/comm/detail/pending_collectives.hpp), and while any communicator is
// alive every host wait zest makes (cuda::wait_for in zest/backend/cuda/device_memory.hpp:
// copies to and from the host, synchronize, the pool's release) polls instead of blocking
// and asks, about every millisecond, whether some communicator's oldest pending collective
// is past the watchdog (its clock starts when it is queued, or when the one before it was
// seen complete). If so, that communicator is aborted (ncclCommAbort: its kernels stop and
// the wait returns) and the wait throws collective_timeout naming the op, element type and
// count, the call number, this rank of the axis's size and the axis's world ranks; outside
// checked mode it cannot say what the other ranks called (ZEST_CHECKED=1 does). An
// asynchronous NCCL error seen there throws communicator_error the same way. Later calls on
// an aborted communicator throw communicator_error; abort() does the same by hand (a rank
// that gives up: NCCL may need every rank of a communicator to abort before one returns).
// Queueing costs a list entry per call (no host stall); a host wait with nothing pending, or
// with ZEST_WATCHDOG_MS=0, is the plain blocking call. A communicator's destructor waits
// for its stream under the deadline too, and aborts NCCL instead of destroying it past it.
// Out of reach: waits inside NCCL on the host (NCCL may connect the ranks at a
// communicator's first collective of a kind, and a rank whose peer skipped that call waits
// there; NCCL_RUNTIME_CONNECT=0 connects at init), and two communicators stuck at once
// (aborting one frees device memory, which waits for the other's kernels).
//
// Checked mode (checked_mode().enabled or set_checked): before each call the ranks exchange
// the same kind of fingerprint as mpi_communicator's (kind, element type, op or root, axis,
// call number, counts) through an mpi_communicator on the same ranks, itself checked, so a
// rank that skips a call gives collective_timeout and ranks that disagree all throw
// collective_mismatch naming each rank's call and where it was made (the user's line, as
// mpi_communicator's messages: zest::user_call), instead of hanging in NCCL. The data transfer
// is then waited for on the host under the same watchdog; on timeout the NCCL communicator
// is aborted and every later call throws communicator_error.
//
// The schedule check (always on, as mpi_communicator's): every call on device memory enters a
// running record (zest/comm/detail/schedule_log.hpp); check_schedule compares it across the
// ranks through the MPI communicator on the same ranks, and zest::check_schedule(mesh) calls
// it for every communicator of a mesh.
//
// Devices: the first communicator binds the process to GPU (local rank on its node) modulo
// the device count (cuda::bind_device), before any NCCL call. The node-local rank comes from
// the launcher's environment (MPICH, Open MPI, Slurm) or, failing that, from
// MPI_Comm_split_type over MPI_COMM_WORLD (collective then).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/backend/cuda/device_memory.hpp"
#include "zest/comm/checked.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/comm/detail/pending_collectives.hpp"
#include "zest/config.hpp"
#include "zest/core/backoff.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"

#include <mpi.h>

#include "zest/comm/detail/schedule_log.hpp"
#include "zest/comm/detail/schedule_registry.hpp"
#include "zest/comm/mpi_communicator.hpp"
#include "zest/core/source_site.hpp"

namespace zest {

struct cuda_backend;

namespace cuda {

namespace detail {
inline int& bound_device() {
  static int device = -1;
  return device;
}
// The node-local rank as launchers export it, or -1.
inline int local_rank_from_environment() {
  for (const char* name :
       {"MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return -1;
}
}  // namespace detail

// Binds this process (its current thread) to one GPU: node-local rank modulo the device
// count. The first call decides; later ones set the same device again and return it.
inline int bind_device() {
  int& device = detail::bound_device();
  if (device >= 0) {
    ZEST_CUDA_CHECK(cudaSetDevice(device));
    return device;
  }
  const device_census seen = visible_devices();
  const int count = seen.count;
  if (count == 0) {
    throw cuda_error(zest::detail::message("zest: cuda::bind_device: no CUDA device is visible (",
                                           seen.why_none,
                                           "); the GPU backend needs one GPU per rank"));
  }
  int local = detail::local_rank_from_environment();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (local < 0 && initialized != 0) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
  }
  if (local < 0) local = current_device();
  device = local % count;
  ZEST_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

}  // namespace cuda

namespace detail {

inline void nccl_check(ncclResult_t code, std::string_view call, std::string_view axis,
                       std::size_t rank, std::size_t size, ncclComm_t comm = nullptr) {
  if (code == ncclSuccess) return;
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  throw communicator_error(message("zest: ", call, " on axis '", axis, "' (rank ", rank, " of ",
                                   size, "): NCCL error: ", ncclGetErrorString(code),
                                   (last != nullptr && *last != 0) ? "; " : "",
                                   last != nullptr ? last : ""));
}

// How a zest element type travels in NCCL. uint16 has no NCCL type: it moves as byte pairs
// (reductions on it are rejected).
struct nccl_type {
  ncclDataType_t type;
  std::size_t scale;  // NCCL elements per zest element
  bool reducible;
};
template <class T>
constexpr nccl_type nccl_type_of() {
  constexpr dtype t = dtype_of<T>();  // static_asserts on unsupported types
  if constexpr (t == dtype::f32) return {ncclFloat32, 1, true};
  else if constexpr (t == dtype::f64) return {ncclFloat64, 1, true};
  else if constexpr (t == dtype::bf16) return {ncclBfloat16, 1, true};
  else if constexpr (t == dtype::f16) return {ncclHalf, 1, true};
  else if constexpr (t == dtype::i32) return {ncclInt32, 1, true};
  else if constexpr (t == dtype::i64) return {ncclInt64, 1, true};
  else if constexpr (t == dtype::u8) return {ncclUint8, 1, true};
  else return {ncclUint8, 2, false};
}

inline ncclRedOp_t nccl_op_of(reduce_op op) {
  switch (op) {
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    default: return ncclSum;
  }
}

// One rank's call after validation: what NCCL needs, the byte count, and the fingerprint parts.
struct nccl_call {
  collective kind = collective::all_gather;
  bool barrier = false;
  dtype type = dtype::f32;
  nccl_type wire{ncclFloat32, 1, true};
  std::size_t element_bytes = 0;
  reduce_op reduction = reduce_op::sum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t send_n = 0, recv_n = 0;
  bool even = true;
  std::vector<std::size_t> counts;                    // all_gather / reduce_scatter chunks
  std::vector<std::size_t> send_counts, recv_counts;  // all_to_all blocks
  std::uint64_t elements = 0;                         // shown in messages
  std::uint64_t bytes = 0;                            // sent by this rank, ring model
  std::string invalid;                                // why the buffers do not fit
  std::uint64_t counts_key = 0;
  std::vector<std::uint64_t> counts_shown;
  std::uint64_t pairs_sent = 0, pairs_received = 0;
  std::vector<std::uint64_t> send_row, recv_row;
  source_site where;  // the user's line (user_call), else the caller's
};

inline void nccl_reject(nccl_call& c, std::string why) {
  if (c.invalid.empty()) c.invalid = std::move(why);
}
inline std::uint64_t nccl_sum(std::span<const std::size_t> counts) {
  std::uint64_t s = 0;
  for (const auto c : counts) s += c;
  return s;
}
inline bool nccl_all_equal(std::span<const std::size_t> counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}
inline std::uint64_t nccl_hash_counts(std::span<const std::size_t> counts) {
  std::uint64_t h = mix(counts.size());
  for (const auto c : counts) h = hash_combine(h, c);
  return h;
}

// all_gather and reduce_scatter share their counts rules: `mine` is this rank's chunk
// (the send buffer of all_gather, the recv buffer of reduce_scatter), `whole` the other.
inline void nccl_prepare_chunks(nccl_call& c, std::size_t n, std::size_t rank, std::size_t mine,
                                std::size_t whole, std::span<const std::size_t> counts,
                                std::string_view mine_name, std::string_view whole_name) {
  if (counts.empty()) {
    if (whole != n * mine) {
      nccl_reject(c, message(whole_name, " buffer has ", whole, " elements, expected ", n * mine,
                             " = ", n, " ranks x ", mine, " (the ", mine_name, " buffer's size)"));
    }
    c.counts.assign(n, mine);
  } else if (counts.size() != n) {
    nccl_reject(c,
                message("counts has ", counts.size(), " entries, expected one per rank (", n, ")"));
    c.counts.assign(n, 0);
    return;
  } else {
    c.counts.assign(counts.begin(), counts.end());
    const std::uint64_t total = nccl_sum(counts);
    if (counts[rank] != mine) {
      nccl_reject(c, message(mine_name, " buffer has ", mine, " elements, but counts[", rank,
                             "] = ", counts[rank]));
    }
    if (total != whole) {
      nccl_reject(c, message(whole_name, " buffer has ", whole, " elements, but the counts sum to ",
                             total));
    }
  }
  c.even = nccl_all_equal(c.counts);
  c.counts_key = nccl_hash_counts(c.counts);
  if (!c.even) c.counts_shown.assign(c.counts.begin(), c.counts.end());
}

inline bool nccl_all_to_all_side(nccl_call& c, std::size_t n, std::span<const std::size_t> given,
                                 std::size_t buffer_n, std::string_view side,
                                 std::vector<std::size_t>& effective) {
  if (given.empty()) {
    if (buffer_n % n != 0) {
      nccl_reject(c, message(side, " buffer has ", buffer_n, " elements, not divisible into ", n,
                             " equal blocks (pass ", side, "_counts)"));
      return false;
    }
    effective.assign(n, buffer_n / n);
  } else if (given.size() != n) {
    nccl_reject(c, message(side, "_counts has ", given.size(), " entries, expected one per rank (",
                           n, ")"));
    return false;
  } else {
    effective.assign(given.begin(), given.end());
  }
  const std::uint64_t total = nccl_sum(effective);
  if (total != buffer_n) {
    nccl_reject(c, message(side, " buffer has ", buffer_n, " elements, but ", side,
                           "_counts sum to ", total));
    return false;
  }
  return true;
}

inline void nccl_prepare_all_to_all(nccl_call& c, std::size_t n, std::size_t rank,
                                    std::span<const std::size_t> sc,
                                    std::span<const std::size_t> rc) {
  c.elements = c.send_n;
  const bool sends_ok = nccl_all_to_all_side(c, n, sc, c.send_n, "send", c.send_counts);
  const bool receives_ok = nccl_all_to_all_side(c, n, rc, c.recv_n, "recv", c.recv_counts);
  if (sc.empty() && rc.empty() && sends_ok && c.recv_n != c.send_n) {
    nccl_reject(c, message("recv buffer has ", c.recv_n, " elements, expected ", c.send_n, " = ", n,
                           " blocks of ", c.send_n / n));
  }
  if (sends_ok && receives_ok && rank < c.send_counts.size() && rank < c.recv_counts.size() &&
      c.send_counts[rank] != c.recv_counts[rank]) {
    // This rank's own block is a local copy: its two counts must agree (MPI would truncate).
    nccl_reject(c, message("this rank sends itself ", c.send_counts[rank],
                           " elements but expects to receive ", c.recv_counts[rank]));
  }
  c.counts_key = (sc.empty() && rc.empty()) ? 0 : 1;
  if (sends_ok) {
    for (std::size_t j = 0; j < n; ++j) {
      if (j != rank) c.bytes += c.send_counts[j] * c.element_bytes;
    }
    if (!sc.empty()) c.counts_shown.assign(c.send_counts.begin(), c.send_counts.end());
  }
  if (sends_ok && receives_ok) {
    for (std::size_t k = 0; k < n; ++k) c.pairs_sent += count_pair(rank, k, c.send_counts[k]);
    for (std::size_t j = 0; j < n; ++j) c.pairs_received += count_pair(j, rank, c.recv_counts[j]);
    c.send_row.assign(c.send_counts.begin(), c.send_counts.end());
    c.recv_row.assign(c.recv_counts.begin(), c.recv_counts.end());
  } else {
    c.send_counts.assign(n, 0);
    c.recv_counts.assign(n, 0);
  }
}

// Fingerprint words (the layout of mpi_communicator's, with its own version tag).
namespace nfp {
inline constexpr std::size_t version = 0, kind = 1, type = 2, op_or_root = 3, axis = 4, number = 5,
                             elements = 6, counts = 7, invalid = 8, pairs_sent = 9,
                             pairs_received = 10, counts_size = 11, first_count = 12, site = 16,
                             words = 32;
inline constexpr std::size_t shown_counts = site - first_count;
// "at file:line in <context>", cut and zero-terminated: named in a mismatch's message.
inline constexpr std::size_t site_chars = (words - site) * sizeof(std::uint64_t);
inline constexpr std::uint64_t current_version = 0x7a6573746e02ULL;  // "zestn" 2
inline constexpr std::uint64_t barrier_kind = collective_kinds;
}  // namespace nfp

using nccl_clock = std::chrono::steady_clock;

// State shared by a communicator and its requests.
class nccl_core {
 public:
  nccl_core(MPI_Comm comm, std::string axis)
      : name_(std::move(axis)), name_hash_(hash_name(name_)) {
    mpi_ = std::make_unique<mpi_communicator>(comm, name_);
    mpi_->set_checked(true);  // its watchdog guards our fingerprint exchanges
    size_ = static_cast<std::size_t>(mpi_->size());
    rank_ = static_cast<std::size_t>(mpi_->rank());
    device_ = cuda::bind_device();
    // Rank 0 makes the id; a failure there is broadcast too, so that no rank waits in init.
    struct bootstrap {
      int ok = 0;
      ncclUniqueId id{};
    } boot;
    if (rank_ == 0) boot.ok = ncclGetUniqueId(&boot.id) == ncclSuccess ? 1 : 0;
    MPI_Bcast(&boot, static_cast<int>(sizeof boot), MPI_BYTE, 0, mpi_->native());
    if (boot.ok == 0) {
      throw communicator_error(
          message("zest: nccl_communicator '", name_, "': ncclGetUniqueId failed on rank 0"));
    }
    nccl_check(ncclCommInitRank(&comm_, static_cast<int>(size_), boot.id, static_cast<int>(rank_)),
               "ncclCommInitRank", name_, rank_, size_);
    stream_.emplace(cudaStreamNonBlocking);
    // The world ranks of this communicator's ranks, for timeout messages.
    world_ranks_.resize(size_);
    std::vector<int> mine(size_);
    std::iota(mine.begin(), mine.end(), 0);
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(mpi_->native(), &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(group, static_cast<int>(size_), mine.data(), world,
                              world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    watch(true);
    // For the end of the run's check (zest/comm/mpi_environment.hpp), as mpi_core does.
    registered_ = schedule_registry::instance().add(name_, world_ranks_, static_cast<int>(rank_),
                                                    &schedule_, &broken_);
  }

  // One rank, no MPI needed (MPI_Init neither).
  explicit nccl_core(std::string axis) : name_(std::move(axis)), name_hash_(hash_name(name_)) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    device_ = initialized != 0 ? cuda::bind_device() : cuda::current_device();
    nccl_check(ncclCommInitAll(&comm_, 1, &device_), "ncclCommInitAll", name_, 0, 1);
    stream_.emplace(cudaStreamNonBlocking);
    int world_rank = 0;
    if (initialized != 0) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    world_ranks_.assign(1, world_rank);
    watch(true);
  }

  nccl_core(const nccl_core&) = delete;
  nccl_core& operator=(const nccl_core&) = delete;

  // Waits for this communicator's stream, under the watchdog (a peer that never joins a
  // queued collective would make the wait endless): past it, NCCL is aborted, not destroyed.
  ~nccl_core() {
    if (registered_) schedule_registry::instance().close(*registered_);
    watch(false);
    if (comm_ == nullptr) return;
    if (broken_.empty() && drained()) {
      static_cast<void>(ncclCommDestroy(comm_));
    } else {
      static_cast<void>(ncclCommAbort(comm_));
    }
  }

  const std::string& name() const { return name_; }
  int size() const { return static_cast<int>(size_); }
  int rank() const { return static_cast<int>(rank_); }
  int device() const { return device_; }
  ncclComm_t native() const { return comm_; }
  cudaStream_t stream() const { return stream_->get(); }
  const comm_stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  std::optional<bool> checked_override() const { return checked_override_; }
  void set_checked(std::optional<bool> on) { checked_override_ = on; }
  bool checked() const { return checked_override_.value_or(checked_mode().enabled); }
  // The MPI communicator on the same ranks (checks, host memory); null for one rank without MPI.
  mpi_communicator* mpi() const { return mpi_.get(); }

  // A call on device memory: check (in checked mode), count, enqueue. Returns the event
  // recorded after the collective on this communicator's stream.
  std::shared_ptr<cuda::event> start(const nccl_call& c) {
    ensure_usable(c);
    if (checked() && size_ > 1) {
      exchange_and_compare(c);
    } else {
      ++next_number_;
      if (!c.invalid.empty()) throw_invalid(c);
    }
    record(c, next_number_ - 1);
    ZEST_CUDA_CHECK(cudaSetDevice(device_));
    cuda::event ready;
    ready.record(cuda::compute_stream());
    ready.wait_on(stream_->get());
    enqueue(c);
    auto done = std::make_shared<cuda::event>();
    done->record(stream_->get());
    count(c);
    track(c, done);
    return done;
  }

  // Makes the compute stream wait for `done`; in checked mode first waits on the host under
  // the watchdog. Returns false when !block and the collective is still running.
  bool finish(const nccl_call& c, const cuda::event& done, bool block, std::uint64_t number) {
    if (comm_ == nullptr) ensure_usable(c);  // aborted after a timeout: throws
    if (checked() || !block) {
      const auto started = nccl_clock::now();
      const auto deadline = started + checked_mode().watchdog;
      ::zest::detail::backoff pause;
      for (; !done.ready(); pause()) {
        ncclResult_t async = ncclSuccess;
        nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", name_, rank_,
                   size_, comm_);
        if (async != ncclSuccess && async != ncclInProgress) {
          broken_ = message("NCCL reported an asynchronous error: ", ncclGetErrorString(async));
          nccl_check(async, nccl_name(c), name_, rank_, size_, comm_);
        }
        if (!block) return false;
        // ZEST_WATCHDOG_MS=0: no deadline (zest/comm/checked.hpp).
        if (checked() && checked_mode().watchdog.count() > 0 && nccl_clock::now() >= deadline) {
          broken_ = message("the data transfer of ", nccl_name(c), " #", number,
                            " timed out; NCCL was aborted");
          {
            const std::lock_guard lock(registry().mutex);
            abort_nccl();
          }
          throw collective_timeout(message(
              "zest: collective timeout on axis '", name_, "': ", nccl_name(c), " #", number,
              " on rank ", rank_, " of ", size_, " not complete after ",
              std::chrono::duration<double>(nccl_clock::now() - started).count(),
              " s (moving the data: all ranks agreed on the call, but it did not finish); called ",
              c.where.line() != 0 ? "at " + site_of(c.where) : std::string("at ?")));
        }
      }
    }
    done.wait_on(cuda::compute_stream());
    return true;
  }

  std::uint64_t calls_so_far() const { return next_number_; }

  // ---- the watchdog outside checked mode ---------------------------------------------------
  //
  // A blocking call returns once the compute stream waits for the collective, so nothing on
  // the host waits for it until some host wait (cuda::wait_for: a copy to the host, a
  // synchronize) does. Each communicator keeps the collectives it queued and has not yet seen
  // complete (pending_, zest/comm/detail/pending_collectives.hpp); while any communicator is
  // alive the host waits poll and call host_wait_check now and then, which checks every
  // communicator's oldest pending collective against the watchdog.

  // Every live communicator. Never destroyed (communicators may outlive static objects).
  struct registry_state {
    std::mutex mutex;
    std::vector<nccl_core*> live;
  };
  static registry_state& registry() {
    static auto* r = new registry_state;  // NOLINT(cppcoreguidelines-owning-memory)
    return *r;
  }

  // The hook of cuda::wait_for (installed while a communicator is alive): throws
  // collective_timeout for a collective past the watchdog (after aborting its communicator),
  // communicator_error for one NCCL reported an error on; says whether any is pending.
  static cuda::detail::wait_check host_wait_check() {
    const std::chrono::milliseconds watchdog = checked_mode().watchdog;
    if (watchdog.count() <= 0) return cuda::detail::wait_check::no_deadline;
    registry_state& r = registry();
    const std::lock_guard lock(r.mutex);
    const auto now = nccl_clock::now();
    bool idle = true;
    for (nccl_core* core : r.live) idle = core->check_pending(now, watchdog) && idle;
    return idle ? cuda::detail::wait_check::idle : cuda::detail::wait_check::pending;
  }

  // ncclCommAbort on this rank, once; later calls throw communicator_error naming `why`.
  void abort(std::string_view why) {
    const std::lock_guard lock(registry().mutex);
    if (comm_ == nullptr) return;
    if (broken_.empty()) broken_ = std::string(why);
    abort_nccl();
  }

  // How many collectives are pending on this communicator (tests, diagnostics).
  std::size_t pending_count() const {
    const std::lock_guard lock(registry().mutex);
    return pending_.size();
  }

  void count(const nccl_call& c) {
    if (c.barrier) return;
    auto& counter = stats_[c.kind];
    counter.calls += 1;
    counter.bytes_sent += c.bytes;
  }

  [[noreturn]] void throw_invalid(const nccl_call& c) const {
    throw communicator_error(message("zest: ", nccl_name(c), " on axis '", name_, "' (rank ", rank_,
                                     " of ", size_, "): ", c.invalid));
  }

  void ensure_usable(const nccl_call& c) const {
    if (broken_.empty() && comm_ != nullptr) return;
    throw communicator_error(message("zest: ", nccl_name(c), " on axis '", name_, "' (rank ", rank_,
                                     " of ", size_, "): the communicator is unusable: ", broken_));
  }

  static std::string_view nccl_name(const nccl_call& c) {
    return c.barrier ? "barrier" : name_of(c.kind);
  }

  // Checked mode for calls that do not reach NCCL (barrier, host memory): the fingerprint
  // exchange alone.
  void check_only(const nccl_call& c) {
    ensure_usable(c);
    if (checked() && size_ > 1) {
      exchange_and_compare(c);
    } else {
      ++next_number_;
      if (!c.invalid.empty()) throw_invalid(c);
    }
    record(c, next_number_ - 1);
  }

  // The always-on schedule check (as mpi_communicator's, zest/comm/detail/schedule_log.hpp):
  // the ranks compare the record of this communicator's calls through the MPI communicator
  // on the same ranks; on a difference every rank throws collective_mismatch naming the first
  // call that differs on each. Host-memory calls go through that MPI communicator, which is
  // in checked mode: they are compared before they are made.
  void check_schedule(std::string_view where, const source_site& caller) {
    if (size_ < 2 || mpi_ == nullptr) return;
    const source_site at = user_call::or_else(caller);
    const std::string what =
        where.empty() ? std::string("check_schedule") : message("check_schedule at ", where);
    const std::array<std::uint64_t, 2> mine{schedule_.hash(), schedule_.calls()};
    const std::vector<std::uint64_t> all = mpi_->exchange_words(mine, what, at);
    bool same = true;
    for (std::size_t r = 1; r < size_ && same; ++r) {
      same = all[2 * r] == all[0] && all[2 * r + 1] == all[1];
    }
    if (same) return;
    const std::string detail =
        schedule_.first_difference(size_, all, [&](const std::vector<std::uint64_t>& words) {
          return mpi_->exchange_words(words, what, at);
        });
    throw collective_mismatch(schedule_mismatch_message(name_, where, at, detail));
  }
  const schedule_log& schedule() const { return schedule_; }

 private:
  // ---- checked mode ------------------------------------------------------------------------

  using fingerprint = std::array<std::uint64_t, nfp::words>;

  fingerprint fingerprint_of(const nccl_call& c) {
    fingerprint f{};
    f[nfp::version] = nfp::current_version;
    f[nfp::kind] = c.barrier ? nfp::barrier_kind : static_cast<std::uint64_t>(c.kind);
    f[nfp::type] = c.barrier ? 0 : static_cast<std::uint64_t>(c.type);
    f[nfp::op_or_root] = c.kind == collective::broadcast ? static_cast<std::uint64_t>(c.root)
                                                         : static_cast<std::uint64_t>(c.reduction);
    f[nfp::axis] = name_hash_;
    f[nfp::number] = next_number_++;
    f[nfp::elements] = c.elements;
    f[nfp::counts] = c.counts_key;
    f[nfp::invalid] = c.invalid.empty() ? 0 : 1;
    f[nfp::pairs_sent] = c.pairs_sent;
    f[nfp::pairs_received] = c.pairs_received;
    f[nfp::counts_size] = c.counts_shown.size();
    for (std::size_t i = 0; i < nfp::shown_counts && i < c.counts_shown.size(); ++i) {
      f[nfp::first_count + i] = c.counts_shown[i];
    }
    std::string text = c.where.line() != 0 ? "at " + site_of(c.where) : std::string("at ?");
    if (const collective_context* context = collective_context::current()) {
      text += " in " + context->text();
    }
    std::memcpy(&f[nfp::site], text.data(), std::min(text.size(), nfp::site_chars - 1));
    return f;
  }
  static std::string site_text(const std::uint64_t* f) {
    const auto* chars = reinterpret_cast<const char*>(&f[nfp::site]);
    return std::string(chars, strnlen(chars, nfp::site_chars));
  }

  // "all_gather<float>[512] counts {1,3} #3"
  std::string describe(const std::uint64_t* f) const {
    std::ostringstream out;
    const std::uint64_t kind = f[nfp::kind];
    if (kind == nfp::barrier_kind) {
      out << "barrier";
    } else if (kind < collective_kinds) {
      out << name_of(static_cast<collective>(kind)) << '<'
          << name_of(static_cast<dtype>(f[nfp::type])) << ">[" << f[nfp::elements] << ']';
    } else {
      out << '?';
    }
    if (f[nfp::counts_size] > 0) {
      out << (kind == static_cast<std::uint64_t>(collective::all_to_all) ? " send_counts {"
                                                                         : " counts {");
      for (std::size_t i = 0; i < f[nfp::counts_size] && i < nfp::shown_counts; ++i) {
        out << (i == 0 ? "" : ",") << f[nfp::first_count + i];
      }
      out << (f[nfp::counts_size] > nfp::shown_counts ? ",...}" : "}");
    }
    if ((kind == static_cast<std::uint64_t>(collective::all_reduce) ||
         kind == static_cast<std::uint64_t>(collective::reduce_scatter)) &&
        f[nfp::op_or_root] != static_cast<std::uint64_t>(reduce_op::sum)) {
      out << ' ' << reduce_op_name(f[nfp::op_or_root]);
    }
    if (kind == static_cast<std::uint64_t>(collective::broadcast))
      out << " root " << f[nfp::op_or_root];
    out << " #" << f[nfp::number];
    if (f[nfp::axis] != name_hash_) out << " (on an axis with another name)";
    if (f[nfp::invalid] != 0) out << " (its buffer sizes are wrong)";
    if (f[nfp::version] != nfp::current_version) out << " (not a zest nccl_communicator call)";
    return out.str();
  }

  static bool same_call(const std::uint64_t* a, const std::uint64_t* b) {
    for (const std::size_t w : {nfp::version, nfp::kind, nfp::type, nfp::op_or_root, nfp::axis,
                                nfp::number, nfp::counts, nfp::invalid}) {
      if (a[w] != b[w]) return false;
    }
    return a[nfp::kind] == static_cast<std::uint64_t>(collective::all_to_all) ||
           a[nfp::elements] == b[nfp::elements];
  }

  void exchange_and_compare(const nccl_call& c) {
    const fingerprint mine = fingerprint_of(c);
    std::vector<std::uint64_t> all;
    try {
      all = exchange(mine);
    } catch (const collective_timeout& e) {
      broken_ = message("the check of ", describe(mine.data()), " timed out");
      throw collective_timeout(
          message("zest: collective timeout on axis '", name_, "': ", describe(mine.data()),
                  " on rank ", rank_, " of ", size_,
                  " (checking the call: some rank of this communicator has not reached it; it "
                  "skipped it or is blocked in another collective); called ",
                  site_text(mine.data()), " [", e.what(), "]"));
    }
    bool agree = true;
    std::uint64_t sent = 0, received = 0;
    std::size_t first_invalid = size_;
    for (std::size_t r = 0; r < size_; ++r) {
      const std::uint64_t* f = &all[r * nfp::words];
      agree = agree && same_call(all.data(), f);
      sent += f[nfp::pairs_sent];
      received += f[nfp::pairs_received];
      if (f[nfp::invalid] != 0 && first_invalid == size_) first_invalid = r;
    }
    const std::string prefix = message("zest: collective mismatch on axis '", name_, "': ");
    if (!agree) {
      std::ostringstream list;
      for (std::size_t r = 0; r < size_; ++r) {
        list << (r == 0 ? "" : "; ") << "rank " << r << ": " << describe(&all[r * nfp::words]);
      }
      const std::string sites = per_rank(
          size_, [&](std::size_t r) { return site_text(&all[r * nfp::words]); }, true);
      throw collective_mismatch(
          prefix + list.str() +
          " (all ranks of a communicator must make the same collective calls in the same "
          "order); called " +
          sites);
    }
    if (!c.invalid.empty()) throw_invalid(c);
    if (first_invalid < size_) {
      throw communicator_error(message("zest: ", nccl_name(c), " on axis '", name_, "' (rank ",
                                       rank_, " of ", size_, "): rank ", first_invalid,
                                       " passed buffers whose sizes do not fit the call"));
    }
    if (!c.barrier && c.kind == collective::all_to_all && sent != received) {
      throw collective_mismatch(
          message(prefix, describe(mine.data()),
                  ": send and receive counts do not pair up: ", all_to_all_details(c)));
    }
  }

  // Every rank's words, rank-major, through the checked MPI communicator (which has no
  // unsigned 64-bit element type: the words travel as int64_t, bit for bit).
  std::vector<std::uint64_t> exchange(std::span<const std::uint64_t> words) {
    std::vector<std::int64_t> mine(words.size()), all(words.size() * size_);
    std::transform(words.begin(), words.end(), mine.begin(),
                   [](std::uint64_t w) { return static_cast<std::int64_t>(w); });
    mpi_->all_gather<std::int64_t>(std::span<const std::int64_t>(mine),
                                   std::span<std::int64_t>(all));
    std::vector<std::uint64_t> out(all.size());
    std::transform(all.begin(), all.end(), out.begin(),
                   [](std::int64_t w) { return static_cast<std::uint64_t>(w); });
    return out;
  }

  // Which ranks' counts disagree (the count rows are exchanged only after a mismatch).
  std::string all_to_all_details(const nccl_call& c) {
    const std::size_t n = size_;
    std::vector<std::uint64_t> rows(2 * n, 0), all_rows(2 * n * n, 0);
    std::copy(c.send_row.begin(), c.send_row.end(), rows.begin());
    std::copy(c.recv_row.begin(), c.recv_row.end(), rows.begin() + static_cast<std::ptrdiff_t>(n));
    all_rows = exchange(rows);
    return describe_count_pairing(all_rows, n);
  }

  // ---- NCCL --------------------------------------------------------------------------------

  void nccl(ncclResult_t code, std::string_view call) const {
    nccl_check(code, call, name_, rank_, size_, comm_);
  }

  void enqueue(const nccl_call& c) {
    const cudaStream_t s = stream_->get();
    const std::size_t scale = c.wire.scale;
    const ncclDataType_t t = c.wire.type;
    const ncclRedOp_t op = nccl_op_of(c.reduction);
    const auto at = [&](const void* base, std::size_t elements) {
      return static_cast<const char*>(base) + elements * c.element_bytes;
    };
    const auto at_mut = [&](void* base, std::size_t elements) {
      return static_cast<char*>(base) + elements * c.element_bytes;
    };
    switch (c.kind) {
      case collective::all_gather:
        if (c.even) {
          nccl(ncclAllGather(c.send, c.recv, c.send_n * scale, t, comm_, s), "ncclAllGather");
        } else {
          nccl(ncclGroupStart(), "ncclGroupStart");
          std::size_t off = 0;
          for (std::size_t r = 0; r < size_; ++r) {
            void* dst = at_mut(c.recv, off);
            const void* src = r == rank_ ? c.send : dst;
            nccl(ncclBroadcast(src, dst, c.counts[r] * scale, t, static_cast<int>(r), comm_, s),
                 "ncclBroadcast");
            off += c.counts[r];
          }
          nccl(ncclGroupEnd(), "ncclGroupEnd");
        }
        return;
      case collective::reduce_scatter:
        if (c.even) {
          nccl(ncclReduceScatter(c.send, c.recv, c.recv_n * scale, t, op, comm_, s),
               "ncclReduceScatter");
        } else {
          nccl(ncclGroupStart(), "ncclGroupStart");
          std::size_t off = 0;
          for (std::size_t r = 0; r < size_; ++r) {
            void* dst = r == rank_ ? c.recv : nullptr;
            nccl(ncclReduce(at(c.send, off), dst, c.counts[r] * scale, t, op, static_cast<int>(r),
                            comm_, s),
                 "ncclReduce");
            off += c.counts[r];
          }
          nccl(ncclGroupEnd(), "ncclGroupEnd");
        }
        return;
      case collective::all_reduce:
        nccl(ncclAllReduce(c.recv, c.recv, c.recv_n * scale, t, op, comm_, s), "ncclAllReduce");
        return;
      case collective::broadcast:
        nccl(ncclBroadcast(c.recv, c.recv, c.recv_n * scale, t, c.root, comm_, s), "ncclBroadcast");
        return;
      case collective::all_to_all: {
        std::size_t send_off = 0, recv_off = 0;
        nccl(ncclGroupStart(), "ncclGroupStart");
        for (std::size_t j = 0; j < size_; ++j) {
          const std::size_t out = c.send_counts[j], in = c.recv_counts[j];
          if (j == rank_) {
            if (out != 0) {
              ZEST_CUDA_CHECK(cudaMemcpyAsync(at_mut(c.recv, recv_off), at(c.send, send_off),
                                              out * c.element_bytes, cudaMemcpyDeviceToDevice, s));
            }
          } else {
            if (out != 0)
              nccl(ncclSend(at(c.send, send_off), out * scale, t, static_cast<int>(j), comm_, s),
                   "ncclSend");
            if (in != 0)
              nccl(ncclRecv(at_mut(c.recv, recv_off), in * scale, t, static_cast<int>(j), comm_, s),
                   "ncclRecv");
          }
          send_off += out;
          recv_off += in;
        }
        nccl(ncclGroupEnd(), "ncclGroupEnd");
        return;
      }
    }
  }

  // ---- pending collectives (the watchdog outside checked mode) -----------------------------

  using done_event = std::shared_ptr<cuda::event>;
  static bool is_done(const done_event& e) { return e->ready(); }
  // Prune the list while queueing only once it is this long (a host wait prunes it fully).
  static constexpr std::size_t prune_above = 32;

  void watch(bool on) {
    registry_state& r = registry();
    const std::lock_guard lock(r.mutex);
    if (on) {
      r.live.push_back(this);
      cuda::detail::set_host_wait_hook(&nccl_core::host_wait_check);
    } else {
      std::erase(r.live, this);
      if (r.live.empty()) cuda::detail::set_host_wait_hook(nullptr);
    }
  }

  void track(const nccl_call& c, done_event done) {
    const auto now = nccl_clock::now();
    const std::lock_guard lock(registry().mutex);
    if (pending_.size() >= prune_above) pending_.prune(&nccl_core::is_done, now);
    pending_.push(std::move(done),
                  pending_call{name_of(c.kind), name_of(c.type), next_number_ - 1, c.elements},
                  now);
  }

  // Under the registry's lock. True when nothing is pending here.
  bool check_pending(nccl_clock::time_point now, std::chrono::milliseconds watchdog) {
    if (comm_ == nullptr || !broken_.empty()) {
      pending_.clear();
      return true;
    }
    if (pending_.prune(&nccl_core::is_done, now)) return true;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      const pending_call call = pending_.front().call;
      const char* last = ncclGetLastError(comm_);
      std::string what = message("zest: ", call.op, '<', call.type, ">[", call.elements, "] #",
                                 call.number, " on axis '", name_, "' (rank ", rank_, " of ", size_,
                                 "): NCCL error: ", ncclGetErrorString(async),
                                 (last != nullptr && *last != 0) ? "; " : "",
                                 last != nullptr ? last : "", "; NCCL was aborted");
      broken_ = message("NCCL reported an asynchronous error: ", ncclGetErrorString(async));
      abort_nccl();
      throw communicator_error(what);
    }
    if (const auto* late = pending_.overdue(watchdog, now)) {
      std::string what = pending_timeout_message(name_, *late, now, rank_, size_, world_ranks_,
                                                 checked(), watchdog);
      broken_ = message("the data transfer of ", late->call.op, " #", late->call.number,
                        " timed out; NCCL was aborted");
      abort_nccl();
      throw collective_timeout(what);
    }
    return false;
  }

  // Under the registry's lock: NCCL's kernels stop, later calls throw communicator_error.
  void abort_nccl() {
    static_cast<void>(ncclCommAbort(comm_));
    comm_ = nullptr;
    pending_.clear();
  }

  // Whether this communicator's stream finished within the watchdog (no deadline: waits).
  bool drained() const noexcept {
    std::chrono::milliseconds watchdog{0};
    try {
      watchdog = checked_mode().watchdog;
    } catch (...) {  // an unreadable ZEST_WATCHDOG_MS: wait as without a deadline
    }
    const cudaStream_t s = stream_->get();
    if (watchdog.count() <= 0) return cudaStreamSynchronize(s) == cudaSuccess;
    const auto deadline = nccl_clock::now() + watchdog;
    for (::zest::detail::backoff pause;; pause()) {
      const cudaError_t code = cudaStreamQuery(s);
      if (code == cudaSuccess) return true;
      if (code != cudaErrorNotReady || nccl_clock::now() >= deadline) {
        static_cast<void>(cudaGetLastError());
        return false;
      }
    }
  }

  std::string name_;
  std::uint64_t name_hash_ = 0;
  std::size_t size_ = 1;
  std::size_t rank_ = 0;
  std::vector<int> world_ranks_;  // world rank of each rank of this communicator
  pending_collectives<done_event> pending_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  std::optional<cuda::stream> stream_;  // created once the device is bound
  std::unique_ptr<mpi_communicator> mpi_;
  comm_stats stats_;
  std::uint64_t next_number_ = 0;
  std::optional<bool> checked_override_;
  schedule_log schedule_;
  std::string broken_;
  std::optional<std::size_t> registered_;  // in schedule_registry (not for one rank alone)

  // Call `number` into the schedule's record, named at the user's line of the public call.
  void record(const nccl_call& c, std::uint64_t number) {
    schedule_log::call_fields f;
    f.kind = c.barrier ? barrier_kind : static_cast<std::uint64_t>(c.kind);
    f.type = c.barrier ? 0 : static_cast<std::uint64_t>(c.type);
    f.op_or_root = c.kind == collective::broadcast ? static_cast<std::uint64_t>(c.root)
                                                   : static_cast<std::uint64_t>(c.reduction);
    f.elements = c.elements;
    f.counts_key = c.counts_key;
    f.invalid = !c.invalid.empty();
    f.where = c.where;
    schedule_.record(f, number);
  }
};

// Whether p is memory the GPU can address directly (device or managed); null counts as device.
inline bool is_device_pointer(const void* p) {
  if (p == nullptr) return true;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace detail

// Collectives over NCCL on device memory. See the top of this file. Requests may outlive the
// communicator (they share its state); a moved-from communicator may only be assigned to or
// destroyed.
class nccl_communicator {
 public:
  using backend_type = cuda_backend;

  // Collective over comm: binds a GPU, sends rank 0's ncclUniqueId over MPI, initialises
  // NCCL. comm is duplicated (for checks and host-memory calls) and may be freed afterwards.
  nccl_communicator(MPI_Comm comm, std::string name)
      : core_(std::make_shared<detail::nccl_core>(comm, std::move(name))) {}
  // A communicator of one rank on the current (or bound) GPU, without MPI.
  explicit nccl_communicator(std::string name = "local")
      : core_(std::make_shared<detail::nccl_core>(std::move(name))) {}

  nccl_communicator(nccl_communicator&&) noexcept = default;
  nccl_communicator& operator=(nccl_communicator&&) noexcept = default;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() = default;

  int size() const { return core_->size(); }
  int rank() const { return core_->rank(); }
  const std::string& name() const { return core_->name(); }
  const comm_stats& stats() const { return core_->stats(); }
  void reset_stats() { core_->reset_stats(); }
  // NCCL's communicator, its stream, and the GPU this rank uses.
  ncclComm_t native() const { return core_->native(); }
  cudaStream_t stream() const { return core_->stream(); }
  int device() const { return core_->device(); }

  // Checked mode for this communicator only (as mpi_communicator's). Every rank must agree.
  void set_checked(std::optional<bool> on) { core_->set_checked(on); }
  std::optional<bool> checked_override() const { return core_->checked_override(); }
  bool checked() const { return core_->checked(); }

  // recv = the ranks' send buffers in rank order; counts[r] = rank r's send size (empty: all
  // equal, recv.size() = size() * send.size()).
  template <class T>
  void all_gather(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                  std::span<const std::size_t> counts = {},
                  source_site where = source_site::current()) {
    run<T>(prepare_all_gather<T>(send, recv, counts), true, where,
           [&](auto& m) { m.template all_gather<T>(send, recv, counts); });
  }
  template <class T>
  request iall_gather(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                      std::span<const std::size_t> counts = {},
                      source_site where = source_site::current()) {
    return run<T>(prepare_all_gather<T>(send, recv, counts), false, where,
                  [&](auto& m) { m.template all_gather<T>(send, recv, counts); });
  }

  // recv = chunk rank() of the elementwise reduction of the ranks' send buffers.
  template <class T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                      std::span<const std::size_t> counts = {}, reduce_op op = reduce_op::sum,
                      source_site where = source_site::current()) {
    run<T>(prepare_reduce_scatter<T>(send, recv, counts, op), true, where,
           [&](auto& m) { m.template reduce_scatter<T>(send, recv, counts, op); });
  }
  template <class T>
  request ireduce_scatter(std::type_identity_t<std::span<const T>> send, std::span<T> recv,
                          std::span<const std::size_t> counts = {}, reduce_op op = reduce_op::sum,
                          source_site where = source_site::current()) {
    return run<T>(prepare_reduce_scatter<T>(send, recv, counts, op), false, where,
                  [&](auto& m) { m.template reduce_scatter<T>(send, recv, counts, op); });
  }

  // inout = the elementwise reduction of every rank's inout.
  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op = reduce_op::sum,
                  source_site where = source_site::current()) {
    run<T>(prepare_all_reduce<T>(inout, op), true, where,
           [&](auto& m) { m.template all_reduce<T>(inout, op); });
  }
  template <class T>
  request iall_reduce(std::span<T> inout, reduce_op op = reduce_op::sum,
                      source_site where = source_site::current()) {
    return run<T>(prepare_all_reduce<T>(inout, op), false, where,
                  [&](auto& m) { m.template all_reduce<T>(inout, op); });
  }

  // Block j of send goes to rank j; block j of recv comes from rank j. Empty counts: equal blocks.
  template <class T>
  void all_to_all(std::type_identity_t<std::span<const T>> send,
                  std::span<const std::size_t> send_counts, std::span<T> recv,
                  std::span<const std::size_t> recv_counts,
                  source_site where = source_site::current()) {
    run<T>(prepare_all_to_all<T>(send, send_counts, recv, recv_counts), true, where,
           [&](auto& m) { m.template all_to_all<T>(send, send_counts, recv, recv_counts); });
  }
  template <class T>
  request iall_to_all(std::type_identity_t<std::span<const T>> send,
                      std::span<const std::size_t> send_counts, std::span<T> recv,
                      std::span<const std::size_t> recv_counts,
                      source_site where = source_site::current()) {
    return run<T>(prepare_all_to_all<T>(send, send_counts, recv, recv_counts), false, where,
                  [&](auto& m) { m.template all_to_all<T>(send, send_counts, recv, recv_counts); });
  }

  // data = root's data on every rank.
  template <class T>
  void broadcast(std::span<T> data, int root, source_site where = source_site::current()) {
    run<T>(prepare_broadcast<T>(data, root), true, where,
           [&](auto& m) { m.template broadcast<T>(data, root); });
  }
  template <class T>
  request ibroadcast(std::span<T> data, int root, source_site where = source_site::current()) {
    return run<T>(prepare_broadcast<T>(data, root), false, where,
                  [&](auto& m) { m.template broadcast<T>(data, root); });
  }

  // Gives up on this communicator on this rank: NCCL is aborted (its kernels here stop, its
  // queued work is dropped) and every later call throws communicator_error. For a rank that
  // ends early after an error of its own: NCCL may need every rank of a communicator to
  // abort before an abort returns. Collectives already queued are not waited for.
  void abort() { core_->abort("aborted by nccl_communicator::abort()"); }

  // The always-on schedule check (mpi_communicator::check_schedule says what it compares).
  void check_schedule(std::string_view where = {}, source_site at = source_site::current()) {
    core_->check_schedule(where, at);
  }
  // This rank's record of the collectives on device memory issued so far.
  schedule_fingerprint schedule() const {
    return {core_->schedule().hash(), core_->schedule().calls()};
  }

  // Every rank arrives; this rank's queued GPU work (compute and this communicator's) is done.
  void barrier(source_site where = source_site::current()) {
    const user_call user(where);
    detail::nccl_call c;
    c.barrier = true;
    c.where = user_call::or_else(where);
    core_->check_only(c);
    cuda::wait_for(core_->stream());  // under the watchdog (cuda::wait_for)
    cuda::synchronize();
    if (auto* m = core_->mpi()) m->barrier();
  }

 private:
  // Device memory goes to NCCL; host memory to MPI (or, alone, a copy). Every rank must
  // pass the same kind of memory. A null pointer (an empty span) goes with the other buffer.
  template <class T, class HostCall>
  request run(detail::nccl_call c, bool blocking, const source_site& where, HostCall&& host_call) {
    c.where = user_call::or_else(where);
    const user_call user(where);  // host memory: the MPI communicator's calls name it too
    const bool send_device = detail::is_device_pointer(c.send);
    const bool recv_device = detail::is_device_pointer(c.recv);
    const bool on_device = send_device && recv_device;
    if (send_device != recv_device && c.send != nullptr && c.recv != nullptr) {
      // Rejected after the check exchange (start throws it), so the other ranks throw too.
      detail::nccl_reject(c,
                          "send and recv buffers must both be device memory or both host memory");
    } else if (!on_device) {
      return run_on_host<T>(std::move(c), host_call);
    }
    const std::uint64_t number = core_->calls_so_far();
    auto done = core_->start(c);
    if (blocking) {
      core_->finish(c, *done, true, number);
      return {};
    }
    auto core = core_;
    auto call = std::make_shared<detail::nccl_call>(std::move(c));
    return request([core, call, done, number](bool block) {
      return core->finish(*call, *done, block, number);
    });
  }

  template <class T, class HostCall>
  request run_on_host(detail::nccl_call c, HostCall& host_call) {
    if (!c.invalid.empty()) core_->throw_invalid(c);
    if (auto* m = core_->mpi()) {
      host_call(*m);  // MPI does its own checks (the inner communicator is in checked mode)
      core_->count(c);
      return {};
    }
    // One rank without MPI: all_gather, reduce_scatter and all_to_all copy; the rest keep the data.
    core_->check_only(c);
    if (c.send != nullptr && c.recv != nullptr && c.send != c.recv &&
        (c.kind == collective::all_gather || c.kind == collective::reduce_scatter ||
         c.kind == collective::all_to_all)) {
      std::memmove(c.recv, c.send, c.send_n * sizeof(T));
    }
    core_->count(c);
    return {};
  }

  template <class T>
  detail::nccl_call typed(collective kind) const {
    detail::nccl_call c;
    c.kind = kind;
    c.type = dtype_of<T>();
    c.wire = detail::nccl_type_of<T>();
    c.element_bytes = sizeof(T);
    return c;
  }
  std::size_t n() const { return static_cast<std::size_t>(core_->size()); }
  std::size_t me() const { return static_cast<std::size_t>(core_->rank()); }

  template <class T>
  detail::nccl_call prepare_all_gather(std::span<const T> send, std::span<T> recv,
                                       std::span<const std::size_t> counts) const {
    auto c = typed<T>(collective::all_gather);
    c.send = send.data();
    c.recv = recv.data();
    c.send_n = send.size();
    c.recv_n = recv.size();
    c.elements = recv.size();
    detail::nccl_prepare_chunks(c, n(), me(), send.size(), recv.size(), counts, "send", "recv");
    c.bytes = (n() - 1) * send.size() * sizeof(T);
    return c;
  }
  template <class T>
  detail::nccl_call prepare_reduce_scatter(std::span<const T> send, std::span<T> recv,
                                           std::span<const std::size_t> counts,
                                           reduce_op op) const {
    auto c = typed<T>(collective::reduce_scatter);
    c.send = send.data();
    c.recv = recv.data();
    c.send_n = send.size();
    c.recv_n = recv.size();
    c.elements = send.size();
    c.reduction = op;
    detail::nccl_prepare_chunks(c, n(), me(), recv.size(), send.size(), counts, "recv", "send");
    const std::uint64_t total = detail::nccl_sum(c.counts);
    c.bytes = (counts.empty() ? send.size() - std::min(send.size(), recv.size())
                              : total - c.counts[me()]) *
              sizeof(T);
    if (!c.wire.reducible) detail::nccl_reject(c, "NCCL cannot reduce this element type (uint16)");
    return c;
  }
  template <class T>
  detail::nccl_call prepare_all_reduce(std::span<T> inout, reduce_op op) const {
    auto c = typed<T>(collective::all_reduce);
    c.send = inout.data();
    c.recv = inout.data();
    c.send_n = c.recv_n = inout.size();
    c.elements = inout.size();
    c.reduction = op;
    const std::size_t total = inout.size();
    const std::size_t my_chunk = total / n() + (me() < total % n() ? 1 : 0);
    c.bytes = 2 * (total - my_chunk) * sizeof(T);
    if (!c.wire.reducible) detail::nccl_reject(c, "NCCL cannot reduce this element type (uint16)");
    return c;
  }
  template <class T>
  detail::nccl_call prepare_all_to_all(std::span<const T> send,
                                       std::span<const std::size_t> send_counts, std::span<T> recv,
                                       std::span<const std::size_t> recv_counts) const {
    auto c = typed<T>(collective::all_to_all);
    c.send = send.data();
    c.recv = recv.data();
    c.send_n = send.size();
    c.recv_n = recv.size();
    detail::nccl_prepare_all_to_all(c, n(), me(), send_counts, recv_counts);
    return c;
  }
  template <class T>
  detail::nccl_call prepare_broadcast(std::span<T> data, int root) const {
    auto c = typed<T>(collective::broadcast);
    c.send = data.data();
    c.recv = data.data();
    c.send_n = c.recv_n = data.size();
    c.elements = data.size();
    c.root = root;
    const std::size_t size = n();
    if (root < 0 || static_cast<std::size_t>(root) >= size) {
      detail::nccl_reject(
          c,
          detail::message("root ", root, " is not a rank of this communicator (size ", size, ")"));
      c.root = 0;
      return c;
    }
    const auto r = static_cast<std::size_t>(root);
    const bool last = me() == (r + size - 1) % size;
    c.bytes = (size == 1 || (last && me() != r)) ? 0 : data.size() * sizeof(T);
    return c;
  }

  std::shared_ptr<detail::nccl_core> core_;
};

static_assert(communicator<nccl_communicator>);

}  // namespace zest
