// zest::nccl_communicator at any world size (one GPU per rank): every collective, blocking
// and not, every element type, even and uneven counts (some zero), byte counters against
// communicator.hpp's ring model, host memory through MPI, and checked mode turning
// mismatches and bad sizes into errors on every rank.
//
// Values are small non-negative integers made from the rank and the index, exact in every
// element type, so each rank computes the expected result in closed form.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "cuda/gpu_test.hpp"
#include "support/mpi_test.hpp"
#include "zest/backend/cuda/cuda_backend.hpp"
#include "zest/comm/nccl_communicator.hpp"
#include "zest/mesh/cuda_mesh.hpp"

namespace {

using zest::collective;
using zest::device_buffer;
using zest::nccl_communicator;
using zest::reduce_op;
using bf16 = zest::bfloat16;

// One communicator over the world for the whole binary (NCCL's init is the slow part),
// destroyed before MPI_Finalize.
nccl_communicator& world_comm() {
  static nccl_communicator* c = [] {
    auto* made =
        new nccl_communicator(MPI_COMM_WORLD, "world");  // NOLINT(cppcoreguidelines-owning-memory)
    zest::testing::before_finalize(
        [made] { delete made; });  // NOLINT(cppcoreguidelines-owning-memory)
    return made;
  }();
  return *c;
}

template <class T>
device_buffer<T> to_device(const std::vector<T>& v) {
  return zest::cuda_backend::from_host<T>(std::span<const T>(v));
}
template <class T>
std::vector<T> to_host(const device_buffer<T>& b) {
  std::vector<T> out(b.size());
  zest::cuda_backend::to_host<T>(b.span(), out.data());
  return out;
}
template <class T>
T make(long v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <class T>
long value_of(T x) {
  if constexpr (std::is_same_v<T, bf16>) return static_cast<long>(static_cast<float>(x));
  else return static_cast<long>(x);
}
template <class T, class F>
std::vector<T> make_vector(std::size_t n, F f) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = make<T>(f(i));
  return v;
}
template <class T, class F>
bool all_match(const std::vector<T>& got, F expected) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (value_of(got[i]) != expected(i)) return false;
  }
  return true;
}

template <class T>
void check_all_gather(bool blocking) {
  auto& c = world_comm();
  const auto n = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  CAPTURE(zest::name_of(zest::dtype_of<T>()));
  // Even: 5 each.
  {
    auto send = to_device(make_vector<T>(5, [&](std::size_t i) { return long(me * 8 + i); }));
    device_buffer<T> recv(5 * n);
    c.reset_stats();
    if (blocking) {
      c.all_gather(std::span<const T>(send.data(), 5), std::span<T>(recv.data(), recv.size()));
    } else {
      auto r =
          c.iall_gather(std::span<const T>(send.data(), 5), std::span<T>(recv.data(), recv.size()));
      r.wait();
    }
    CHECK(all_match(to_host(recv), [](std::size_t i) { return long((i / 5) * 8 + i % 5); }));
    CHECK(c.stats()[collective::all_gather].calls == 1);
    CHECK(c.stats()[collective::all_gather].bytes_sent == (n - 1) * 5 * sizeof(T));
  }
  // Uneven, rank 1 sends nothing.
  {
    std::vector<std::size_t> counts(n);
    for (std::size_t r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : r + 2;
    auto send =
        to_device(make_vector<T>(counts[me], [&](std::size_t i) { return long(me * 8 + i); }));
    device_buffer<T> recv(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    c.reset_stats();
    c.all_gather(std::span<const T>(send.data(), send.size()),
                 std::span<T>(recv.data(), recv.size()), std::span<const std::size_t>(counts));
    std::vector<long> want;
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < counts[r]; ++i) want.push_back(long(r * 8 + i));
    }
    CHECK(all_match(to_host(recv), [&](std::size_t i) { return want[i]; }));
    CHECK(c.stats()[collective::all_gather].bytes_sent == (n - 1) * counts[me] * sizeof(T));
  }
}

TEST_CASE("all_gather: every element type, even and uneven, blocking and not") {
  for (const bool blocking : {true, false}) {
    check_all_gather<float>(blocking);
    check_all_gather<double>(blocking);
    check_all_gather<bf16>(blocking);
    check_all_gather<std::int32_t>(blocking);
    check_all_gather<std::int64_t>(blocking);
    check_all_gather<std::uint8_t>(blocking);
    check_all_gather<std::uint16_t>(blocking);
  }
}

