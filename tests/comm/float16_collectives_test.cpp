// zest::float16 through mpi_communicator: all_reduce and reduce_scatter (sum, max, min) in
// float16 against a float reference rounded to half. MPI moves float16 as its 16 bits and
// sums with a user-defined op that adds pairs in float and rounds each partial sum, so:
//   - values whose every partial sum is exact in float16 (small quarters) match bit for bit;
//   - arbitrary values match up to one rounding per combining step (n - 1 of them) and the
//     rounding of the reference, and exactly at 1 and 2 ranks (a single rounding);
//   - max and min choose one of the inputs and match exactly;
//   - sums past 65504 overflow to inf, like the reference.
// Every rank computes every rank's inputs itself, so the reference needs no communication.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "zest/comm/mpi_communicator.hpp"
#include "zest/core/float16.hpp"

namespace {

using zest::float16;
using zest::reduce_op;

// Rank r's value at global index k: exact quarters in [-8, 8] or arbitrary values in (-4, 4).
float16 exact_value(std::size_t r, std::size_t k) {
  return float16(static_cast<float>(static_cast<int>((7 * k + 13 * r) % 65) - 32) / 4.0F);
}
float16 rough_value(std::size_t r, std::size_t k) {
  return float16(static_cast<float>(4.0 * std::sin(0.7 * static_cast<double>(k) + 1.3 * r + 0.1)));
}

struct expected {
  float16 value;     // the float reference rounded to half
  double tolerance;  // 0: bitwise
};

// Expected reduction over n ranks of value(r, k).
template <class Value>
expected reference(Value value, std::size_t n, std::size_t k, reduce_op op, bool exact) {
  double sum = 0, magnitude = 0;
  float best = value(0, k);
  for (std::size_t r = 0; r < n; ++r) {
    const float x = value(r, k);
    sum += x;
    magnitude += std::abs(x);
    if (op == reduce_op::max && best < x) best = x;
    if (op == reduce_op::min && x < best) best = x;
  }
  if (op != reduce_op::sum) return {float16(best), 0.0};
  const float16 rounded(static_cast<float>(sum));
  // Each combining step rounds a partial sum (at most magnitude) by half an ulp: 2^-11 relative.
  const double tolerance =
      exact || n <= 2 ? 0.0 : static_cast<double>(n) * std::ldexp(magnitude, -11);
  return {rounded, tolerance};
}

std::string describe(std::size_t i, float16 got, expected want) {
  std::ostringstream out;
  out << "element " << i << ": got " << static_cast<float>(got) << " (0x" << std::hex << got.bits()
      << std::dec << "), expected " << static_cast<float>(want.value) << " +- " << want.tolerance;
  return out.str();
}

bool matches(float16 got, expected want) {
  if (want.tolerance == 0) return got == want.value;
  return std::abs(static_cast<double>(static_cast<float>(got)) - static_cast<float>(want.value)) <=
         want.tolerance;
}

std::vector<std::vector<std::size_t>> count_layouts(std::size_t n) {
  std::vector<std::size_t> uneven(n);
  for (std::size_t r = 0; r < n; ++r) uneven[r] = (r % 2 == 1) ? 0 : 3 + 5 * r;
  return {{}, uneven};
}

}  // namespace

TEST_CASE("float16 all_reduce: sum, max and min against a float reference rounded to half") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "f16");
  const std::size_t n = comm.size(), me = comm.rank();
  for (const bool exact : {true, false}) {
    const auto value = [&](std::size_t r, std::size_t k) {
      return exact ? exact_value(r, k) : rough_value(r, k);
    };
    for (const bool checked : {false, true}) {
      comm.set_checked(checked);
      for (const reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
        INFO((exact ? "exact" : "rough")
             << " values, op " << static_cast<int>(op) << (checked ? ", checked" : ", unchecked"));
        const std::size_t total = 1000;
        std::vector<float16> data(total);
        for (std::size_t k = 0; k < total; ++k) data[k] = value(me, k);
        comm.all_reduce(std::span<float16>(data), op);
        std::size_t wrong = 0;
        std::string first;
        for (std::size_t k = 0; k < total; ++k) {
          const expected want = reference(value, n, k, op, exact);
          if (!matches(data[k], want) && wrong++ == 0) first = describe(k, data[k], want);
        }
        INFO(first);
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("float16 reduce_scatter: sum with equal and uneven chunks") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "f16");
  const std::size_t n = comm.size(), me = comm.rank();
  for (const bool exact : {true, false}) {
    const auto value = [&](std::size_t r, std::size_t k) {
      return exact ? exact_value(r, k) : rough_value(r, k);
    };
    for (const auto& counts : count_layouts(n)) {
      const std::vector<std::size_t> per_rank =
          counts.empty() ? std::vector<std::size_t>(n, 37) : counts;
      std::vector<std::size_t> offsets(n, 0);
      std::exclusive_scan(per_rank.begin(), per_rank.end(), offsets.begin(), std::size_t{0});
      const std::size_t total = std::accumulate(per_rank.begin(), per_rank.end(), std::size_t{0});
      for (const reduce_op op : {reduce_op::sum, reduce_op::max}) {
        INFO((exact ? "exact" : "rough") << " values, op " << static_cast<int>(op) << ", counts "
                                         << (counts.empty() ? "equal" : "uneven"));
        std::vector<float16> send(total), recv(per_rank[me], float16(99.0F));
        for (std::size_t k = 0; k < total; ++k) send[k] = value(me, k);
        comm.reduce_scatter(std::span<const float16>(send), std::span<float16>(recv), counts, op);
        std::size_t wrong = 0;
        std::string first;
        for (std::size_t i = 0; i < recv.size(); ++i) {
          const expected want = reference(value, n, offsets[me] + i, op, exact);
          if (!matches(recv[i], want) && wrong++ == 0) first = describe(i, recv[i], want);
        }
        INFO(first);
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("float16 all_reduce: a sum past 65504 is inf, as the reference") {
  zest::mpi_communicator comm(MPI_COMM_WORLD, "f16");
  const std::size_t n = comm.size();
  std::vector<float16> data(5, float16(40000.0F));
  data[1] = float16(-40000.0F);
  data[2] = float16(20000.0F);
  comm.all_reduce(std::span<float16>(data));
  const auto nf = static_cast<float>(n);
  CHECK(data[0] == float16(40000.0F * nf));
  CHECK(data[1] == float16(-40000.0F * nf));
  CHECK(data[2] == float16(20000.0F * nf));
  if (n >= 2) {
    CHECK(std::isinf(static_cast<float>(data[0])));
    CHECK(static_cast<float>(data[1]) == -std::numeric_limits<float>::infinity());
  }
}
