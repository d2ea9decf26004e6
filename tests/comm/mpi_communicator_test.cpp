// Tests of zest::mpi_communicator: every collective, blocking and non-blocking, every element
// type, even and uneven counts (some ranks with zero), checked mode on and off, byte counters
// against communicator.hpp's model, and buffer-size errors. Runs at any number of ranks.
//
// Values are small non-negative integers, exact in every element type (uint8_t and bfloat16
// included), made from the rank and the index, so every rank computes the expected result
// on its own, in closed form, without communicating.
#include "zest/comm/mpi_communicator.hpp"
#include "zest/comm/detail/mpi_comms.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace {

using zest::collective;
using zest::reduce_op;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

template <class T>
T make(long v) {
  if constexpr (std::is_same_v<T, zest::bfloat16>) return zest::bfloat16(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <class T>
long value_of(T x) {
  if constexpr (std::is_same_v<T, zest::bfloat16>) return static_cast<long>(static_cast<float>(x));
  else return static_cast<long>(x);
}

// Counts how many elements differ from expected(i); reports the first one.
template <class T, class Expected>
std::size_t count_wrong(const std::vector<T>& got, Expected expected, std::string& first) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const long want = expected(i);
    if (value_of(got[i]) != want) {
      if (wrong++ == 0) {
        first = "element " + std::to_string(i) + ": got " + std::to_string(value_of(got[i])) +
                ", expected " + std::to_string(want);
      }
    }
  }
  return wrong;
}

// CHECK_ALL(vector, expected-of-index lambda): one assertion per vector, not per element.
#define CHECK_ALL(got, ...)                                               \
  do {                                                                    \
    std::string first_wrong;                                              \
    const std::size_t wrong = count_wrong(got, __VA_ARGS__, first_wrong); \
    INFO(first_wrong);                                                    \
    CHECK(wrong == 0);                                                    \
  } while (false)

// Rank r's chunk of `total` split into n: the model's balanced split.
std::size_t balanced_chunk(std::size_t total, std::size_t n, std::size_t r) {
  return total / n + (r < total % n ? 1 : 0);
}

// Count layouts every collective is tried with. Empty: equal chunks. The uneven one gives
// some ranks nothing: {2}, {2,0}, {2,0,4,5}, ...
std::vector<std::vector<std::size_t>> count_layouts(std::size_t n) {
  std::vector<std::size_t> uneven(n), equal(n, 3);
  for (std::size_t r = 0; r < n; ++r) uneven[r] = r % 3 == 1 ? 0 : r + 2;
  return {{}, uneven, equal};
}

std::vector<std::size_t> offsets_of(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> offsets(counts.size(), 0);
  std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), std::size_t{0});
  return offsets;
}

std::string mode_name(bool checked, bool nonblocking) {
  return std::string(checked ? "checked" : "unchecked") +
         (nonblocking ? ", non-blocking" : ", blocking");
}

// Runs body(checked, nonblocking) in the four combinations.
template <class Body>
void in_every_mode(zest::mpi_communicator& comm, Body body) {
  for (const bool checked : {false, true}) {
    comm.set_checked(checked);
    for (const bool nonblocking : {false, true}) {
      INFO(mode_name(checked, nonblocking));
      body(nonblocking);
    }
  }
}

zest::collective_counter delta(const zest::comm_stats& after, const zest::comm_stats& before,
                               collective kind) {
  return (after - before)[kind];
}

}  // namespace

TEST_CASE("mpi_communicator: basic properties") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "world");
  CHECK(comm.size() == world_size());
  CHECK(comm.rank() == world_rank());
  CHECK(comm.name() == "world");
  CHECK(comm.stats().calls() == 0);
  int relation = MPI_UNEQUAL;
  MPI_Comm_compare(comm.native(), MPI_COMM_WORLD, &relation);
  CHECK(relation == MPI_CONGRUENT);  // a duplicate, not the world itself

  comm.set_checked(false);
  CHECK_FALSE(comm.checked());
  comm.set_checked(true);
  CHECK(comm.checked());
  comm.set_checked(std::nullopt);
  CHECK(comm.checked() == zest::checked_mode().enabled);

  // Moving keeps the communicator working; the moved-to object owns the duplicates.
  zest::mpi_communicator moved(std::move(comm));
  std::vector<int> one{1};
  moved.all_reduce(std::span<int>(one));
  CHECK(one[0] == world_size());
  zest::mpi_communicator assigned(MPI_COMM_SELF, "self");
  assigned = std::move(moved);
  CHECK(assigned.size() == world_size());
  CHECK(assigned.stats()[collective::all_reduce].calls == 1);
  static_assert(!std::is_copy_constructible_v<zest::mpi_communicator>);
}

