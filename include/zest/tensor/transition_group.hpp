// zest/tensor/transition_group.hpp — the mover: shards taken from one layout to another, in
// groups, one collective per axis and step for the whole group.
//
//   detail::transition_group<float, Mesh> g(mesh);
//   g.add("mh", from, plan, global, local, data);   // each shard with its own plan
//   g.add("h", from2, plan2, global2, local2, data2);
//   g.start(); ...; g.wait();                        // or g.run(), blocking
//   auto block = g.release(0);
//
// A group can put its all-gathers and reduce-scatters on a quantized wire (int8 blocks with
// fp32 scales: zest/layout/wire.hpp, ZeRO++'s qwZ and qgZ): transition_group g(mesh,
// int8_blocks(256)). Each rank then encodes its parts, the collective moves bytes (a
// reduce-scatter becomes an all-to-all), and the receiver decodes (and sums, in fp32).
//
// redistribute and redistribute_all/async (zest/tensor/redistribute.hpp) are its typed front:
// every change of layout in zest runs here. The dims are run-time strings and the extents a
// max_dims array, so this compiles once per element type, mesh and backend.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/backend/backend.hpp"
#include "zest/comm/checked.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/error.hpp"
#include "zest/core/float16.hpp"
#include "zest/core/memory.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/wire.hpp"
#include "zest/tensor/wire_codec.hpp"

namespace zest {

namespace detail {

// A shard's extents with its rank known at run time (the dims string's length): what lets the
// mover below compile once per element type and mesh, not once per tensor type.
using shard_extents = std::array<std::size_t, max_dims>;

template <std::size_t Rank>
shard_extents to_shard_extents(const std::array<std::size_t, Rank>& e) {
  static_assert(Rank <= max_dims);
  shard_extents out{};
  std::copy(e.begin(), e.end(), out.begin());
  return out;
}

// A shard in flight between two layouts: its dims, current layout, extents and contents.
// The contents start as the caller's buffer, borrowed: the first step that produces a new
// buffer (all of them but a lone all_reduce and zero_partial) reads it without a copy.
template <class T, class Backend>
struct moving_shard {
  using buffer = typename Backend::template buffer<T>;
  std::string_view dims;
  layout_value layout{};
  shard_extents global{}, local{};
  std::span<const T> data;
  buffer owned;
  bool borrowed = true;

  std::size_t rank() const { return dims.size(); }
  std::size_t dim(char c) const { return dims.find(c); }
  T* writable() {
    if (borrowed) {
      owned = buffer(data.size());
      Backend::copy_slices(data.data(), 1, 1, 0, owned.data(), 1, 0, 1, data.size());
      borrowed = false;
    }
    data = {owned.data(), owned.size()};
    return owned.data();
  }
  void replace(buffer&& next) {
    owned = std::move(next);
    data = {owned.data(), owned.size()};
    borrowed = false;
  }
  buffer release() {
    if (borrowed) writable();
    return std::move(owned);
  }
};

// The element types a quantized wire can carry (it encodes and sums in fp32).
template <class T>
inline constexpr bool wire_quantizable_v =
    std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// One collective step for several shards at once: the same kind on the same axis, each shard
// with its own step (its dims). The shards' blocks travel in one collective, rank-major (for
// each rank of the axis, every shard's block for it, in the shards' order); prepare() packs,
// start() issues the collective (blocking or not), finish() waits and unpacks. With one shard
// whose blocks are already in place, nothing is packed. On a quantized wire the packed parts
// are encoded after packing and decoded before unpacking (zest/layout/wire.hpp).
template <class T, class Mesh, class Backend>
class coalesced_step {
 public:
  using buffer = typename Backend::template buffer<T>;
  using bytes = typename Backend::template buffer<std::uint8_t>;
  struct member {
    moving_shard<T, Backend>* shard;
    transition_step step;
  };