template <class T>
void check_reductions() {
  auto& c = world_comm();
  const auto n = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  CAPTURE(zest::name_of(zest::dtype_of<T>()));
  const long rank_sum = long(n * (n - 1) / 2);
  // reduce_scatter, even: 3 per rank; element i of the whole is sum_r (r + i % 4).
  {
    auto send = to_device(make_vector<T>(3 * n, [&](std::size_t i) { return long(me + i % 4); }));
    device_buffer<T> recv(3);
    c.reset_stats();
    c.reduce_scatter(std::span<const T>(send.data(), send.size()), std::span<T>(recv.data(), 3));
    CHECK(all_match(to_host(recv),
                    [&](std::size_t i) { return rank_sum + long(n * ((me * 3 + i) % 4)); }));
    CHECK(c.stats()[collective::reduce_scatter].bytes_sent == (3 * n - 3) * sizeof(T));
  }
  // reduce_scatter, uneven: rank r gets r + 1 elements (the last rank none when n > 1).
  {
    std::vector<std::size_t> counts(n);
    for (std::size_t r = 0; r < n; ++r) counts[r] = (n > 1 && r == n - 1) ? 0 : r + 1;
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    std::size_t offset = 0;
    for (std::size_t r = 0; r < me; ++r) offset += counts[r];
    auto send = to_device(make_vector<T>(total, [&](std::size_t i) { return long(me + i % 4); }));
    device_buffer<T> recv(counts[me]);
    auto req = c.ireduce_scatter(std::span<const T>(send.data(), send.size()),
                                 std::span<T>(recv.data(), recv.size()),
                                 std::span<const std::size_t>(counts), reduce_op::sum);
    req.wait();
    CHECK(all_match(to_host(recv),
                    [&](std::size_t i) { return rank_sum + long(n * ((offset + i) % 4)); }));
  }
  // all_reduce: sum, max, min; byte count 2 (total - my chunk).
  for (const reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
    const std::size_t total = 7;
    auto data = to_device(make_vector<T>(total, [&](std::size_t i) { return long(me + i); }));
    c.reset_stats();
    c.all_reduce(std::span<T>(data.data(), data.size()), op);
    const long expected_base = op == reduce_op::sum   ? rank_sum
                               : op == reduce_op::max ? long(n - 1)
                                                      : 0;
    CHECK(all_match(to_host(data), [&](std::size_t i) {
      return expected_base + (op == reduce_op::sum ? long(n * i) : long(i));
    }));
    const std::size_t my_chunk = total / n + (me < total % n ? 1 : 0);
    CHECK(c.stats()[collective::all_reduce].bytes_sent == 2 * (total - my_chunk) * sizeof(T));
  }
}

TEST_CASE("reduce_scatter and all_reduce: sums, max, min, uneven chunks") {
  check_reductions<float>();
  check_reductions<double>();
  check_reductions<bf16>();
  check_reductions<std::int32_t>();
  check_reductions<std::int64_t>();
  check_reductions<std::uint8_t>();
}

TEST_CASE("uint16 moves but does not reduce (NCCL has no such type)") {
  auto& c = world_comm();
  device_buffer<std::uint16_t> d(4);
  CHECK_THROWS_AS(c.all_reduce(std::span<std::uint16_t>(d.data(), d.size())),
                  zest::communicator_error);
}

template <class T>
void check_all_to_all() {
  auto& c = world_comm();
  const auto n = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  CAPTURE(zest::name_of(zest::dtype_of<T>()));
  // Rank r sends (r + j) % 3 elements to rank j: r*16 + j*4 + k.
  std::vector<std::size_t> send_counts(n), recv_counts(n);
  for (std::size_t j = 0; j < n; ++j) {
    send_counts[j] = (me + j) % 3;
    recv_counts[j] = (j + me) % 3;
  }
  std::vector<T> send_host;
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < send_counts[j]; ++k)
      send_host.push_back(make<T>(long(me * 16 + j * 4 + k)));
  }
  std::vector<long> want;
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < recv_counts[j]; ++k) want.push_back(long(j * 16 + me * 4 + k));
  }
  auto send = to_device(send_host);
  device_buffer<T> recv(want.size());
  c.reset_stats();
  c.all_to_all(std::span<const T>(send.data(), send.size()),
               std::span<const std::size_t>(send_counts), std::span<T>(recv.data(), recv.size()),
               std::span<const std::size_t>(recv_counts));
  CHECK(all_match(to_host(recv), [&](std::size_t i) { return want[i]; }));
  std::size_t sent = 0;
  for (std::size_t j = 0; j < n; ++j) sent += j == me ? 0 : send_counts[j];
  CHECK(c.stats()[collective::all_to_all].bytes_sent == sent * sizeof(T));
  // Equal blocks, non-blocking.
  auto even = to_device(
      make_vector<T>(2 * n, [&](std::size_t i) { return long(me * 16 + (i / 2) * 4 + i % 2); }));
  device_buffer<T> got(2 * n);
  auto r = c.iall_to_all(std::span<const T>(even.data(), even.size()), {},
                         std::span<T>(got.data(), got.size()), {});
  while (!r.test()) {
  }
  CHECK(
      all_match(to_host(got), [&](std::size_t i) { return long((i / 2) * 16 + me * 4 + i % 2); }));
}

