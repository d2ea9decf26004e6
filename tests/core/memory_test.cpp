// zest::memory: live and peak bytes count the bytes requested by blocks in use; large freed
// blocks are cached by size class and handed out again for a request of the same class,
// within the cache's limit, and the cache never counts as live.
#include <doctest/doctest.h>

#include <cstdint>

#include "zest/backend/host/host_backend.hpp"
#include "zest/core/memory.hpp"

namespace {
using namespace zest;

TEST_CASE("live and peak bytes follow the blocks in use") {
  memory::release_cache();
  const std::int64_t before = memory::live_bytes();
  memory::reset_peak();
  {
    host_vector<float> a(1000);
    host_vector<double> b(500);
    CHECK(memory::live_bytes() - before == 1000 * 4 + 500 * 8);
  }
  CHECK(memory::live_bytes() == before);
  CHECK(memory::peak_bytes() - before == 1000 * 4 + 500 * 8);
}

TEST_CASE("block sizes: the request below 64 KiB, then 16 classes per power of two") {
  using cache = memory::block_cache;
  CHECK(cache::block_size(0) == 0);
  CHECK(cache::block_size(1000) == 1000);
  CHECK(cache::block_size(cache::min_block - 1) == cache::min_block - 1);
  CHECK(cache::block_size(cache::min_block) == cache::min_block);
  CHECK(cache::block_size(cache::min_block + 1) == cache::min_block + cache::min_block / 16);
  CHECK(cache::block_size(std::size_t{3} << 20) == std::size_t{3} << 20);
  CHECK(cache::block_size((std::size_t{1} << 30) - 1) == std::size_t{1} << 30);
  // Every size from 64 KiB to 4 MiB in steps of 4093 B: the block holds the request, wastes
  // at most 1/16 of it, and there are 16 classes above a power of two up to the next.
  std::size_t classes_in_first_octave = 0, last = 0;
  for (std::size_t bytes = cache::min_block; bytes < (std::size_t{4} << 20); bytes += 4093) {
    const std::size_t b = cache::block_size(bytes);
    CHECK(b >= bytes);
    CHECK(16 * (b - bytes) <= bytes);
    CHECK(cache::block_size(b) == b);  // a class's size is its own class
    if (b > cache::min_block && b <= 2 * cache::min_block && b != last) ++classes_in_first_octave;
    last = b;
  }
  CHECK(classes_in_first_octave == 16);
  // Sizes that cannot be allocated are not wrapped around.
  const std::size_t huge = static_cast<std::size_t>(-1) - 3;
  CHECK(cache::block_size(huge) == huge);
}

TEST_CASE("a large freed block is reused for the next request of its size class") {
  memory::release_cache();
  const std::int64_t before = memory::live_bytes();
  const std::size_t n = memory::block_cache::min_block;  // floats: 4x the threshold in bytes
  const std::size_t block = memory::block_cache::block_size(n * sizeof(float));
  const float* first = nullptr;
  {
    host_vector<float> a(n);
    first = a.data();
  }
  CHECK(memory::live_bytes() == before);  // cached, not live
  CHECK(memory::cached_bytes() == block);
  {
    host_vector<float> b(n);
    CHECK(b.data() == first);
    CHECK(memory::cached_bytes() == 0);
    CHECK(memory::live_bytes() - before == static_cast<std::int64_t>(n * sizeof(float)));
    host_vector<float> c(n + 1);  // the next class: a new block
    CHECK(c.data() != first);
  }
  // Small blocks are not cached.
  { host_vector<float> small(16); }
  const std::size_t next = memory::block_cache::block_size((n + 1) * sizeof(float));
  CHECK(next > block);
  CHECK(memory::cached_bytes() == block + next);
  {
    // A request a little smaller than the class's size, of another element type, gets the
    // larger block back; live bytes count what was asked for.
    host_vector<double> d((n + 7) / 2);
    CHECK(static_cast<const void*>(d.data()) != static_cast<const void*>(first));
    CHECK(memory::cached_bytes() == block);
    CHECK(memory::live_bytes() - before == static_cast<std::int64_t>((n + 7) / 2 * sizeof(double)));
    // Sizes that change a little from step to step (rows routed to an expert) reuse it.
    host_vector<float> e(n - 3);
    CHECK(e.data() == first);
    CHECK(memory::cached_bytes() == 0);
  }
  CHECK(memory::cached_bytes() == block + next);
  memory::release_cache();
  CHECK(memory::cached_bytes() == 0);
}

TEST_CASE("the cache stays within its limit") {
  memory::release_cache();
  const std::size_t limit = memory::cache_limit();
  const std::size_t n = memory::block_cache::min_block;
  const std::size_t block = memory::block_cache::block_size(n * sizeof(float));
  const std::size_t bigger = memory::block_cache::block_size((n + 16) * sizeof(float));
  memory::set_cache_limit(block);
  { host_vector<float> a(n), b(n); }
  CHECK(memory::cached_bytes() == block);  // one kept, one freed
  { host_vector<float> big(n + 16); }      // a larger block fits no more...
  CHECK(memory::cached_bytes() == block);
  memory::set_cache_limit(bigger);
  { host_vector<float> big(n + 16); }       // ...until the limit lets it in,
  CHECK(memory::cached_bytes() == bigger);  // evicting the smaller one
  memory::set_cache_limit(0);
  CHECK(memory::cached_bytes() == 0);
  memory::set_cache_limit(limit);
}

}  // namespace
