// batch_sampler: step k's global batch is a function of (seed, k) alone. Gathered from the
// ranks (to_global) it equals the batch one process builds on a local_mesh with a
// replicated layout, at 1, 2 and 4 ranks, on every mesh shape, for even and uneven B.
#include <doctest/doctest.h>
#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/layout/shard.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/tensor/redistribute.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using mesh_t = mesh<"dp", "tp">;
using local_t = local_mesh<"dp", "tp">;

// splitmix64 is the published generator: its first output for state 0.
static_assert(splitmix64(0) == 0xe220a8397b1dcdafULL);
static_assert(counter_hash(1, 2, 3) != counter_hash(1, 2, 4));
static_assert(counter_hash(1, 2, 3) != counter_hash(1, 3, 3));
static_assert(counter_hash(1, 2, 3) != counter_hash(2, 2, 3));
// batch<"dp"> is the data-parallel layout.
static_assert(std::is_same_v<decltype(std::declval<const batch_sampler&>().batch<"dp">(
                                 std::declval<const mesh_t&>(), 0)),
                             token_batch<batch_tensor<mesh_t, "dp">>>);
static_assert(has_layout<batch_tensor<mesh_t, "dp">, layout<split<'b', "dp">>>);

const text_dataset& corpus() {
  static const text_dataset d = text_dataset::from_path();
  return d;
}

template <class V>
std::vector<std::int32_t> as_vector(const V& v) {
  return std::vector<std::int32_t>(v.begin(), v.end());
}

// The batch of one process: a local mesh, every row on it.
token_batch<std::vector<std::int32_t>> one_process_batch(const batch_sampler& s,
                                                         std::uint64_t step) {
  const local_t local;
  const auto b = s.batch<layout<>>(local, step);
  return {as_vector(b.inputs.local()), as_vector(b.targets.local())};
}

// Every rank holds rows [offset, offset + size) of its dp block, all of them equal to the
// reference, and the gathered batch is the reference.
template <class Layout>
void check_same_global_batch(const mesh_t& m, const batch_sampler& s, std::uint64_t step) {
  CAPTURE(m.describe());
  CAPTURE(s.batch_size());
  CAPTURE(step);
  const auto want = one_process_batch(s, step);
  const auto global = s.global_batch(step);
  CHECK(global.inputs == want.inputs);
  CHECK(global.targets == want.targets);

  const auto got = s.template batch<Layout>(m, step);
  const std::size_t B = s.batch_size();
  const std::size_t T = s.sequence_length();
  REQUIRE(got.inputs.extents() == std::array<std::size_t, 2>{B, T});
  // Rows: a balanced block of B over dp where the layout splits b, else all of them.
  const auto rows = decltype(got.inputs)::layout.splits(0, 'b')
                        ? balanced_block(B, static_cast<std::size_t>(m.size(0)),
                                         static_cast<std::size_t>(m.coord(0)))
                        : block_range{0, B};
  CHECK(got.inputs.local_offsets()[0] == rows.offset);
  CHECK(got.inputs.local_extents()[0] == rows.size);
  // The local block is the reference's block.
  const auto& off = got.inputs.local_offsets();
  const auto& ext = got.inputs.local_extents();
  const auto in = got.inputs.local();
  const auto tg = got.targets.local();
  bool block_ok = true;
  for (std::size_t r = 0; r < ext[0]; ++r) {
    for (std::size_t t = 0; t < ext[1]; ++t) {
      const std::size_t g = (off[0] + r) * T + off[1] + t;
      block_ok =
          block_ok && in[r * ext[1] + t] == want.inputs[g] && tg[r * ext[1] + t] == want.targets[g];
    }
  }
  CHECK(block_ok);
  CHECK(to_global(got.inputs) == want.inputs);
  CHECK(to_global(got.targets) == want.targets);
}
}  // namespace

TEST_CASE("a row is the window at start(step, row); targets are the next tokens") {
  const auto train = corpus().train();
  const batch_sampler s(train, 5, 32, 1234);
  CHECK(s.window_count() == train.size() - 32);
  for (std::uint64_t k = 0; k < 4; ++k) {
    const auto b = s.global_batch(k);
    REQUIRE(b.inputs.size() == 5 * 32);
    for (std::size_t r = 0; r < 5; ++r) {
      const std::size_t start = s.start(k, r);
      CHECK(start + 32 < train.size());
      for (std::size_t t = 0; t < 32; ++t) {
        CHECK(b.inputs[r * 32 + t] == train[start + t]);
        CHECK(b.targets[r * 32 + t] == train[start + t + 1]);
      }
    }
  }
}