  coalesced_step(std::vector<member> members, const Mesh& mesh, wire_format wire = {})
      : members_(std::move(members)),
        mesh_(&mesh),
        kind_(members_.front().step.kind),
        axis_(members_.front().step.axis),
        n_(static_cast<std::size_t>(mesh.size(axis_))),
        me_(static_cast<std::size_t>(mesh.coord(axis_))),
        wire_(wire),
        quantized_(wire.carries(kind_, n_)) {
    if (quantized_ && !wire_quantizable_v<T>) {
      throw std::logic_error(
          "zest transition_group: a quantized wire carries float, bfloat16 and float16 elements "
          "only");
    }
  }
  coalesced_step(const coalesced_step&) = delete;
  coalesced_step& operator=(const coalesced_step&) = delete;

  step_kind kind() const { return kind_; }

  // Counts, offsets and the packed send buffer.
  void prepare() {
    const std::size_t m = members_.size();
    per_.assign(m, {});
    send_counts_.assign(n_, 0);
    recv_counts_.assign(n_, 0);
    auto coords = mesh_->coords();
    for (std::size_t k = 0; k < m; ++k) {
      auto& sh = *members_[k].shard;
      const auto& s = members_[k].step;
      auto& p = per_[k];
      p.send.assign(n_, 0);
      p.recv.assign(n_, 0);
      switch (kind_) {
        case step_kind::all_reduce:
          for (std::size_t c = 0; c < n_; ++c) p.send[c] = p.recv[c] = c == 0 ? sh.data.size() : 0;
          break;
        case step_kind::all_gather: {
          const std::size_t i = sh.dim(s.dim);
          p.sl = rows_around(sh.local, i, sh.rank());
          p.ranges.resize(n_);
          for (std::size_t c = 0; c < n_; ++c) {
            coords[axis_] = static_cast<int>(c);
            p.ranges[c] = dim_range(sh.layout, s.dim, sh.global[i], mesh_->sizes(), coords);
            p.recv[c] = p.sl.outer * p.ranges[c].size * p.sl.inner;
            p.full += p.ranges[c].size;
          }
          p.send[me_] = sh.data.size();
          break;
        }
        case step_kind::reduce_scatter: {
          p.sl = rows_around(sh.local, sh.dim(s.dim), sh.rank());
          p.ranges.resize(n_);
          for (std::size_t c = 0; c < n_; ++c) {
            p.ranges[c] = balanced_block(p.sl.n, n_, c);
            p.send[c] = p.sl.outer * p.ranges[c].size * p.sl.inner;
          }
          p.recv[me_] = p.send[me_];
          break;
        }
        case step_kind::all_to_all: {
          // I hold my block of `dim` and all of `to_dim` (within its outer splits). Rank c gets
          // my block cut to its part of to_dim; I get every rank's block of `dim` cut to mine.
          const std::size_t i = sh.dim(s.dim);
          const std::size_t j = sh.dim(s.to_dim);
          p.sl = rows_around(sh.local, j, sh.rank());
          p.ranges.resize(n_);       // to_dim's parts
          p.from_ranges.resize(n_);  // dim's blocks
          for (std::size_t c = 0; c < n_; ++c) {
            p.ranges[c] = balanced_block(sh.local[j], n_, c);
            p.send[c] = p.sl.outer * p.ranges[c].size * p.sl.inner;
            coords[axis_] = static_cast<int>(c);
            p.from_ranges[c] = dim_range(sh.layout, s.dim, sh.global[i], mesh_->sizes(), coords);
          }
          // Elements other than dims i and j are the same on every rank of the axis.
          std::size_t rest = 1;
          for (std::size_t d = 0; d < sh.rank(); ++d) {
            if (d != i && d != j) rest *= sh.local[d];
          }
          for (std::size_t c = 0; c < n_; ++c) {
            p.recv[c] = rest * p.from_ranges[c].size * p.ranges[me_].size;
            p.full += p.from_ranges[c].size;
          }
          break;
        }
        case step_kind::slice:
        case step_kind::zero_partial: break;  // local: never coalesced
      }
      for (std::size_t c = 0; c < n_; ++c) {
        send_counts_[c] += p.send[c];
        recv_counts_[c] += p.recv[c];
      }
    }
    // Offsets of each member's block within each rank's part, send and receive side.
    std::size_t send_at = 0, recv_at = 0;
    for (std::size_t c = 0; c < n_; ++c) {
      for (std::size_t k = 0; k < m; ++k) {
        auto& p = per_[k];
        p.send_at.push_back(send_at);
        p.recv_at.push_back(recv_at);
        send_at += p.send[c];
        recv_at += p.recv[c];
      }
    }
    pack(send_at, recv_at);
    if constexpr (wire_quantizable_v<T>) {  // the constructor refuses a wire for any other T
      if (quantized_) encode();
    }
  }

