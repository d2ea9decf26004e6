// zest/comm/detail/mpi_core.hpp — the state behind an mpi_communicator and its
// requests: the duplicated MPI communicators, the watchdog's polled waits, checked mode's
// fingerprint exchanges and their verdicts, data transfers issued in call order, and the
// broken state after a timeout (zest/comm/mpi_communicator.hpp describes the behaviour).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <iomanip>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/comm/checked.hpp"
#include "zest/comm/communicator.hpp"
#include "zest/comm/detail/mpi_call.hpp"
#include "zest/comm/detail/mpi_comms.hpp"
#include "zest/comm/detail/mpi_fingerprint.hpp"
#include "zest/comm/detail/schedule_log.hpp"
#include "zest/comm/detail/schedule_registry.hpp"
#include "zest/comm/mpi_environment.hpp"
#include "zest/core/backoff.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/source_site.hpp"

namespace zest {
namespace detail {

// State shared by a communicator and its requests in flight, so that moving the
// communicator or outliving it with a request stays safe.
class mpi_core {
 public:
  mpi_core(MPI_Comm comm, std::string axis) : name_(std::move(axis)), name_hash_(hash_name(name_)) {
    if (comm == MPI_COMM_NULL) {
      throw communicator_error(message("zest: mpi_communicator '", name_, "': MPI_COMM_NULL"));
    }
    std::array<MPI_Comm, 3> dups{};
    check_code(duplicate_politely(comm, dups), "MPI_Comm_idup");
    std::array<owned_comm, 3> held;  // freed if anything below throws
    for (std::size_t i = 0; i < dups.size(); ++i) held[i].comm = dups[i];
    // Errors come back as codes and leave as communicator_error naming the axis.
    for (MPI_Comm c : dups) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    int size = 0, rank = 0;
    MPI_Comm_size(dups[0], &size);
    MPI_Comm_rank(dups[0], &rank);
    size_ = static_cast<std::size_t>(size);
    rank_ = static_cast<std::size_t>(rank);
    // The world ranks of this communicator's ranks, for messages.
    world_ranks_.resize(size_);
    std::vector<int> mine(size_);
    for (std::size_t r = 0; r < size_; ++r) mine[r] = static_cast<int>(r);
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(dups[0], &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(group, size, mine.data(), world, world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    for (owned_comm& c : held) c.comm = MPI_COMM_NULL;  // the core owns them from here
    data_ = dups[0];
    check_ = dups[1];
    report_ = dups[2];
    registered_ =
        schedule_registry::instance().add(name_, world_ranks_, rank, &schedule_, &broken_);
  }

  mpi_core(const mpi_core&) = delete;
  mpi_core& operator=(const mpi_core&) = delete;

  ~mpi_core() {
    schedule_registry::instance().close(registered_);  // for the end of the run's check
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized != 0) return;  // MPI already released everything
    // An op whose exchange never completed may still be written by MPI: leak it on purpose.
    auto keep_if_pending = [](const std::shared_ptr<checked_op>& op) {
      int check_done = 0, data_done = 0;
      MPI_Test(&op->check_request, &check_done, MPI_STATUS_IGNORE);
      MPI_Test(&op->data_request, &data_done, MPI_STATUS_IGNORE);
      if (check_done == 0 || data_done == 0) keep_forever(op);
    };
    for (const auto& op : undecided_) keep_if_pending(op);
    for (const auto& op : stranded_) keep_if_pending(op);
    drain_reports();
    MPI_Comm_free(&report_);
    MPI_Comm_free(&check_);
    MPI_Comm_free(&data_);
  }

  // Receives the timeout reports (who_else) that arrived and were never listened for, so
  // that MPI does not complain of unmatched messages at MPI_Finalize.
  void drain_reports() const {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, report_tag, report_, &flag, &status) != MPI_SUCCESS ||
          flag == 0) {
        return;
      }
      std::vector<std::uint64_t> report(schedule_log::report_words);
      MPI_Recv(report.data(), static_cast<int>(report.size()), MPI_UINT64_T, status.MPI_SOURCE,
               report_tag, report_, MPI_STATUS_IGNORE);
    }
  }