TEST_CASE_TEMPLATE("mpi_communicator: all_gather", T, float, double, zest::bfloat16, std::int32_t,
                   std::int64_t, std::uint8_t, std::uint16_t) {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "gather");
  const std::size_t n = comm.size(), me = comm.rank();
  const auto value = [](std::size_t r, std::size_t i) {
    return static_cast<long>((r * 7 + i * 3) % 50 + 1);
  };
  for (const auto& counts : count_layouts(n)) {
    INFO("counts: " << (counts.empty() ? std::string("equal")
                                       : std::to_string(counts.size()) + " given"));
    const std::vector<std::size_t> per_rank =
        counts.empty() ? std::vector<std::size_t>(n, 5) : counts;
    const auto offsets = offsets_of(per_rank);
    const std::size_t total = std::accumulate(per_rank.begin(), per_rank.end(), std::size_t{0});
    in_every_mode(comm, [&](bool nonblocking) {
      std::vector<T> send(per_rank[me]), recv(total, make<T>(99));
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = make<T>(value(me, i));
      const auto before = comm.stats();
      if (nonblocking) {
        zest::request r = comm.iall_gather(std::span<const T>(send), std::span<T>(recv), counts);
        r.wait();
      } else {
        comm.all_gather(std::span<const T>(send), std::span<T>(recv), counts);
      }
      std::vector<long> expected(total);
      for (std::size_t r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < per_rank[r]; ++i) expected[offsets[r] + i] = value(r, i);
      }
      CHECK_ALL(recv, [&](std::size_t i) { return expected[i]; });
      const auto d = delta(comm.stats(), before, collective::all_gather);
      CHECK(d.calls == 1);
      CHECK(d.bytes_sent == (n - 1) * per_rank[me] * sizeof(T));
    });
  }
}

TEST_CASE_TEMPLATE("mpi_communicator: reduce_scatter", T, float, double, zest::bfloat16,
                   std::int32_t, std::int64_t, std::uint8_t, std::uint16_t) {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "scatter");
  const std::size_t n = comm.size(), me = comm.rank();
  // Rank r holds (r+1) + k%5 at global index k: sum n(n+1)/2 + n(k%5), max n + k%5, min 1 + k%5.
  for (const auto& counts : count_layouts(n)) {
    const std::vector<std::size_t> per_rank =
        counts.empty() ? std::vector<std::size_t>(n, 4) : counts;
    const auto offsets = offsets_of(per_rank);
    const std::size_t total = std::accumulate(per_rank.begin(), per_rank.end(), std::size_t{0});
    for (const reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
      INFO("op " << static_cast<int>(op) << ", counts " << (counts.empty() ? "equal" : "given"));
      in_every_mode(comm, [&](bool nonblocking) {
        std::vector<T> send(total), recv(per_rank[me], make<T>(99));
        for (std::size_t k = 0; k < total; ++k)
          send[k] = make<T>(static_cast<long>(me + 1 + k % 5));
        const auto before = comm.stats();
        if (nonblocking) {
          auto r = comm.ireduce_scatter(std::span<const T>(send), std::span<T>(recv), counts, op);
          r.wait();
        } else {
          comm.reduce_scatter(std::span<const T>(send), std::span<T>(recv), counts, op);
        }
        const auto nl = static_cast<long>(n);
        CHECK_ALL(recv, [&](std::size_t i) {
          const auto m = static_cast<long>((offsets[me] + i) % 5);
          return op == reduce_op::sum   ? nl * (nl + 1) / 2 + nl * m
                 : op == reduce_op::max ? nl + m
                                        : 1 + m;
        });
        const auto d = delta(comm.stats(), before, collective::reduce_scatter);
        CHECK(d.calls == 1);
        CHECK(d.bytes_sent == (total - per_rank[me]) * sizeof(T));
      });
    }
  }
}