  // Issues the collective: non-blocking (a request that finish() waits on) or blocking.
  void start(bool blocking) {
    auto& comm = mesh_->axis(axis_);
    const collective_context context("redistribute", [this](std::ostream& o) { describe(o); });
    const std::span<const T> in(send_ptr_, send_size_);
    const std::span<T> out(recv_ptr_, recv_size_);
    const std::span<const std::size_t> sc(send_counts_), rc(recv_counts_);
    if (quantized_) {
      start_quantized(comm, blocking);
      return;
    }
    switch (kind_) {
      case step_kind::all_reduce:
        if (blocking) {
          comm.all_reduce(out, reduce_op::sum);
        } else {
          done_ = comm.iall_reduce(out, reduce_op::sum);
        }
        break;
      case step_kind::all_gather:
        if (blocking) {
          comm.all_gather(in, out, rc);
        } else {
          done_ = comm.iall_gather(in, out, rc);
        }
        break;
      case step_kind::reduce_scatter:
        if (blocking) {
          comm.reduce_scatter(in, out, sc, reduce_op::sum);
        } else {
          done_ = comm.ireduce_scatter(in, out, sc, reduce_op::sum);
        }
        break;
      case step_kind::all_to_all:
        if (blocking) {
          comm.all_to_all(in, sc, out, rc);
        } else {
          done_ = comm.iall_to_all(in, sc, out, rc);
        }
        break;
      case step_kind::slice:
      case step_kind::zero_partial: break;
    }
  }

  // Waits for the collective and hands each member its new block and layout.
  void finish() {
    done_.wait();
    if constexpr (wire_quantizable_v<T>) {
      if (quantized_) decode();
    }
    for (std::size_t k = 0; k < members_.size(); ++k) {
      auto& sh = *members_[k].shard;
      const auto& s = members_[k].step;
      auto& p = per_[k];
      switch (kind_) {
        case step_kind::all_reduce:
          if (!in_place_) {
            buffer out(p.recv[0]);
            copy(recv_ptr_ + p.recv_at[0], p.recv[0], out.data());
            sh.replace(std::move(out));
          }
          break;
        case step_kind::all_gather: {
          const std::size_t i = sh.dim(s.dim);
          if (!direct_out_) {
            buffer out(p.sl.outer * p.full * p.sl.inner);
            std::size_t pos = 0;
            for (std::size_t c = 0; c < n_; ++c) {
              Backend::copy_slices(recv_ptr_ + p.recv_at[c], p.sl.outer, p.ranges[c].size, 0,
                                   out.data(), p.full, pos, p.ranges[c].size, p.sl.inner);
              pos += p.ranges[c].size;
            }
            sh.replace(std::move(out));
          } else {
            sh.replace(std::move(recv_));
          }
          sh.local[i] = p.full;
          break;
        }
        case step_kind::reduce_scatter: {
          if (!direct_out_) {
            buffer out(p.recv[me_]);
            copy(recv_ptr_ + p.recv_at[me_], p.recv[me_], out.data());
            sh.replace(std::move(out));
          } else {
            sh.replace(std::move(recv_));
          }
          sh.local[sh.dim(s.dim)] = p.ranges[me_].size;
          break;
        }
        case step_kind::all_to_all: {
          const std::size_t i = sh.dim(s.dim);
          const std::size_t j = sh.dim(s.to_dim);
          auto out_local = sh.local;
          out_local[i] = p.full;
          out_local[j] = p.ranges[me_].size;
          const auto recv_rows = rows_around(out_local, i, sh.rank());
          std::size_t total = 0;
          for (auto c : p.recv) total += c;
          buffer out(total);
          std::size_t pos = 0;
          for (std::size_t c = 0; c < n_; ++c) {
            Backend::copy_slices(recv_ptr_ + p.recv_at[c], recv_rows.outer, p.from_ranges[c].size,
                                 0, out.data(), p.full, pos, p.from_ranges[c].size,
                                 recv_rows.inner);
            pos += p.from_ranges[c].size;
          }
          sh.replace(std::move(out));
          sh.local = out_local;
          break;
        }
        case step_kind::slice:
        case step_kind::zero_partial: break;
      }
      sh.layout = after_step(sh.layout, s);
    }
    memory::release(send_);
    memory::release(recv_);
    memory::release(wire_send_);
    memory::release(wire_recv_);
  }

