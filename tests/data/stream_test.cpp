// zest::token_stream: a loader written against the concept alone (epoch-shuffled windows of
// a token sequence) gives, gathered from the ranks, batch k's global ids under every layout
// of "bt" (the batch split over dp and ep, the sequence over sp and tp, replicated) on every
// mesh shape at 1, 2 and 4 ranks; a cursor's state restores its position and refuses another
// stream, naming what differs, unless allowed; zest::batch_sampler is a stream whose identity
// names its seed and text.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "support/streams.hpp"
#include "zest/core/error.hpp"
#include "zest/core/random.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/stream.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/tensor/redistribute.hpp"

namespace {
using namespace zest;
using mesh_t = mesh<"dp", "ep", "tp", "sp">;
using testing::shuffled_windows;

static_assert(token_stream<shuffled_windows>);
static_assert(token_stream<batch_sampler>);

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// dp x ep x tp x sp shapes of the world.
std::vector<std::array<int, 4>> shapes() {
  const int n = world_size();
  if (n == 1) return {{1, 1, 1, 1}};
  if (n == 2) return {{2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}, {1, 1, 1, 2}};
  return {{4, 1, 1, 1}, {2, 1, 2, 1}, {1, 2, 1, 2}, {1, 1, 2, 2}, {2, 2, 1, 1}};
}

template <class Layout>
void check_layout(const mesh_t& m, const shuffled_windows& s, std::uint64_t k) {
  const auto b = stream_batch<Layout>(s, m, k);
  const auto want = stream_global_batch(s, k);
  CHECK(to_global(b.inputs) == want.inputs);
  CHECK(to_global(b.targets) == want.targets);
}

TEST_CASE("a loader written against the concept: batch k whole on any mesh and layout") {
  // 7 rows: uneven over 2 and 4 ranks; 6 columns over tp and sp.
  const shuffled_windows s(1000, 7, 6, 42);
  for (const auto shape : shapes()) {
    CAPTURE(shape);
    const mesh_t m(MPI_COMM_WORLD, shape);
    for (const std::uint64_t k : {std::uint64_t{0}, std::uint64_t{5}, std::uint64_t{40}}) {
      CAPTURE(k);
      check_layout<layout<split<'b', "dp", "ep">>>(m, s, k);
      check_layout<layout<split<'b', "dp", "ep">, split<'t', "sp", "tp">>>(m, s, k);
      check_layout<layout<split<'t', "tp", "dp">>>(m, s, k);
      check_layout<layout<>>(m, s, k);
    }
  }
  // Every window at most once per epoch: 20 batches of 7 rows, 140 of epoch 0's 142 windows.
  std::vector<int> seen(1000 / 7, 0);
  for (std::uint64_t k = 0; k < 20; ++k) {
    const auto g = stream_global_batch(s, k);
    for (std::size_t r = 0; r < 7; ++r) ++seen[static_cast<std::size_t>(g.inputs[r * 6]) / 7];
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == 140);
}

TEST_CASE("a cursor's state: the position restored, another stream refused unless allowed") {
  const mesh_t m(MPI_COMM_WORLD, {world_size(), 1, 1, 1});
  const shuffled_windows s(1000, 4, 6, 1);
  stream_cursor cursor(s);
  for (int k = 0; k < 3; ++k) (void)cursor.next<layout<split<'b', "dp">>>(m);
  const stream_state saved = cursor.state();
  CHECK(saved.position == 3);
  CHECK(saved.batch_size == 4);
  CHECK(saved.identity == "shuffled_windows windows=142 seed=1 vocab=1073741824");

  stream_cursor again(s);
  CHECK(again.restore(saved).empty());
  CHECK(again.position() == 3);
  const auto next = again.next<layout<split<'b', "dp">>>(m);
  CHECK(to_global(next.inputs) == stream_global_batch(s, 3).inputs);

  const shuffled_windows other_seed(1000, 4, 6, 2), wider(1000, 8, 6, 1),
      longer(1136, 4, 7, 1);  // 142 windows of 8
  stream_cursor a(other_seed), b(wider), c(longer);
  CHECK_THROWS_WITH_AS(a.restore(saved),
                       doctest::Contains("identity: saved \"shuffled_windows windows=142 seed=1 "
                                         "vocab=1073741824\", this run \"shuffled_windows "
                                         "windows=142 seed=2 vocab=1073741824\""),
                       checkpoint_error);
  CHECK_THROWS_WITH_AS(b.restore(saved),
                       doctest::Contains("global batch: saved 4 rows, this run 8"),
                       checkpoint_error);
  CHECK_THROWS_WITH_AS(c.restore(saved), doctest::Contains("sequence length: saved 6, this run 7"),
                       checkpoint_error);
  CHECK(b.position() == 0);
  CHECK(b.restore(saved, {.allow_other = true}) == "global batch: saved 4 rows, this run 8");
  CHECK(b.position() == 3);
}

TEST_CASE("batch_sampler is a stream: its rows, and an identity of its seed and text") {
  std::vector<std::int32_t> text(500);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<std::int32_t>((i * 7) % 50);
  const batch_sampler s(text, 5, 8, 9);
  const mesh_t m(MPI_COMM_WORLD, {world_size(), 1, 1, 1});
  for (const std::uint64_t k : {std::uint64_t{0}, std::uint64_t{3}}) {
    const auto a = s.batch<layout<split<'b', "dp">>>(m, k);
    const auto want = s.global_batch(k);
    CHECK(to_global(a.inputs) == want.inputs);
    CHECK(stream_global_batch(s, k).targets == want.targets);
  }
  auto changed = text;
  changed[123] += 1;
  CHECK(batch_sampler(text, 5, 8, 9).identity() == s.identity());
  CHECK(batch_sampler(text, 5, 8, 10).identity() != s.identity());
  CHECK(batch_sampler(changed, 5, 8, 9).identity() != s.identity());
  CHECK(s.identity().starts_with("batch_sampler seed=9 tokens=500 xxh64:"));
}

}  // namespace
