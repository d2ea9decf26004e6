// Tests of zest::local_communicator: one rank, no MPI. Collectives copy, counters count calls
// with zero bytes (the model at n = 1), and wrong buffer sizes throw like mpi_communicator's.
#include "zest/comm/local_communicator.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using zest::collective;
using zest::reduce_op;

template <class T>
std::vector<T> iota_of(std::size_t n, int first) {
  std::vector<T> v;
  for (std::size_t i = 0; i < n; ++i)
    v.push_back(static_cast<T>(static_cast<float>(first + static_cast<int>(i))));
  return v;
}

std::string error_of(auto call) {
  try {
    call();
  } catch (const zest::communicator_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

static_assert(zest::communicator<zest::local_communicator>);

TEST_CASE("local_communicator: one rank with a name") {
  const zest::local_communicator plain;
  CHECK(plain.size() == 1);
  CHECK(plain.rank() == 0);
  CHECK(plain.name() == "local");
  const zest::local_communicator named("dp");
  CHECK(named.name() == "dp");
}

TEST_CASE_TEMPLATE("local_communicator: collectives are copies", T, float, double, zest::bfloat16,
                   std::int32_t, std::int64_t, std::uint8_t, std::uint16_t) {
  zest::local_communicator comm("axis");
  const auto send = iota_of<T>(5, 1);
  const std::vector<std::size_t> counts{5};

  for (const bool nonblocking : {false, true}) {
    INFO((nonblocking ? "non-blocking" : "blocking"));
    comm.reset_stats();
    std::vector<T> recv(5, T{});
    if (nonblocking) comm.iall_gather(std::span<const T>(send), std::span<T>(recv)).wait();
    else comm.all_gather(std::span<const T>(send), std::span<T>(recv));
    CHECK(recv == send);

    recv.assign(5, T{});
    if (nonblocking)
      CHECK(comm.ireduce_scatter(std::span<const T>(send), std::span<T>(recv), counts).test());
    else comm.reduce_scatter(std::span<const T>(send), std::span<T>(recv), counts, reduce_op::max);
    CHECK(recv == send);

    auto inout = send;
    if (nonblocking) comm.iall_reduce(std::span<T>(inout), reduce_op::min).wait();
    else comm.all_reduce(std::span<T>(inout));
    CHECK(inout == send);

    recv.assign(5, T{});
    if (nonblocking)
      comm.iall_to_all(std::span<const T>(send), counts, std::span<T>(recv), counts).wait();
    else comm.all_to_all(std::span<const T>(send), {}, std::span<T>(recv), {});
    CHECK(recv == send);

    if (nonblocking) comm.ibroadcast(std::span<T>(inout), 0).wait();
    else comm.broadcast(std::span<T>(inout), 0);
    CHECK(inout == send);
    comm.barrier();

    const auto& s = comm.stats();
    for (const auto kind :
         {collective::all_gather, collective::reduce_scatter, collective::all_reduce,
          collective::all_to_all, collective::broadcast}) {
      CHECK(s[kind].calls == 1);
    }
    CHECK(s.bytes_sent() == 0);
  }
  comm.reset_stats();
  CHECK(comm.stats().calls() == 0);
}

TEST_CASE("local_communicator: send and recv may be the same buffer, and may be empty") {
  zest::local_communicator comm;
  std::vector<float> v{1, 2, 3};
  comm.all_gather(std::span<const float>(v), std::span<float>(v));
  CHECK(v == std::vector<float>{1, 2, 3});
  std::vector<float> empty;
  comm.all_gather(std::span<const float>(empty), std::span<float>(empty));
  comm.all_reduce(std::span<float>(empty));
  CHECK(comm.stats().calls() == 3);
}

TEST_CASE("local_communicator: wrong sizes throw communicator_error naming op, axis and sizes") {
  zest::local_communicator comm("tp");
  std::vector<float> three(3), four(4);
  std::string what =
      error_of([&] { comm.all_gather(std::span<const float>(three), std::span<float>(four)); });
  CHECK(what ==
        "zest: all_gather on axis 'tp' (rank 0 of 1): recv buffer has 4 elements, expected 3");
  const std::vector<std::size_t> two_counts{2, 1};
  what = error_of([&] {
    comm.reduce_scatter(std::span<const float>(three), std::span<float>(three), two_counts);
  });
  CHECK(what ==
        "zest: reduce_scatter on axis 'tp' (rank 0 of 1): counts has 2 entries, expected one per "
        "rank (1)");
  const std::vector<std::size_t> wrong{4};
  what = error_of(
      [&] { comm.all_to_all(std::span<const float>(three), wrong, std::span<float>(three), {}); });
  CHECK(what ==
        "zest: all_to_all on axis 'tp' (rank 0 of 1): send_counts[0] = 4, but the send buffer's "
        "size is 3");
  what = error_of([&] { comm.broadcast(std::span<float>(three), 1); });
  CHECK(what ==
        "zest: broadcast on axis 'tp' (rank 0 of 1): root 1 is not a rank of this communicator "
        "(size 1)");
  CHECK(comm.stats().calls() == 0);
}
