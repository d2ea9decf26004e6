// zest::memory: live and peak bytes count blocks in use; large freed blocks are cached and
// handed out again for the same size, within the cache's limit, and the cache never counts
// as live.
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

TEST_CASE("a large freed block is reused for the next request of its size") {
  memory::release_cache();
  const std::int64_t before = memory::live_bytes();
  const std::size_t n = memory::block_cache::min_block;  // floats: 4x the threshold in bytes
  const float* first = nullptr;
  {
    host_vector<float> a(n);
    first = a.data();
  }
  CHECK(memory::live_bytes() == before);  // cached, not live
  CHECK(memory::cached_bytes() == n * sizeof(float));
  {
    host_vector<float> b(n);
    CHECK(b.data() == first);
    CHECK(memory::cached_bytes() == 0);
    CHECK(memory::live_bytes() - before == static_cast<std::int64_t>(n * sizeof(float)));
    host_vector<float> c(n + 1);  // another size: a new block
    CHECK(c.data() != first);
  }
  // Small blocks are not cached.
  { host_vector<float> small(16); }
  CHECK(memory::cached_bytes() == 2 * n * sizeof(float) + sizeof(float));
  memory::release_cache();
  CHECK(memory::cached_bytes() == 0);
}

TEST_CASE("the cache stays within its limit") {
  memory::release_cache();
  const std::size_t limit = memory::cache_limit();
  const std::size_t n = memory::block_cache::min_block;
  memory::set_cache_limit(n * sizeof(float));
  { host_vector<float> a(n), b(n); }
  CHECK(memory::cached_bytes() == n * sizeof(float));  // one kept, one freed
  { host_vector<float> big(n + 16); }                  // a larger block fits no more...
  CHECK(memory::cached_bytes() == n * sizeof(float));
  memory::set_cache_limit((n + 16) * sizeof(float));
  { host_vector<float> big(n + 16); }                         // ...until the limit lets it in,
  CHECK(memory::cached_bytes() == (n + 16) * sizeof(float));  // evicting the smaller one
  memory::set_cache_limit(0);
  CHECK(memory::cached_bytes() == 0);
  memory::set_cache_limit(limit);
}

}  // namespace