  MPI_Comm data() const { return data_; }
  const std::string& name() const { return name_; }
  const schedule_log& schedule() const { return schedule_; }

  // Compares the collectives this communicator issued on each of its ranks since it was made
  // (schedule_log's hash), with one small collective on the check communicator; `where`
  // names the point ("optimizer step 12"), `at` the caller. On a difference throws
  // collective_mismatch on every rank, naming the first call that differs on each rank; a
  // rank that does not come throws collective_timeout after the watchdog's deadline.
  void check_schedule(std::string_view where, const source_site& caller) {
    if (size_ < 2) return;
    const source_site at = user_call::or_else(caller);
    mpi_call call;
    call.kind = barrier_kind;
    call.where = at;
    ensure_usable(call);
    settle_all();
    const std::array<std::uint64_t, 2> mine{schedule_.hash(), schedule_.calls()};
    std::vector<std::uint64_t> all(2 * size_);
    exchange(mine.data(), 2, all, call, schedule_check_name(where));
    bool same = true;
    for (std::size_t r = 1; r < size_ && same; ++r) {
      same = all[2 * r] == all[0] && all[2 * r + 1] == all[1];
    }
    if (!same) throw_schedule_mismatch(where, at, all);
  }

  // Every rank's `mine` (the same number of words on each), rank-major: an all-gather on
  // the check communicator, not counted in the statistics nor in the schedule, under the
  // watchdog; `what` names it in a timeout. For the ranks' agreement on their setup.
  std::vector<std::uint64_t> exchange_words(std::span<const std::uint64_t> mine,
                                            std::string_view what, const source_site& at) {
    std::vector<std::uint64_t> all(mine.size() * size_);
    if (size_ == 1) {
      std::copy(mine.begin(), mine.end(), all.begin());
      return all;
    }
    mpi_call call;
    call.kind = barrier_kind;
    call.where = user_call::or_else(at);
    ensure_usable(call);
    settle_all();
    exchange(mine.data(), mine.size(), all, call, what);
    return all;
  }
  int size() const { return static_cast<int>(size_); }
  int rank() const { return static_cast<int>(rank_); }
  const comm_stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  std::optional<bool> checked_override() const { return checked_override_; }
  void set_checked(std::optional<bool> on) { checked_override_ = on; }
  bool checked() const { return checked_override_.value_or(checked_mode().enabled); }
  call_site site() const { return {size_, rank_, checked()}; }

  // Blocking call.
  void run(mpi_call call) {
    ensure_usable(call);
    if (!checked()) {
      if (!call.invalid.empty()) throw_invalid(call);
      settle_all();
      const std::uint64_t number = next_number_++;
      count(call, number);
      if (checked_mode().watchdog.count() == 0) {  // no deadline: MPI's blocking call
        check_code(run_call(call, data_), call);
        return;
      }
      MPI_Request pending = MPI_REQUEST_NULL;
      check_code(start_call(call, data_, &pending), call);
      try {
        wait_plain(pending, true, call, number);
      } catch (...) {
        keep_forever(std::move(call));  // MPI may still read its count arrays
        throw;
      }
      return;
    }
    const auto op = begin_checked(std::move(call));
    if (!op->call.invalid.empty()) finish_invalid(op);
    try {
      poll(*op, true);
    } catch (...) {
      abandon(op);
      throw;
    }
  }

  // Non-blocking call: the returned request's poll drives it.
  static request start(const std::shared_ptr<mpi_core>& core, mpi_call call) {
    core->ensure_usable(call);
    if (!core->checked()) {
      if (!call.invalid.empty()) core->throw_invalid(call);
      core->settle_all();
      core->count(call, core->next_number_);
      ++core->next_number_;
      auto state = std::make_shared<plain_request>(core, std::move(call), core->next_number_ - 1);
      state->core->check_code(start_call(state->call, core->data_, &state->request), state->call);
      return request([state](bool block) { return state->poll(block); });
    }
    auto op = core->begin_checked(std::move(call));
    if (!op->call.invalid.empty()) core->finish_invalid(op);
    auto state = std::make_shared<checked_request>(core, std::move(op));
    return request([state](bool block) { return state->core->poll(*state->op, block); });
  }