 private:
  struct member_counts {
    std::vector<std::size_t> send, recv;        // per rank of the axis
    std::vector<std::size_t> send_at, recv_at;  // offsets in the packed buffers, per rank
    std::vector<block_range> ranges, from_ranges;
    shard_rows sl;
    std::size_t full = 0;  // all_gather, all_to_all: the gathered dim's extent
  };

  static void copy(const T* from, std::size_t n, T* to) {
    if (n != 0) Backend::copy_slices(from, 1, 1, 0, to, 1, 0, 1, n);
  }

  void pack(std::size_t send_total, std::size_t recv_total) {
    const bool single = members_.size() == 1;
    auto& first = *members_.front().shard;
    switch (kind_) {
      case step_kind::all_reduce:
        if (single) {  // in place
          in_place_ = true;
          recv_ptr_ = first.writable();
          recv_size_ = first.data.size();
        } else {
          recv_ = buffer(recv_total);
          for (std::size_t k = 0; k < members_.size(); ++k) {
            const auto& d = members_[k].shard->data;
            copy(d.data(), d.size(), recv_.data() + per_[k].recv_at[0]);
          }
          recv_ptr_ = recv_.data();
          recv_size_ = recv_.size();
        }
        send_ptr_ = recv_ptr_;
        send_size_ = recv_size_;
        return;
      case step_kind::all_gather:
        if (single) {
          send_ptr_ = first.data.data();
          send_size_ = first.data.size();
        } else {
          send_ = buffer(send_total);
          for (std::size_t k = 0; k < members_.size(); ++k) {
            const auto& d = members_[k].shard->data;
            copy(d.data(), d.size(), send_.data() + per_[k].send_at[me_]);
          }
          send_ptr_ = send_.data();
          send_size_ = send_.size();
        }
        // One shard whose blocks are whole rows: received in place, in rank order.
        direct_out_ = single && per_.front().sl.outer == 1;
        break;
      case step_kind::reduce_scatter:
        if (single && per_.front().sl.outer == 1) {
          send_ptr_ = first.data.data();
          send_size_ = first.data.size();
        } else {
          pack_parts(send_total);
        }
        direct_out_ = single;
        break;
      case step_kind::all_to_all: pack_parts(send_total); break;
      case step_kind::slice:
      case step_kind::zero_partial: return;
    }
    recv_ = buffer(recv_total);
    recv_ptr_ = recv_.data();
    recv_size_ = recv_.size();
  }

  // reduce_scatter and all_to_all: each member's part c of its rows around the dim (ranges[c]) goes to rank
  // c, the parts packed rank-major.
  void pack_parts(std::size_t send_total) {
    send_ = buffer(send_total);
    for (std::size_t k = 0; k < members_.size(); ++k) {
      const auto& d = members_[k].shard->data;
      const auto& p = per_[k];
      for (std::size_t c = 0; c < n_; ++c) {
        Backend::copy_slices(d.data(), p.sl.outer, p.sl.n, p.ranges[c].offset,
                             send_.data() + p.send_at[c], p.ranges[c].size, 0, p.ranges[c].size,
                             p.sl.inner);
      }
    }
    send_ptr_ = send_.data();
    send_size_ = send_.size();
  }