TEST_CASE("deterministic: the same (seed, step) gives the same batch, in any order") {
  const batch_sampler a(corpus().train(), 7, 16, 42);
  const batch_sampler b(corpus().train(), 7, 16, 42);
  const batch_sampler other_seed(corpus().train(), 7, 16, 43);
  const auto b5 = b.global_batch(5);  // step 5 before step 0: no hidden state
  const auto a0 = a.global_batch(0);
  CHECK(a.global_batch(5).inputs == b5.inputs);
  CHECK(b.global_batch(0).inputs == a0.inputs);
  CHECK(a0.inputs != b5.inputs);
  CHECK(other_seed.global_batch(0).inputs != a0.inputs);
  // The starts spread over the text (not all the same window).
  std::set<std::size_t> starts;
  for (std::uint64_t k = 0; k < 20; ++k) {
    for (std::size_t r = 0; r < 7; ++r) starts.insert(a.start(k, r));
  }
  CHECK(starts.size() > 130);
}

TEST_CASE("the global batch is the same on 1, 2 and 4 ranks, for even and uneven B") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    // 8 divides every rank count; 6 over 4 -> 2 2 1 1; 3 over 4 leaves a rank with no rows.
    for (std::size_t B : {8U, 6U, 3U, 1U}) {
      const batch_sampler s(corpus().train(), B, 24, 2024);
      for (std::uint64_t step : {0U, 1U, 2U, 17U, 1000U}) {
        check_same_global_batch<layout<split<'b', "dp">>>(m, s, step);
      }
    }
    // The batch split over dp and its tokens over tp (any layout without partial sums).
    const batch_sampler s(corpus().validation(), 5, 11, 7);
    for (std::uint64_t step : {0U, 3U}) {
      check_same_global_batch<layout<split<'b', "dp">, split<'t', "tp">>>(m, s, step);
      check_same_global_batch<layout<>>(m, s, step);
    }
  }
}

TEST_CASE("on a 1-D data-parallel mesh: batch<\"dp\">") {
  const mesh<"dp"> m(MPI_COMM_WORLD, {-1});
  const batch_sampler s(corpus().train(), 6, 64, 99);
  for (std::uint64_t step = 0; step < 3; ++step) {
    const auto [inputs, targets] = s.batch<"dp">(m, step);
    const auto want = s.global_batch(step);
    CHECK(inputs.local_extents()[0] == balanced_block(6, static_cast<std::size_t>(m.size(0)),
                                                      static_cast<std::size_t>(m.coord(0)))
                                           .size);
    CHECK(to_global(inputs) == want.inputs);
    CHECK(to_global(targets) == want.targets);
  }
}

TEST_CASE("errors") {
  const std::vector<std::int32_t> few{1, 2, 3, 4};
  CHECK_THROWS_AS(batch_sampler(few, 2, 4, 0), shape_error);  // needs 5 tokens
  CHECK_NOTHROW(batch_sampler(few, 2, 3, 0));
  CHECK_THROWS_AS(batch_sampler(few, 0, 3, 0), shape_error);
  CHECK_THROWS_AS(batch_sampler(few, 2, 0, 0), shape_error);
  try {
    batch_sampler(few, 2, 4, 0);
  } catch (const shape_error& e) {
    CHECK(std::string(e.what()) ==
          "zest: batch_sampler: a sequence of length 4 needs 5 tokens (inputs and the next-token "
          "targets), "
          "the text has 4");
  }
  // A window of exactly the whole text: one start, 0.
  const batch_sampler whole(few, 3, 3, 5);
  CHECK(whole.window_count() == 1);
  CHECK(whole.global_batch(9).inputs == std::vector<std::int32_t>{1, 2, 3, 1, 2, 3, 1, 2, 3});
  CHECK(whole.global_batch(9).targets == std::vector<std::int32_t>{2, 3, 4, 2, 3, 4, 2, 3, 4});
}