 private:
  struct plain_request {
    plain_request(std::shared_ptr<mpi_core> c, mpi_call m, std::uint64_t n)
        : core(std::move(c)), call(std::move(m)), number(n) {}
    plain_request(const plain_request&) = delete;
    plain_request& operator=(const plain_request&) = delete;
    // Unfinished (after a timeout): MPI may still read the count arrays.
    ~plain_request() {
      if (request != MPI_REQUEST_NULL) keep_forever(std::move(call));
    }
    std::shared_ptr<mpi_core> core;
    mpi_call call;  // owns the count arrays MPI reads until completion
    MPI_Request request = MPI_REQUEST_NULL;
    std::uint64_t number = 0;

    bool poll(bool block) { return core->wait_plain(request, block, call, number); }
  };

  struct checked_request {
    checked_request(std::shared_ptr<mpi_core> c, std::shared_ptr<checked_op> o)
        : core(std::move(c)), op(std::move(o)) {}
    checked_request(const checked_request&) = delete;
    checked_request& operator=(const checked_request&) = delete;
    // The request already waited (and timed out) before it dies unfinished.
    ~checked_request() { core->abandon(op); }
    std::shared_ptr<mpi_core> core;
    std::shared_ptr<checked_op> op;
  };

  // ---- errors -------------------------------------------------------------------------

  void check_code(int code, std::string_view what) const {
    if (code == MPI_SUCCESS) return;
    throw communicator_error(message("zest: ", what, " on axis '", name_, "' (rank ", rank_, " of ",
                                     size_, "): MPI error: ", mpi_error_text(code)));
  }
  void check_code(int code, const mpi_call& call) const { check_code(code, call_name(call.kind)); }

  [[noreturn]] void throw_invalid(const mpi_call& call) const {
    throw communicator_error(message("zest: ", call_name(call.kind), " on axis '", name_,
                                     "' (rank ", rank_, " of ", size_, "): ", call.invalid));
  }

  void ensure_usable(const mpi_call& call) const {
    if (broken_.empty()) return;
    throw communicator_error(message("zest: ", call_name(call.kind), " on axis '", name_,
                                     "' (rank ", rank_, " of ", size_,
                                     "): the communicator is unusable: ", broken_));
  }

  static std::string seconds(watchdog_clock::duration d) {
    std::ostringstream out;
    out << std::fixed << std::setprecision(1) << std::chrono::duration<double>(d).count();
    return out.str();
  }

  // The message of a wait that passed its deadline. Before it is thrown, this rank tells
  // the others which call it is stuck in and listens briefly for theirs (report_), so the
  // message can say which ranks arrived.
  collective_timeout timeout(const mpi_call& call, const fingerprint& f,
                             watchdog_clock::time_point started, std::string_view phase) const {
    const std::string waited = seconds(watchdog_clock::now() - started);
    const std::string others = who_else(f[fp::number]);
    return collective_timeout(
        message("zest: collective timeout on axis '", name_, "': ", describe(f.data()), " on rank ",
                rank_, " of ", size_, " not complete after ", waited, " s", phase, "; called at ",
                site_of(call.where), "; the axis spans world ranks ", rank_list(world_ranks_),
                others, ". ZEST_WATCHDOG_MS sets the deadline (now ",
                checked_mode().watchdog.count(), " ms; 0: none)"));
  }
  collective_timeout timeout(const checked_op& op, watchdog_clock::time_point started,
                             bool exchanging) const {
    return timeout(
        op.call, op.mine, started,
        exchanging ? " (checking the call: some rank of this communicator has not reached it; it "
                     "skipped it or is blocked in another collective)"
                   : " (moving the data: all ranks agreed on the call, but it did not finish)");
  }