  // ----- The quantized wire (zest/layout/wire.hpp) ---------------------------------------
  // A tensor's part as packed (elements from `at`) and on the wire (bytes from `wire_at`).
  struct wire_part {
    std::size_t at, count, wire_at;
  };

  // The packed send parts -> wire_send_, with the wire's counts both ways. An all-gather
  // sends my part to everyone and receives everyone's; a reduce-scatter becomes an
  // all-to-all: part c of each tensor to rank c, and from every rank its part for me.
  void encode() {
    const std::size_t m = members_.size();
    wire_send_counts_.assign(n_, 0);
    wire_recv_counts_.assign(n_, 0);
    std::vector<wire_part> sends;
    std::size_t wire_at = 0;
    for (std::size_t c = 0; c < n_; ++c) {
      for (std::size_t k = 0; k < m; ++k) {
        const std::size_t count = per_[k].send[c];
        sends.push_back({per_[k].send_at[c], count, wire_at});
        wire_at += wire_.bytes(count);
        wire_send_counts_[c] += wire_.bytes(count);
        const std::size_t in = kind_ == step_kind::all_gather ? per_[k].recv[c] : per_[k].send[me_];
        wire_recv_counts_[c] += wire_.bytes(in);
      }
    }
    wire_send_ = bytes(wire_at);
    for (const wire_part& p : sends) {
      if (p.count == 0) continue;
      const std::size_t blocks = (p.count + wire_.block - 1) / wire_.block;
      Backend::for_each(blocks, encode_blocks_fn<T>{send_ptr_ + p.at, p.count, wire_.block,
                                                    wire_send_.data() + p.wire_at});
    }
    std::size_t recv_total = 0;
    for (std::size_t c : wire_recv_counts_) recv_total += c;
    wire_recv_ = bytes(recv_total);
  }

  template <class Comm>
  void start_quantized(Comm& comm, bool blocking) {
    const std::span<const std::uint8_t> in(wire_send_.data(), wire_send_.size());
    const std::span<std::uint8_t> out(wire_recv_.data(), wire_recv_.size());
    const std::span<const std::size_t> sc(wire_send_counts_), rc(wire_recv_counts_);
    if (kind_ == step_kind::all_gather) {
      if (blocking) {
        comm.all_gather(in, out, rc);
      } else {
        done_ = comm.iall_gather(in, out, rc);
      }
    } else if (blocking) {
      comm.all_to_all(in, sc, out, rc);
    } else {
      done_ = comm.iall_to_all(in, sc, out, rc);
    }
  }

  // wire_recv_ -> the received blocks in recv_, as the exact collective leaves them: every
  // rank's part decoded (all-gather; mine too, so every rank holds the same values), or the
  // parts for me decoded and summed in rank order (reduce-scatter).
  void decode() {
    const std::size_t m = members_.size();
    std::size_t wire_at = 0;
    if (kind_ == step_kind::all_gather) {
      for (std::size_t c = 0; c < n_; ++c) {
        for (std::size_t k = 0; k < m; ++k) {
          const std::size_t count = per_[k].recv[c];
          if (count != 0) {
            Backend::for_each(count, decode_fn<T>{wire_recv_.data() + wire_at, count, wire_.block,
                                                  recv_ptr_ + per_[k].recv_at[c]});
          }
          wire_at += wire_.bytes(count);
        }
      }
      return;
    }
    const std::size_t stride = wire_recv_counts_.front();  // every rank's part for me alike
    for (std::size_t k = 0; k < m; ++k) {
      const std::size_t count = per_[k].recv[me_];
      if (count != 0) {
        Backend::for_each(count, decode_sum_fn<T>{wire_recv_.data() + wire_at, stride, n_, count,
                                                  wire_.block, recv_ptr_ + per_[k].recv_at[me_]});
      }
      wire_at += wire_.bytes(count);
    }
  }

