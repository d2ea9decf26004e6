// The backend concept (zest/backend/backend.hpp) against the backends zest has and against
// backends that each lack one documented member or have it with the wrong signature.
#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "zest/backend/backend.hpp"
#include "zest/backend/emulated/emulated_backend.hpp"
#include "zest/backend/host/host_backend.hpp"

namespace {

// A complete backend of its own (not derived from host_backend), so that each variant below
// differs from a passing one in exactly one member.
template <bool Sync = true, bool SumDouble = true, bool Fill = true>
struct toy_backend {
  static constexpr std::string_view name = "toy";
  template <class T>
  using buffer = std::vector<T>;
  template <class T>
  static void copy_slices(const T*, std::size_t, std::size_t, std::size_t, T*, std::size_t,
                          std::size_t, std::size_t, std::size_t) {}
  template <class T>
  static void fill(T* p, std::size_t n, T value) requires Fill {
    for (std::size_t i = 0; i < n; ++i) p[i] = value;
  }
  template <class T>
  static void contract(std::span<const zest::contraction::operand_view<T>>, std::string_view, T*,
                       std::span<const std::size_t>) {}
  template <class F>
  static void for_each(std::size_t n, const F& f) {
    for (std::size_t i = 0; i < n; ++i) f(i);
  }
  template <class F>
  static auto sum(std::size_t n, const F& f) {
    if constexpr (SumDouble) {
      double s = 0;
      for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(f(i));
      return s;
    } else {
      return std::vector<double>(n);  // not a number: refused
    }
  }
  static zest::memory::counters& counters() { return zest::memory::host_counters(); }
  static void synchronize() requires Sync {}
  template <class T>
  static buffer<T> from_host(std::span<const T> v) {
    return buffer<T>(v.begin(), v.end());
  }
  template <class T>
  static void to_host(std::span<const T>, T*) {}
};

struct bad_flag_backend : toy_backend<> {
  struct not_a_bool {};
  static constexpr not_a_bool runs_host_loops{};
};
struct bad_memory_flag_backend : toy_backend<> {
  struct not_a_bool {};
  static constexpr not_a_bool host_addressable{};
};

// A buffer without size().
template <class T>
struct sizeless_buffer {
  explicit sizeless_buffer(std::size_t n) : v(n) {}
  T* data() { return v.data(); }
  const T* data() const { return v.data(); }
  std::vector<T> v;
};
struct sizeless_backend : toy_backend<> {
  template <class T>
  using buffer = sizeless_buffer<T>;
  template <class T>
  static buffer<T> from_host(std::span<const T> v) {
    return buffer<T>(v.size());
  }
};

}  // namespace

TEST_CASE("zest's backends model the backend concept") {
  static_assert(zest::backend<zest::host_backend>);
  static_assert(zest::backend<zest::emulated_backend>);
  static_assert(zest::backend<toy_backend<>>);
  // The toy backend is a working one: its loops run.
  std::vector<float> v(4);
  toy_backend<>::fill(v.data(), v.size(), 2.0F);
  CHECK(toy_backend<>::sum(v.size(), [&](std::size_t i) { return v[i]; }) == 8.0);
}

TEST_CASE("a backend lacking a documented member, or with its signature wrong, is refused") {
  static_assert(!zest::backend<toy_backend<false, true, true>>);  // no synchronize()
  static_assert(!zest::backend<toy_backend<true, false, true>>);  // sum not a number
  static_assert(!zest::backend<toy_backend<true, true, false>>);  // no fill
  static_assert(!zest::backend<bad_flag_backend>);                // runs_host_loops not a bool
  static_assert(!zest::backend<bad_memory_flag_backend>);         // host_addressable not a bool
  static_assert(!zest::backend<sizeless_backend>);                // buffer without size()
  static_assert(!zest::backend<int>);
}

TEST_CASE("the host backend's sum: sixteen lanes, a fixed order") {
  // 2^60 absorbs a 1 added to it: in index order the ones vanish; in lanes 2^60 and -2^60
  // meet in lane 0 and the ones in lanes 1 to 15 survive.
  std::vector<double> v(17, 1.0);
  v[0] = 0x1p60;
  v[16] = -0x1p60;
  const auto at = [&](std::size_t i) { return v[i]; };
  double in_order = 0;
  for (const double x : v) in_order += x;
  CHECK(in_order == 0.0);
  CHECK(zest::host_backend::sum(v.size(), at) == 15.0);
  CHECK(zest::emulated_backend::sum(v.size(), at) == 15.0);  // the host's sum, inherited
  // Up to 16 terms: the sum in index order.
  CHECK(zest::host_backend::sum(16, at) == 0x1p60);
  CHECK(zest::host_backend::sum(0, at) == 0.0);
  // Float terms are added in double.
  const std::vector<float> f(1000, 0.1F);
  CHECK(zest::host_backend::sum(f.size(), [&](std::size_t i) { return f[i]; }) ==
        doctest::Approx(1000 * static_cast<double>(0.1F)).epsilon(1e-15));
}

TEST_CASE("host_staging: the host's buffers in place, the emulated backend's through a copy") {
  static_assert(zest::host_staging<zest::host_backend, float>::in_place);
  static_assert(!zest::host_staging<zest::emulated_backend, float>::in_place);
  static_assert(!zest::host_staging<toy_backend<>, float>::in_place);  // the flag's default

  std::vector<float> block{1, 2, 3};
  zest::host_staging<zest::host_backend, float> here(block);
  CHECK(here.host().data() == block.data());
  here.host()[0] = 7;
  here.write_back();  // nothing to do
  CHECK(block[0] == 7);

  zest::host_staging<zest::emulated_backend, float> copied(block);
  REQUIRE(copied.host().size() == 3);
  CHECK(copied.host().data() != block.data());
  CHECK(copied.host()[2] == 3);
  copied.host()[1] = 9;
  CHECK(block[1] == 2);  // until written back
  copied.write_back();
  CHECK(block == std::vector<float>{7, 9, 3});

  const std::vector<float>& read_only = block;
  zest::host_staging<zest::emulated_backend, const float> seen(read_only);
  CHECK(std::vector<float>(seen.host().begin(), seen.host().end()) == block);
  std::vector<float> empty;
  zest::host_staging<zest::emulated_backend, float> nothing(empty);
  CHECK(nothing.host().empty());
  nothing.write_back();
}