TEST_CASE_TEMPLATE("mpi_communicator: all_reduce", T, float, double, zest::bfloat16, std::int32_t,
                   std::int64_t, std::uint8_t, std::uint16_t) {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "reduce");
  const std::size_t n = comm.size(), me = comm.rank();
  for (const std::size_t total :
       {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1000}}) {
    for (const reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
      INFO("size " << total << ", op " << static_cast<int>(op));
      in_every_mode(comm, [&](bool nonblocking) {
        std::vector<T> data(total);
        for (std::size_t i = 0; i < total; ++i)
          data[i] = make<T>(static_cast<long>(me + 1 + i % 7));
        const auto before = comm.stats();
        if (nonblocking) {
          auto r = comm.iall_reduce(std::span<T>(data), op);
          while (!r.test()) {
          }
        } else {
          comm.all_reduce(std::span<T>(data), op);
        }
        const auto nl = static_cast<long>(n);
        CHECK_ALL(data, [&](std::size_t i) {
          const auto m = static_cast<long>(i % 7);
          return op == reduce_op::sum   ? nl * (nl + 1) / 2 + nl * m
                 : op == reduce_op::max ? nl + m
                                        : 1 + m;
        });
        const auto d = delta(comm.stats(), before, collective::all_reduce);
        CHECK(d.calls == 1);
        CHECK(d.bytes_sent == 2 * (total - balanced_chunk(total, n, me)) * sizeof(T));
      });
    }
  }
}

TEST_CASE_TEMPLATE("mpi_communicator: all_to_all", T, float, double, zest::bfloat16, std::int32_t,
                   std::int64_t, std::uint8_t, std::uint16_t) {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "exchange");
  const std::size_t n = comm.size(), me = comm.rank();
  // Rank r sends sent(r, j) elements to rank j (some zero), element i worth value(r, j, i).
  const auto sent = [](std::size_t r, std::size_t j) { return (r + 2 * j + 1) % 4; };
  const auto value = [](std::size_t r, std::size_t j, std::size_t i) {
    return static_cast<long>((r * 11 + j * 5 + i) % 60 + 1);
  };
  for (const bool given : {false, true}) {
    std::vector<std::size_t> send_counts(n, 3), recv_counts(n, 3);
    if (given) {
      for (std::size_t j = 0; j < n; ++j) {
        send_counts[j] = sent(me, j);
        recv_counts[j] = sent(j, me);
      }
    }
    const auto send_offsets = offsets_of(send_counts), recv_offsets = offsets_of(recv_counts);
    const std::size_t send_total =
        std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
    const std::size_t recv_total =
        std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
    const std::vector<std::size_t> no_counts;
    const std::vector<std::size_t>& sc = given ? send_counts : no_counts;
    const std::vector<std::size_t>& rc = given ? recv_counts : no_counts;
    INFO("counts " << (given ? "given" : "equal"));
    in_every_mode(comm, [&](bool nonblocking) {
      std::vector<T> send(send_total), recv(recv_total, make<T>(99));
      for (std::size_t j = 0; j < n; ++j) {
        for (std::size_t i = 0; i < send_counts[j]; ++i)
          send[send_offsets[j] + i] = make<T>(value(me, j, i));
      }
      const auto before = comm.stats();
      if (nonblocking) {
        auto r = comm.iall_to_all(std::span<const T>(send), sc, std::span<T>(recv), rc);
        r.wait();
      } else {
        comm.all_to_all(std::span<const T>(send), sc, std::span<T>(recv), rc);
      }
      std::vector<long> expected(recv_total);
      for (std::size_t j = 0; j < n; ++j) {
        for (std::size_t i = 0; i < recv_counts[j]; ++i)
          expected[recv_offsets[j] + i] = value(j, me, i);
      }
      CHECK_ALL(recv, [&](std::size_t i) { return expected[i]; });
      std::size_t bytes = 0;
      for (std::size_t j = 0; j < n; ++j) bytes += j == me ? 0 : send_counts[j] * sizeof(T);
      const auto d = delta(comm.stats(), before, collective::all_to_all);
      CHECK(d.calls == 1);
      CHECK(d.bytes_sent == bytes);
    });
  }
}

TEST_CASE_TEMPLATE("mpi_communicator: broadcast", T, float, double, zest::bfloat16, std::int32_t,
                   std::int64_t, std::uint8_t, std::uint16_t) {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "bcast");
  const std::size_t n = comm.size(), me = comm.rank();
  for (const std::size_t total : {std::size_t{0}, std::size_t{17}}) {
    for (std::size_t root = 0; root < n; ++root) {
      INFO("size " << total << ", root " << root);
      in_every_mode(comm, [&](bool nonblocking) {
        const auto value = [&](std::size_t i) {
          return static_cast<long>((i * 3 + root) % 40 + 1);
        };
        std::vector<T> data(total, make<T>(0));
        if (me == root) {
          for (std::size_t i = 0; i < total; ++i) data[i] = make<T>(value(i));
        }
        const auto before = comm.stats();
        if (nonblocking) {
          auto r = comm.ibroadcast(std::span<T>(data), static_cast<int>(root));
          r.wait();
        } else {
          comm.broadcast(std::span<T>(data), static_cast<int>(root));
        }
        CHECK_ALL(data, value);
        // Pipelined ring: all but the rank just before the root forward the whole buffer.
        const bool last = n > 1 && me == (root + n - 1) % n;
        const std::size_t bytes = (n == 1 || last) ? 0 : total * sizeof(T);
        const auto d = delta(comm.stats(), before, collective::broadcast);
        CHECK(d.calls == 1);
        CHECK(d.bytes_sent == bytes);
      });
    }
  }
}