  // Checked mode compares this across ranks and names it in a mismatch or a timeout:
  //   "bsm" split(b:dp) -> replicate (all_gather over dp)
  //   3 tensors: "mh" split(m:dp) -> replicate, "h" ..., (all_gather over dp)
  void describe(std::ostream& o) const {
    const auto shown = [](std::string t) { return t.empty() ? std::string("replicate") : t; };
    if (members_.size() > 1) o << members_.size() << " tensors: ";
    for (std::size_t k = 0; k < members_.size() && k < 3; ++k) {
      const auto& sh = *members_[k].shard;
      if (k > 0) o << ", ";
      o << '"' << sh.dims << "\" " << shown(to_string(sh.layout, Mesh::axis_names)) << " -> "
        << shown(to_string(after_step(sh.layout, members_[k].step), Mesh::axis_names));
    }
    if (members_.size() > 3) o << ", ...";
    o << " (" << name_of(kind_) << " over " << Mesh::axis_names[axis_];
    if (quantized_) o << ", int8 blocks of " << wire_.block;
    o << ')';
  }

  std::vector<member> members_;
  const Mesh* mesh_;
  step_kind kind_;
  std::size_t axis_, n_, me_;
  std::vector<member_counts> per_;
  std::vector<std::size_t> send_counts_, recv_counts_;
  buffer send_, recv_;
  const T* send_ptr_ = nullptr;
  T* recv_ptr_ = nullptr;
  std::size_t send_size_ = 0, recv_size_ = 0;
  bool in_place_ = false;    // a lone all_reduce: on the shard's own buffer
  bool direct_out_ = false;  // one shard: the received buffer is its new block
  wire_format wire_;
  bool quantized_;  // this step travels on the quantized wire
  std::vector<std::size_t> wire_send_counts_, wire_recv_counts_;  // bytes, per rank
  bytes wire_send_, wire_recv_;
  request done_;  // last: destroyed (waited for) before the buffers
};

// A group of shards, each with its own plan, moved together: every collective step is issued
// once for all the shards whose next step is the same kind on the same axis (in the order of
// the first shard that needs it), local steps (slice, zero_partial) run as a shard reaches
// them. Plans depend only on global extents and mesh sizes, so every rank forms the same
// collectives in the same order. Compiled once per element type, mesh and backend: the dims
// are run-time strings here.
template <class T, class Mesh, class Backend = backend_of<Mesh>>
class transition_group {
 public:
  using buffer = typename Backend::template buffer<T>;

  // `wire`: how the group's all-gathers and reduce-scatters travel (exact by default).
  explicit transition_group(const Mesh& mesh, wire_format wire = {}) : mesh_(&mesh), wire_(wire) {
    if (wire_.quantized() && !wire_quantizable_v<T>) {
      throw std::logic_error(
          "zest transition_group: a quantized wire carries float, bfloat16 and float16 elements "
          "only");
    }
  }
  transition_group(const transition_group&) = delete;
  transition_group& operator=(const transition_group&) = delete;
  ~transition_group() = default;  // an issued collective is waited for (request's destructor)

  // A shard read in place (it must outlive run() or wait()), or handed over.
  std::size_t add(std::string_view dims, layout_value from, const transition_plan& plan,
                  const shard_extents& global, const shard_extents& local,
                  std::span<const T> data) {
    check_open("add");
    auto sh = std::make_unique<moving_shard<T, Backend>>();
    sh->dims = dims;
    sh->layout = from;
    sh->global = global;
    sh->local = local;
    sh->data = data;
    shards_.push_back(std::move(sh));
    plans_.push_back(plan);
    next_.push_back(0);
    return shards_.size() - 1;
  }
  std::size_t add(std::string_view dims, layout_value from, const transition_plan& plan,
                  const shard_extents& global, const shard_extents& local, buffer&& data) {
    const std::size_t k = add(dims, from, plan, global, local, std::span<const T>{});
    shards_[k]->replace(std::move(data));
    return k;
  }
  std::size_t size() const { return shards_.size(); }