  // After a timeout in call #number (or in a check, number | outside_calls): "; ranks 0,2
  // wait in this call too; no word from rank 1
  // (...)", and the first call in which this rank's record differs from a reporting rank's.
  // Reports (schedule_log::report: the call a rank waits in, then its last calls; 3.3 kB,
  // under the eager limits) are sends on report_ that nobody waits for.
  std::string who_else(std::uint64_t number) const {
    if (size_ < 2) return "";
    constexpr std::size_t words = schedule_log::report_words;
    // MPI may read it at any time: kept forever.
    auto* mine = new std::vector<std::uint64_t>(schedule_.report(number));  // NOLINT
    for (std::size_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request sent = MPI_REQUEST_NULL;
      if (MPI_Isend(mine->data(), static_cast<int>(words), MPI_UINT64_T, static_cast<int>(r),
                    report_tag, report_, &sent) == MPI_SUCCESS) {
        MPI_Request_free(&sent);
      }
    }
    std::vector<std::vector<std::uint64_t>> heard(size_);
    heard[rank_] = *mine;
    const auto listen = std::clamp<std::chrono::milliseconds>(
        checked_mode().watchdog / 10, std::chrono::milliseconds(20), std::chrono::seconds(1));
    const auto until = watchdog_clock::now() + listen;
    const auto all_here = [&] {
      for (std::size_t r = 0; r < size_; ++r) {
        if (r != rank_ && (heard[r].empty() || heard[r][0] != number)) return false;
      }
      return true;
    };
    while (!all_here() && watchdog_clock::now() < until) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, report_tag, report_, &flag, &status) != MPI_SUCCESS) break;
      if (flag == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      std::vector<std::uint64_t> report(words);
      if (MPI_Recv(report.data(), static_cast<int>(words), MPI_UINT64_T, status.MPI_SOURCE,
                   report_tag, report_, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        break;
      }
      heard[static_cast<std::size_t>(status.MPI_SOURCE)] = std::move(report);  // the latest wins
    }
    std::vector<int> here, silent;
    std::ostringstream elsewhere;
    for (std::size_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (heard[r].empty()) {
        silent.push_back(static_cast<int>(r));
      } else if (heard[r][0] == number) {
        here.push_back(static_cast<int>(r));
      } else if ((heard[r][0] & outside_calls) != 0) {
        elsewhere << "; rank " << r << " waits in a check of the axis (check_schedule or an "
                  << "agreement) after its " << heard[r][1]
                  << (heard[r][1] == 1 ? " call" : " calls");
      } else {
        elsewhere << "; rank " << r << " waits in call #" << heard[r][0] << " instead";
      }
    }
    std::ostringstream out;
    if (!here.empty()) out << "; ranks " << rank_list(here) << " of the axis wait in this call too";
    out << elsewhere.str();
    if (!silent.empty()) {
      out << "; no word from ranks " << rank_list(silent) << " of the axis within "
          << listen.count()
          << " ms (they skipped this call, are still busy before it, or have stopped)";
    }
    out << schedule_log::first_unmatched(rank_, heard);
    return out.str();
  }

  // Waits for the data transfer of an unchecked call; block=false polls once. Past the
  // deadline the communicator is unusable (the ranks' calls no longer line up): throws.
  bool wait_plain(MPI_Request& pending, bool block, const mpi_call& call, std::uint64_t number) {
    int done = 0;
    check_code(MPI_Test(&pending, &done, MPI_STATUS_IGNORE), call);
    if (done != 0) return true;
    if (!block) return false;
    ensure_usable(call);  // another call timed out: do not wait again for a stuck transfer
    const auto limit = checked_mode().watchdog;
    if (limit.count() == 0) {
      check_code(MPI_Wait(&pending, MPI_STATUS_IGNORE), call);
      return true;
    }
    const auto started = watchdog_clock::now();
    if (wait_until(pending, true, started + limit, call)) return true;
    const fingerprint f = fingerprint_of(call, number);
    broken_ = message(describe(f.data()), " timed out");
    throw timeout(call, f, started, "");
  }

  // ---- accounting ---------------------------------------------------------------------

  // Counts an unchecked call in the statistics and the schedule's record (a checked call
  // enters the record when the ranks agreed on it: decide()).
  void count(const mpi_call& call, std::uint64_t number) {
    schedule_.record(call, number);
    count(call);
  }
  void count(const mpi_call& call) {
    if (call.kind >= collective_kinds) return;
    auto& counter = stats_[static_cast<collective>(call.kind)];
    counter.calls += 1;
    counter.bytes_sent += call.bytes;
  }
  void uncount(checked_op& op) {
    if (!op.counted || op.call.kind >= collective_kinds) return;
    auto& counter = stats_[static_cast<collective>(op.call.kind)];
    counter.calls -= 1;
    counter.bytes_sent -= op.call.bytes;
    op.counted = false;
  }

  // ---- checked mode -------------------------------------------------------------------

  // What this rank calls, as the fingerprint checked mode exchanges (and messages describe).
  fingerprint fingerprint_of(const mpi_call& c, std::uint64_t number) const {
    fingerprint f{};
    f[fp::version] = fp::current_version;
    f[fp::kind] = c.kind;
    f[fp::type] = c.kind == barrier_kind ? 0 : static_cast<std::uint64_t>(c.type);
    f[fp::op_or_root] = c.kind == static_cast<std::uint64_t>(collective::broadcast)
                            ? static_cast<std::uint64_t>(c.root)
                            : static_cast<std::uint64_t>(c.reduction);
    f[fp::axis] = name_hash_;
    f[fp::number] = number;
    f[fp::elements] = c.elements;
    f[fp::counts] = c.counts_key;
    f[fp::invalid] = c.invalid.empty() ? 0 : 1;
    f[fp::pairs_sent] = c.pairs_sent;
    f[fp::pairs_received] = c.pairs_received;
    f[fp::counts_size] = c.counts_shown.size();
    for (std::size_t i = 0; i < fp::shown_counts && i < c.counts_shown.size(); ++i) {
      f[fp::first_count + i] = c.counts_shown[i];
    }
    f[fp::context] = c.context.empty() ? 0 : hash_name(c.context);
    std::string text = "at " + site_of(c.where);
    if (!c.context.empty()) text += " in " + c.context;
    std::memcpy(&f[fp::site], text.data(), std::min(text.size(), fp::site_chars - 1));
    return f;
  }

  std::shared_ptr<checked_op> begin_checked(mpi_call call) {
    auto op = std::make_shared<checked_op>();
    op->call = std::move(call);
    if (const collective_context* context = collective_context::current()) {
      op->call.context = context->text();
    }
    const mpi_call& c = op->call;
    const std::uint64_t number = next_number_++;
    const fingerprint& f = op->mine = fingerprint_of(c, number);
    op->all.resize(size_ * fp::words);
    constexpr int words = static_cast<int>(fp::words);
    check_code(MPI_Iallgather(f.data(), words, MPI_UINT64_T, op->all.data(), words, MPI_UINT64_T,
                              check_, &op->check_request),
               c);
    if (c.invalid.empty()) {
      count(c);
      op->counted = true;
    }
    undecided_.push_back(op);
    return op;
  }

  // This rank's buffers do not fit: still take part in the exchange, so that the other
  // ranks learn it and throw too instead of waiting, then throw the local error.
  [[noreturn]] void finish_invalid(const std::shared_ptr<checked_op>& op) {
    const auto started = watchdog_clock::now();
    try {
      settle(true, started, started + checked_mode().watchdog, op.get());
    } catch (const collective_timeout&) {
      op->abandoned = true;  // the buffer error is the more useful one to report
    }
    throw_invalid(op->call);
  }

  // Drives one checked op; returns whether it is complete. Throws its mismatch, or a timeout.
  bool poll(checked_op& op, bool block) {
    const auto started = watchdog_clock::now();
    const auto deadline = started + checked_mode().watchdog;
    if (op.at == checked_op::stage::checking && !settle(block, started, deadline, &op))
      return false;
    if (op.error) std::rethrow_exception(op.error);
    if (op.at == checked_op::stage::moving) {
      if (!wait_until(op.data_request, block, deadline, op.call)) {
        if (!block) return false;
        broken_ = message("the data transfer of ", describe(op.mine.data()), " timed out");
        throw timeout(op, started, false);
      }
      op.at = checked_op::stage::done;
    }
    return true;
  }

  // Unchecked calls go after every earlier checked call has issued its data transfer.
  void settle_all() {
    if (undecided_.empty()) return;
    const auto started = watchdog_clock::now();
    settle(true, started, started + checked_mode().watchdog, nullptr);
  }

  // Decides the queued checked calls in call order, up to `until` (all when null). False
  // when a non-blocking poll finds an exchange still in flight.
  bool settle(bool block, watchdog_clock::time_point started, watchdog_clock::time_point deadline,
              const checked_op* until) {
    while (!undecided_.empty()) {
      const auto front = undecided_.front();
      if (!wait_until(front->check_request, block, deadline, front->call)) {
        if (!block) return false;
        throw timeout(*front, started, true);
      }
      undecided_.pop_front();
      decide(*front, started, deadline);
      if (front.get() == until) break;
    }
    return true;
  }

  static bool same_call(const std::uint64_t* a, const std::uint64_t* b) {
    for (const std::size_t w : {fp::version, fp::kind, fp::type, fp::op_or_root, fp::axis,
                                fp::number, fp::counts, fp::invalid, fp::context}) {
      if (a[w] != b[w]) return false;
    }
    // all_to_all's element count legitimately differs per rank; its pairs decide instead.
    return a[fp::kind] == static_cast<std::uint64_t>(collective::all_to_all) ||
           a[fp::elements] == b[fp::elements];
  }

  // What a fingerprint says was called, e.g. "all_gather<float>[512] counts {1,3} #3".
  std::string describe(const std::uint64_t* f) const {
    std::ostringstream out;
    const std::uint64_t kind = f[fp::kind];
    out << call_name(kind);
    if (kind != barrier_kind) {
      out << '<' << name_of(static_cast<dtype>(f[fp::type])) << ">[" << f[fp::elements] << ']';
    }
    if (f[fp::counts_size] > 0) {
      out << (kind == static_cast<std::uint64_t>(collective::all_to_all) ? " send_counts {"
                                                                         : " counts {");
      for (std::size_t i = 0; i < f[fp::counts_size] && i < fp::shown_counts; ++i) {
        out << (i == 0 ? "" : ",") << f[fp::first_count + i];
      }
      out << (f[fp::counts_size] > fp::shown_counts ? ",...}" : "}");
    }
    if ((kind == static_cast<std::uint64_t>(collective::all_reduce) ||
         kind == static_cast<std::uint64_t>(collective::reduce_scatter)) &&
        f[fp::op_or_root] != static_cast<std::uint64_t>(reduce_op::sum)) {
      out << ' ' << reduce_op_name(f[fp::op_or_root]);
    }
    if (kind == static_cast<std::uint64_t>(collective::broadcast)) {
      out << " root " << f[fp::op_or_root];
    }
    out << " #" << f[fp::number];
    if (f[fp::axis] != name_hash_) out << " (on an axis with another name)";
    if (f[fp::invalid] != 0) out << " (its buffer sizes are wrong)";
    if (f[fp::version] != fp::current_version) out << " (another zest version)";
    return out.str();
  }

  // Every rank's call, in order; beyond 16 ranks, runs of identical calls are merged.
  std::string mismatch_list(const checked_op& op) const {
    return per_rank(
        size_, [&](std::size_t r) { return describe(&op.all[r * fp::words]); }, false);
  }

  // Where every rank made its call and in which context: "rank 0: at a.cpp:10 in
  // redistribute ...; rank 1: at b.cpp:20" (runs of equal sites merged).
  std::string call_sites(const checked_op& op) const {
    return per_rank(
        size_,
        [&](std::size_t r) {
          const auto* chars = reinterpret_cast<const char*>(&op.all[r * fp::words + fp::site]);
          return std::string(chars, strnlen(chars, fp::site_chars));
        },
        true);
  }

  // all_to_all with the same kind everywhere but counts that do not pair up: exchange the
  // count rows (on the data communicator, whose order every rank shares here) and say which.
  std::string all_to_all_details(const checked_op& op, watchdog_clock::time_point started,
                                 watchdog_clock::time_point deadline) {
    const std::size_t n = size_;
    std::vector<std::uint64_t> rows(2 * n, 0), all_rows(2 * n * n, 0);
    std::copy(op.call.send_row.begin(), op.call.send_row.end(), rows.begin());
    std::copy(op.call.recv_row.begin(), op.call.recv_row.end(),
              rows.begin() + static_cast<std::ptrdiff_t>(n));
    MPI_Request exchange = MPI_REQUEST_NULL;
    check_code(MPI_Iallgather(rows.data(), static_cast<int>(2 * n), MPI_UINT64_T, all_rows.data(),
                              static_cast<int>(2 * n), MPI_UINT64_T, data_, &exchange),
               op.call);
    if (!wait_until(exchange, true, deadline, op.call)) {
      keep_forever(std::move(rows));  // MPI may still read or write them
      keep_forever(std::move(all_rows));
      broken_ = "an all_to_all count check timed out";
      throw timeout(op, started, true);
    }
    return describe_count_pairing(all_rows, n);
  }

  void decide(checked_op& op, watchdog_clock::time_point started,
              watchdog_clock::time_point deadline) {
    const std::uint64_t* first = op.all.data();
    bool agree = true;
    std::uint64_t sent = 0, received = 0;
    for (std::size_t r = 0; r < size_; ++r) {
      const std::uint64_t* f = &op.all[r * fp::words];
      agree = agree && same_call(first, f);
      sent += f[fp::pairs_sent];
      received += f[fp::pairs_received];
    }
    const auto fail = [&](std::exception_ptr error) {
      op.at = checked_op::stage::failed;
      op.error = std::move(error);
      uncount(op);
    };
    const std::string prefix = message("zest: collective mismatch on axis '", name_, "': ");
    const std::string_view hint =
        " (all ranks of a communicator must make the same collective calls in the same order)";
    if (!agree) {
      fail(std::make_exception_ptr(collective_mismatch(
          message(prefix, mismatch_list(op), hint, "; called ", call_sites(op)))));
    } else if (first[fp::kind] == static_cast<std::uint64_t>(collective::all_to_all) &&
               first[fp::invalid] == 0 && sent != received) {
      fail(std::make_exception_ptr(collective_mismatch(
          message(prefix, describe(op.mine.data()), ": send and receive counts do not pair up: ",
                  all_to_all_details(op, started, deadline)))));
    } else if (!op.call.invalid.empty()) {
      // Every rank's buffers are wrong: each reports its own.
      fail(std::make_exception_ptr(communicator_error(message(
          "zest: ", call_name(op.call.kind), " on axis '", name_, "': ", op.call.invalid))));
    } else if (!broken_.empty()) {
      // Data transfers no longer line up across ranks; moving more would pair wrong calls.
      fail(std::make_exception_ptr(communicator_error(
          message("zest: ", call_name(op.call.kind), " on axis '", name_, "' (rank ", rank_, " of ",
                  size_, "): the communicator is unusable: ", broken_))));
    } else if (op.abandoned) {
      // The others will move data for this call, but our caller gave up and its buffers are gone.
      broken_ = message("rank ", rank_, " gave up on ", describe(op.mine.data()),
                        " after a collective_timeout, and the other ranks reached it later");
      fail(std::make_exception_ptr(communicator_error(broken_)));
    } else {
      check_code(start_call(op.call, data_, &op.data_request), op.call);
      schedule_.record(op.call, op.mine[fp::number]);
      op.at = checked_op::stage::moving;
    }
  }

  // Nobody will wait for op any more.
  void abandon(const std::shared_ptr<checked_op>& op) {
    if (op->at == checked_op::stage::checking) {
      op->abandoned = true;  // still queued: decided in order, without moving data
    } else if (op->at == checked_op::stage::moving) {
      int done = 0;
      MPI_Test(&op->data_request, &done, MPI_STATUS_IGNORE);
      if (done != 0) return;
      stranded_.push_back(op);
      if (broken_.empty()) {
        broken_ = message(describe(op->mine.data()), " was abandoned while moving data");
      }
    }
  }

  // Polls pending until done or the deadline, pausing between polls as core/backoff.hpp
  // says (ranks may outnumber cores: a rank that spins keeps the core from its peers).
  static std::string schedule_check_name(std::string_view where) {
    return where.empty() ? std::string("check_schedule") : message("check_schedule at ", where);
  }

  // An all-gather of `words` words per rank on the check communicator, within the watchdog's
  // deadline (a schedule check).
  void exchange(const std::uint64_t* mine, std::size_t words, std::vector<std::uint64_t>& all,
                const mpi_call& call, std::string_view what) {
    MPI_Request pending = MPI_REQUEST_NULL;
    const int n = static_cast<int>(words);
    check_code(MPI_Iallgather(mine, n, MPI_UINT64_T, all.data(), n, MPI_UINT64_T, check_, &pending),
               what);
    const auto started = watchdog_clock::now();
    const auto limit = checked_mode().watchdog;
    const auto deadline = limit.count() == 0 ? watchdog_clock::time_point::max() : started + limit;
    if (wait_until(pending, true, deadline, call)) return;
    // MPI may still read and write the buffers: they are never freed.
    keep_forever(std::vector<std::uint64_t>(mine, mine + words));
    keep_forever(std::move(all));
    broken_ = message(what, " timed out");
    throw collective_timeout(
        message("zest: collective timeout on axis '", name_, "': ", what, " on rank ", rank_,
                " of ", size_, " not complete after ", seconds(watchdog_clock::now() - started),
                " s (some rank of the axis has not reached it: it "
                "is blocked in a collective the others did not issue, or has stopped); called at ",
                site_of(call.where), "; the axis spans world ranks ", rank_list(world_ranks_),
                who_else(schedule_.calls() | outside_calls),
                ". ZEST_WATCHDOG_MS sets the deadline (now ", limit.count(), " ms; 0: none)"));
  }

  // The schedules differ: every rank sends the calls it remembers (the same on every rank
  // from here: one verdict), and the message names the first call that differs.
  [[noreturn]] void throw_schedule_mismatch(std::string_view where, const source_site& at,
                                            const std::vector<std::uint64_t>& totals) {
    mpi_call call;
    call.kind = barrier_kind;
    call.where = at;
    const std::string detail =
        schedule_.first_difference(size_, totals, [&](const std::vector<std::uint64_t>& mine) {
          std::vector<std::uint64_t> all(size_ * mine.size());
          exchange(mine.data(), mine.size(), all, call, schedule_check_name(where));
          return all;
        });
    schedule_registry::instance().exclude(registered_);  // reported: not again at the end
    throw collective_mismatch(schedule_mismatch_message(name_, where, at, detail));
  }

  bool wait_until(MPI_Request& pending, bool block, watchdog_clock::time_point deadline,
                  const mpi_call& call) const {
    backoff pause;
    for (unsigned polls = 0;; ++polls) {
      int done = 0;
      check_code(MPI_Test(&pending, &done, MPI_STATUS_IGNORE), call);
      if (done != 0) return true;
      if (!block) return false;
      if (polls >= backoff::spins && watchdog_clock::now() >= deadline) return false;
      pause();
    }
  }

  MPI_Comm data_ = MPI_COMM_NULL;
  MPI_Comm check_ = MPI_COMM_NULL;
  MPI_Comm report_ = MPI_COMM_NULL;  // where a timed-out rank says which call it is stuck in
  static constexpr int report_tag = 0x7a;
  // In a report, the flag of a rank that waits in a check (check_schedule, exchange_words)
  // rather than in a call: the word then holds its call count.
  static constexpr std::uint64_t outside_calls = std::uint64_t{1} << 63U;
  std::vector<int> world_ranks_;  // world rank of each rank of this communicator
  std::string name_;
  std::uint64_t name_hash_ = 0;
  std::size_t size_ = 1;
  std::size_t rank_ = 0;
  comm_stats stats_;
  std::uint64_t next_number_ = 0;
  std::optional<bool> checked_override_;
  schedule_log schedule_;
  std::deque<std::shared_ptr<checked_op>> undecided_;  // checked calls in order, exchange pending
  std::vector<std::shared_ptr<checked_op>> stranded_;  // abandoned with data in flight
  std::string broken_;          // why the communicator is unusable; empty while it is fine
  std::size_t registered_ = 0;  // its index in schedule_registry
};

}  // namespace detail
}  // namespace zest