TEST_CASE("all_to_all: uneven blocks (some empty) and equal blocks") {
  check_all_to_all<float>();
  check_all_to_all<double>();
  check_all_to_all<bf16>();
  check_all_to_all<std::int32_t>();
  check_all_to_all<std::uint8_t>();
  check_all_to_all<std::uint16_t>();
}

TEST_CASE("broadcast from the last rank, and the ring model's byte count") {
  auto& c = world_comm();
  const auto n = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  const int root = c.size() - 1;
  auto data = to_device(make_vector<float>(9, [&](std::size_t i) { return long(me * 100 + i); }));
  c.reset_stats();
  c.broadcast(std::span<float>(data.data(), data.size()), root);
  CHECK(all_match(to_host(data), [&](std::size_t i) { return long(std::size_t(root) * 100 + i); }));
  const bool last = me == (std::size_t(root) + n - 1) % n;
  CHECK(c.stats()[collective::broadcast].bytes_sent ==
        ((n == 1 || (last && me != std::size_t(root))) ? 0 : 36));
  auto r = c.ibroadcast(std::span<float>(data.data(), data.size()), 0);
  r.wait();
  CHECK(all_match(to_host(data), [&](std::size_t i) { return long(std::size_t(root) * 100 + i); }));
}

TEST_CASE("host memory goes through MPI, counted the same way") {
  auto& c = world_comm();
  const auto n = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  std::vector<double> loss(3, double(me + 1));
  c.reset_stats();
  c.all_reduce(std::span<double>(loss));
  CHECK(loss[0] == double(n * (n + 1) / 2));
  CHECK(c.stats()[collective::all_reduce].calls == 1);
  std::vector<float> mine(2, float(me)), all(2 * n);
  c.all_gather(std::span<const float>(mine), std::span<float>(all));
  CHECK(all[2 * (n - 1)] == float(n - 1));
  c.barrier();
}

TEST_CASE("wrong buffer sizes throw communicator_error on the rank that passed them") {
  auto& c = world_comm();
  const auto n = static_cast<std::size_t>(c.size());
  device_buffer<float> send(4), recv(4 * n + 1);
  CHECK_THROWS_WITH_AS(c.all_gather(std::span<const float>(send.data(), 4),
                                    std::span<float>(recv.data(), recv.size())),
                       doctest::Contains("recv buffer has"), zest::communicator_error);
  // The communicator is still usable afterwards.
  device_buffer<float> x(3);
  zest::cuda_backend::fill(x.data(), 3, 1.0F);
  c.all_reduce(std::span<float>(x.data(), 3));
  CHECK(to_host(x)[0] == float(n));
}

TEST_CASE("checked mode: ranks that disagree all throw collective_mismatch, naming each call") {
  auto& c = world_comm();
  if (c.size() < 2) return;  // needs two ranks
  REQUIRE(c.checked());
  const std::size_t count = c.rank() == 0 ? 4 : 5;
  device_buffer<float> x(count);
  zest::cuda_backend::fill(x.data(), count, 1.0F);
  std::string what;
  try {
    c.all_reduce(std::span<float>(x.data(), count));
  } catch (const zest::collective_mismatch& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("rank 0: all_reduce<float>[4]") != std::string::npos);
  CHECK(what.find("at cuda/nccl_communicator_test.cpp:") != std::string::npos);  // this line
  c.all_reduce(std::span<float>(x.data(), 4));                                   // and it recovers
  CHECK(to_host(x)[0] == float(c.size()));
}

TEST_CASE("a one-rank communicator and a cuda_mesh without MPI arguments") {
  if (zest::testing::world().size != 1) return;
  nccl_communicator solo("solo");
  CHECK(solo.size() == 1);
  auto send = to_device(std::vector<float>{1, 2, 3});
  device_buffer<float> recv(3);
  solo.all_gather(std::span<const float>(send.data(), 3), std::span<float>(recv.data(), 3));
  CHECK(to_host(recv) == std::vector<float>{1, 2, 3});
  zest::cuda_mesh<"dp"> m;
  CHECK(m.axis<"dp">().size() == 1);
  static_assert(std::is_same_v<zest::backend_of<zest::cuda_mesh<"dp">>, zest::cuda_backend>);
}

}  // namespace