  // Every step, blocking collectives.
  void run() {
    check_open("run");
    started_ = true;
    run_rest();
  }
  // The local steps up to the first collective, which is issued non-blocking; wait() does
  // the rest. The shards read in place must live until then.
  void start() {
    check_open("start");
    started_ = true;
    in_flight_ = next_collective();
    if (in_flight_) in_flight_->start(/*blocking=*/false);
  }
  void wait() {
    if (!started_) {
      throw std::logic_error("zest transition_group: wait() before start()");
    }
    if (in_flight_) {
      in_flight_->finish();
      in_flight_.reset();
      run_rest();
    }
  }

  // Shard k after run() or wait(): its contents (handed over), local extents and layout.
  buffer release(std::size_t k) { return shards_[k]->release(); }
  const shard_extents& local(std::size_t k) const { return shards_[k]->local; }
  layout_value layout(std::size_t k) const { return shards_[k]->layout; }

 private:
  void check_open(const char* what) const {
    if (started_) {
      throw std::logic_error(detail::message("zest transition_group: ", what,
                                             "() after the group was started; a group moves once"));
    }
  }

  void run_rest() {
    while (auto step = next_collective()) {
      step->start(/*blocking=*/true);
      step->finish();
    }
  }

  // Runs every shard's local steps up to its next collective, then forms the next coalesced
  // collective (prepared, not issued), or returns null when every plan is done.
  std::unique_ptr<coalesced_step<T, Mesh, Backend>> next_collective() {
    for (std::size_t k = 0; k < shards_.size(); ++k) {
      auto& sh = *shards_[k];
      while (next_[k] < plans_[k].size() && !is_collective(plans_[k][next_[k]].kind)) {
        run_local(plans_[k][next_[k]], sh);
        sh.layout = after_step(sh.layout, plans_[k][next_[k]]);
        ++next_[k];
      }
    }
    std::vector<typename coalesced_step<T, Mesh, Backend>::member> members;
    for (std::size_t k = 0; k < shards_.size(); ++k) {
      if (next_[k] == plans_[k].size()) continue;
      const transition_step& s = plans_[k][next_[k]];
      if (!members.empty() &&
          (s.kind != members.front().step.kind || s.axis != members.front().step.axis)) {
        continue;
      }
      members.push_back({shards_[k].get(), s});
      ++next_[k];
    }
    if (members.empty()) return nullptr;
    auto step =
        std::make_unique<coalesced_step<T, Mesh, Backend>>(std::move(members), *mesh_, wire_);
    step->prepare();
    return step;
  }

  void run_local(const transition_step& s, moving_shard<T, Backend>& sh) {
    const auto n = static_cast<std::size_t>(mesh_->size(s.axis));
    const auto me = static_cast<std::size_t>(mesh_->coord(s.axis));
    if (s.kind == step_kind::zero_partial) {
      if (me != 0) Backend::fill(sh.writable(), sh.data.size(), T{});
      return;
    }
    // slice: my part of the dim.
    const std::size_t i = sh.dim(s.dim);
    const block_range part = balanced_block(sh.local[i], n, me);
    const auto sl = rows_around(sh.local, i, sh.rank());
    buffer out(sl.outer * part.size * sl.inner);
    Backend::copy_slices(sh.data.data(), sl.outer, sl.n, part.offset, out.data(), part.size, 0,
                         part.size, sl.inner);
    sh.replace(std::move(out));
    sh.local[i] = part.size;
  }

  const Mesh* mesh_;
  wire_format wire_;
  std::vector<std::unique_ptr<moving_shard<T, Backend>>> shards_;
  std::vector<transition_plan> plans_;
  std::vector<std::size_t> next_;
  bool started_ = false;
  std::unique_ptr<coalesced_step<T, Mesh, Backend>> in_flight_;
};

}  // namespace detail

}  // namespace zest