TEST_CASE("mpi_communicator: barrier and several requests in flight, waited out of order") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "flight");
  const std::size_t n = comm.size(), me = comm.rank();
  const auto nl = static_cast<long>(n);
  for (const bool checked : {false, true}) {
    INFO((checked ? "checked" : "unchecked"));
    comm.set_checked(checked);
    comm.barrier();
    std::vector<double> sum(6, static_cast<double>(me + 1));
    std::vector<std::int32_t> mine{static_cast<std::int32_t>(me)}, everyone(n, -1);
    std::vector<float> from_root(5, me == 0 ? 7.0F : 0.0F);
    auto a = comm.iall_reduce(std::span<double>(sum));
    auto b =
        comm.iall_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(everyone));
    auto c = comm.ibroadcast(std::span<float>(from_root), 0);
    comm.barrier();  // a blocking call behind three non-blocking ones
    c.wait();
    b.wait();
    a.wait();
    CHECK_ALL(sum, [&](std::size_t) { return nl * (nl + 1) / 2; });
    CHECK_ALL(everyone, [](std::size_t i) { return static_cast<long>(i); });
    CHECK_ALL(from_root, [](std::size_t) { return 7L; });
    // A request dropped unwaited completes in its destructor.
    { auto dropped = comm.iall_reduce(std::span<double>(sum)); }
    CHECK_ALL(sum, [&](std::size_t) { return nl * nl * (nl + 1) / 2; });
  }
}

TEST_CASE("mpi_communicator: counters follow the model and reset") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "stats");
  const std::size_t n = comm.size(), me = comm.rank();
  std::vector<float> shard(8), full(8 * n);
  comm.all_gather(std::span<const float>(shard), std::span<float>(full));
  comm.reduce_scatter(std::span<const float>(full), std::span<float>(shard));
  comm.all_reduce(std::span<float>(full));
  comm.barrier();
  const auto& s = comm.stats();
  CHECK(s.calls() == 3);  // barrier moves no data and is not a collective kind
  CHECK(s[collective::all_gather].bytes_sent == (n - 1) * 8 * sizeof(float));
  CHECK(s[collective::reduce_scatter].bytes_sent == (n - 1) * 8 * sizeof(float));
  CHECK(s[collective::all_reduce].bytes_sent ==
        2 * (8 * n - balanced_chunk(8 * n, n, me)) * sizeof(float));
  comm.reset_stats();
  CHECK(comm.stats().calls() == 0);
  CHECK(comm.stats().bytes_sent() == 0);
}

TEST_CASE(
    "mpi_communicator: wrong buffer sizes throw communicator_error naming op, axis and sizes") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "sizes");
  const std::size_t n = comm.size(), me = comm.rank();
  const auto expect_error = [&](auto call, std::string_view op, std::string_view detail) {
    std::string what;
    try {
      call();
    } catch (const zest::communicator_error& e) {
      what = e.what();
    }
    INFO(what);
    CHECK(what.find(std::string("zest: ") + std::string(op)) == 0);
    CHECK(what.find("axis 'sizes'") != std::string::npos);
    CHECK(what.find(detail) != std::string::npos);
  };
  // Every rank makes the same mistake, so every rank throws and none is left waiting.
  for (const bool checked : {false, true}) {
    INFO((checked ? "checked" : "unchecked"));
    comm.set_checked(checked);
    std::vector<float> four(4), wrong(4 * n + 1), big(4 * n);
    expect_error([&] { comm.all_gather(std::span<const float>(four), std::span<float>(wrong)); },
                 "all_gather",
                 "recv buffer has " + std::to_string(4 * n + 1) + " elements, expected " +
                     std::to_string(4 * n));
    expect_error(
        [&] { comm.reduce_scatter(std::span<const float>(wrong), std::span<float>(four)); },
        "reduce_scatter", "send buffer has " + std::to_string(4 * n + 1) + " elements");
    const std::vector<std::size_t> short_counts(n + 1, 4);
    expect_error(
        [&] { comm.all_gather(std::span<const float>(four), std::span<float>(big), short_counts); },
        "all_gather", "counts has " + std::to_string(n + 1) + " entries");
    std::vector<std::size_t> mine_wrong(n, 4);
    mine_wrong[me] = 3;
    expect_error(
        [&] {
          comm.reduce_scatter(std::span<const float>(big), std::span<float>(four), mine_wrong);
        },
        "reduce_scatter", "counts[" + std::to_string(me) + "] = 3");
    std::vector<float> odd(4 * n + 1), odd_recv(4 * n + 1);
    if (n > 1) {
      expect_error(
          [&] { comm.all_to_all(std::span<const float>(odd), {}, std::span<float>(odd_recv), {}); },
          "all_to_all", "not divisible into " + std::to_string(n));
    }
    expect_error([&] { comm.broadcast(std::span<float>(four), static_cast<int>(n)); }, "broadcast",
                 "root " + std::to_string(n) + " is not a rank");
    // Counts beyond INT_MAX are refused before anything is sent (no buffer that big needed).
    std::vector<std::size_t> huge(n, 1);
    huge[0] = std::size_t{INT_MAX} + 1;
    std::vector<float> one(me == 0 ? 0 : 1);
    expect_error([&] { comm.all_gather(std::span<const float>(one), std::span<float>(big), huge); },
                 "all_gather", "exceeds INT_MAX");
    // The communicator is still in step afterwards.
    std::vector<int> x{1};
    comm.all_reduce(std::span<int>(x));
    CHECK(x[0] == static_cast<int>(n));
  }
  CHECK(comm.stats()[collective::all_gather].calls == 0);  // refused calls are not counted
}

// comm/detail/mpi_comms.hpp: the communicators every mpi_communicator and mesh are made of.
TEST_CASE("communicators are duplicated and made from groups; MPI's errors come back as codes") {
  namespace d = zest::detail;
  const int n = world_size(), me = world_rank();
  std::array<MPI_Comm, 3> dups{};
  REQUIRE(d::duplicate_politely(MPI_COMM_WORLD, dups) == MPI_SUCCESS);
  for (MPI_Comm& c : dups) {
    int same = MPI_UNEQUAL;
    MPI_Comm_compare(MPI_COMM_WORLD, c, &same);
    CHECK(same == MPI_CONGRUENT);
    MPI_Comm_free(&c);
  }

  // The ranks of my parity, last first: member k becomes rank k.
  std::vector<int> members;
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == me % 2) members.push_back(r);
  }
  {
    d::owned_comm sub;
    REQUIRE(d::group_communicator(MPI_COMM_WORLD, members, 7, &sub.comm) == MPI_SUCCESS);
    int size = 0, rank = -1;
    MPI_Comm_size(sub.comm, &size);
    MPI_Comm_rank(sub.comm, &rank);
    CHECK(size == static_cast<int>(members.size()));
    REQUIRE(rank >= 0);
    CHECK(members[static_cast<std::size_t>(rank)] == me);
    int sum = me;
    MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_INT, MPI_SUM, sub.comm);
    CHECK(sum == std::accumulate(members.begin(), members.end(), 0));
  }  // freed here

  // Errors: with MPI_ERRORS_RETURN they come back as codes, and nothing is left behind.
  MPI_Errhandler world_handler = MPI_ERRHANDLER_NULL, self_handler = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world_handler);
  MPI_Comm_get_errhandler(MPI_COMM_SELF, &self_handler);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  dups.fill(MPI_COMM_WORLD);  // not a communicator it may leave behind
  const int dup_code = d::duplicate_politely(MPI_COMM_NULL, dups);
  CHECK(dup_code != MPI_SUCCESS);
  for (MPI_Comm c : dups) CHECK(c == MPI_COMM_NULL);
  const std::vector<int> outside{n};  // no such rank
  MPI_Comm bad = MPI_COMM_WORLD;
  const int group_code = d::group_communicator(MPI_COMM_WORLD, outside, 0, &bad);
  CHECK(group_code != MPI_SUCCESS);
  CHECK(bad == MPI_COMM_NULL);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, world_handler);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, self_handler);
  MPI_Errhandler_free(&world_handler);
  MPI_Errhandler_free(&self_handler);
  for (const int code : {dup_code, group_code}) {
    const std::string text = d::mpi_error_text(code);
    INFO(text);
    CHECK(!text.empty());
    CHECK(text != "unknown MPI error");
  }
}
