// The CUDA backend against the host backend: the pool and its accounting, device_buffer,
// fill, copy_slices, host <-> device staging, and cuda::contract against host::contract on
// many specs (float, double, bfloat16; accumulate; extent-1 and zero extents). One GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zest/backend/cuda/cuda_backend.hpp"
#include "zest/backend/host/host_backend.hpp"

namespace {

using bf16 = zest::bfloat16;
using zest::cuda_backend;
using zest::device_buffer;
using zest::host_backend;

template <class T>
std::vector<T> to_host(const device_buffer<T>& b) {
  std::vector<T> out(b.size());
  cuda_backend::to_host<T>(b.span(), out.data());
  return out;
}
template <class T>
device_buffer<T> to_device(const std::vector<T>& v) {
  return cuda_backend::from_host<T>(std::span<const T>(v));
}

TEST_CASE("device_buffer: pool, accounting, copies and moves") {
  zest::cuda::settings().allow_tf32 = false;
  const auto live0 = zest::memory::device::live_bytes();
  zest::memory::device::reset_peak();
  {
    device_buffer<float> a(1000);
    CHECK(a.size() == 1000);
    CHECK(zest::memory::device::live_bytes() == live0 + 4000);
    std::vector<float> h(1000);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = float(i) * 0.5F;
    a = to_device(h);
    device_buffer<float> b = a;  // deep copy
    CHECK(zest::memory::device::live_bytes() == live0 + 8000);
    cuda_backend::fill(a.data(), a.size(), 0.0F);
    CHECK(to_host(b) == h);
    device_buffer<float> c = std::move(b);
    CHECK(b.size() == 0);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    CHECK(to_host(c) == h);
    CHECK(zest::memory::device::peak_bytes() >= live0 + 8000);
  }
  CHECK(zest::memory::device::live_bytes() == live0);
  // A freed block of the same size class is reused, not allocated again.
  const auto before = zest::cuda::memory_pool_stats();
  { device_buffer<double> d(4096); }
  { device_buffer<double> d(4000); }
  const auto after = zest::cuda::memory_pool_stats();
  CHECK(after.device_allocations - before.device_allocations <= 1);
  CHECK(after.reuses > before.reuses);
  static_assert(zest::backend<cuda_backend>);
  static_assert(std::is_same_v<cuda_backend::buffer<float>::value_type, float>);
}

TEST_CASE("fill: zero and non-zero values of every element size") {
  auto check_fill = [](auto value) {
    using T = decltype(value);
    device_buffer<T> b(777);
    cuda_backend::fill(b.data(), b.size(), value);
    const auto h = to_host(b);
    CHECK(std::all_of(h.begin(), h.end(), [&](T x) { return x == value; }));
  };
  check_fill(0.0F);
  check_fill(1.5F);
  check_fill(-2.25);
  check_fill(bf16(3.0F));
  check_fill(std::int32_t{-7});
  check_fill(std::uint8_t{200});
  check_fill(std::int64_t{1} << 40);
}

TEST_CASE("copy_slices matches the host backend (wide rows, narrow rows, single runs)") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t outer = rng() % 5, src_d = 1 + rng() % 9, dst_d = 1 + rng() % 9,
                      inner = 1 + rng() % (trial % 2 ? 70 : 4);
    const std::size_t len = std::min(src_d, dst_d) == 0 ? 0 : rng() % (std::min(src_d, dst_d) + 1);
    const std::size_t src_off = rng() % (src_d - len + 1), dst_off = rng() % (dst_d - len + 1);
    std::vector<double> src(outer * src_d * inner), dst(outer * dst_d * inner, -1.0);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = double(i);
    auto dsrc = to_device(src);
    auto ddst = to_device(dst);
    host_backend::copy_slices(src.data(), outer, src_d, src_off, dst.data(), dst_d, dst_off, len,
                              inner);
    cuda_backend::copy_slices(dsrc.data(), outer, src_d, src_off, ddst.data(), dst_d, dst_off, len,
                              inner);
    CAPTURE(outer);
    CAPTURE(len);
    CAPTURE(inner);
    CHECK(to_host(ddst) == dst);
  }
}

// ---- contract ------------------------------------------------------------------------------

struct spec_case {
  std::vector<std::string> inputs;
  std::string output;
};
spec_case parse(std::string_view spec) {
  spec_case c;
  const auto arrow = spec.find("->");
  std::string_view lhs = spec.substr(0, arrow);
  for (;;) {
    const auto comma = lhs.find(',');
    c.inputs.emplace_back(lhs.substr(0, comma));
    if (comma == std::string_view::npos) break;
    lhs.remove_prefix(comma + 1);
  }
  c.output = std::string(spec.substr(arrow + 2));
  return c;
}

template <class T>
double max_relative_difference(const std::vector<T>& got, const std::vector<T>& want) {
  double scale = 1, worst = 0;
  for (const auto& w : want) scale = std::max(scale, std::abs(double(float(w))));
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(float(got[i])) - double(float(want[i]))));
  }
  return worst / scale;
}

// Runs one spec with random extents (some 1, some 0 when allow_zero) on both backends.
template <class T>
void compare_contract(std::string_view spec, std::mt19937& rng, bool accumulate, bool allow_zero,
                      double tolerance) {
  const spec_case c = parse(spec);
  std::array<std::size_t, 128> extent{};
  for (const auto& term : c.inputs) {
    for (char l : term) {
      const auto u = static_cast<unsigned char>(l);
      if (extent[u] == 0) extent[u] = (allow_zero && rng() % 7 == 0) ? 0 : 1 + rng() % 7;
    }
  }
  std::vector<std::vector<std::size_t>> extents;
  std::vector<std::vector<T>> host_data;
  std::vector<device_buffer<T>> device_data;
  std::uniform_real_distribution<float> value(-1.0F, 1.0F);
  for (const auto& term : c.inputs) {
    std::vector<std::size_t> e;
    std::size_t n = 1;
    for (char l : term) {
      e.push_back(extent[static_cast<unsigned char>(l)]);
      n *= e.back();
    }
    std::vector<T> v(n);
    for (auto& x : v) x = T(value(rng));
    extents.push_back(e);
    device_data.push_back(to_device(v));
    host_data.push_back(std::move(v));
  }
  std::vector<std::size_t> out_extents;
  std::size_t out_n = 1;
  for (char l : c.output) {
    out_extents.push_back(extent[static_cast<unsigned char>(l)]);
    out_n *= out_extents.back();
  }
  std::vector<T> host_out(out_n);
  for (auto& x : host_out) x = T(value(rng));
  auto device_out = to_device(host_out);

  std::vector<zest::host::operand_view<T>> host_views, device_views;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    host_views.push_back({host_data[i].data(), c.inputs[i], extents[i]});
    device_views.push_back({device_data[i].data(), c.inputs[i], extents[i]});
  }
  zest::host::contract<T>(std::span<const zest::host::operand_view<T>>(host_views), c.output,
                          host_out.data(), out_extents, accumulate);
  zest::cuda::contract<T>(std::span<const zest::host::operand_view<T>>(device_views), c.output,
                          device_out.data(), out_extents, accumulate);
  CAPTURE(spec);
  CAPTURE(accumulate);
  CAPTURE(extents);
  CHECK(max_relative_difference(to_host(device_out), host_out) < tolerance);
}

constexpr std::string_view specs[] = {
    "ik,kj->ij",       "ki,kj->ij",      "ik,jk->ij",      "ki,jk->ji",
    "bik,bkj->bij",    "bsm,hm->bhs",    "bsm,mh->bsh",    "bhqd,bhkd->bhqk",
    "bhqk,bhkd->bhqd", "i,j->ij",        "bi,bj->bij",     "i,i->",
    "ij,ij->ij",       "ij,ij->",        "ij->ji",         "ijk->i",
    "ijk->kj",         "ij->",           "abc,cd->abd",    "GSM,ME->GSE",
    "GSEC,GSM->EGCM",  "EGCM,EMH->EGCH", "GSEC,EGCM->GSM", "ij,jk->k",
    "abc,bd->da",      "abcd,dbe->eac",  "ijk->kji",       "ij->ij",
};

TEST_CASE("cuda::contract equals host::contract on every spec, float and double") {
  zest::cuda::settings().allow_tf32 = false;
  std::mt19937 rng(42);
  for (const auto spec : specs) {
    for (int trial = 0; trial < 4; ++trial) {
      compare_contract<float>(spec, rng, trial % 2 == 1, trial == 3, 1e-5);
      compare_contract<double>(spec, rng, trial % 2 == 1, trial == 3, 1e-12);
    }
  }
}

TEST_CASE("cuda::contract in bfloat16 accumulates in float, like the host") {
  std::mt19937 rng(43);
  for (const auto spec : specs) {
    for (int trial = 0; trial < 3; ++trial)
      compare_contract<bf16>(spec, rng, trial == 1, trial == 2, 2e-2);
  }
}

TEST_CASE("cuda::contract: a large GEMM agrees with the host, and TF32 is close") {
  std::mt19937 rng(44);
  zest::cuda::settings().allow_tf32 = false;
  for (int trial = 0; trial < 2; ++trial) {
    const std::size_t m = 257, k = 300, n = 129;
    std::vector<float> a(m * k), b(k * n), want(m * n), got(m * n);
    std::uniform_real_distribution<float> value(-1.0F, 1.0F);
    for (auto& x : a) x = value(rng);
    for (auto& x : b) x = value(rng);
    std::size_t ae[] = {m, k}, be[] = {k, n}, ce[] = {m, n};
    zest::host::contract<float>({{a.data(), "ik", ae}, {b.data(), "kj", be}}, "ij", want.data(),
                                ce);
    auto da = to_device(a), db = to_device(b);
    device_buffer<float> dc(m * n);
    zest::cuda::contract<float>({{da.data(), "ik", ae}, {db.data(), "kj", be}}, "ij", dc.data(),
                                ce);
    CHECK(max_relative_difference(to_host(dc), want) < (trial == 0 ? 1e-5 : 1e-2));
    zest::cuda::settings().allow_tf32 = true;
  }
  zest::cuda::settings().allow_tf32 = false;
}

TEST_CASE("cuda::contract reports bad shapes like the host") {
  device_buffer<float> x(6), out(6);
  std::size_t xe[] = {2, 3}, oe[] = {3, 3};
  CHECK_THROWS_AS(zest::cuda::contract<float>({{x.data(), "ij", xe}}, "ji", out.data(), oe),
                  zest::shape_error);
  CHECK_THROWS_WITH(zest::cuda::contract<float>({{x.data(), "ij", xe}}, "jk", out.data(), oe),
                    doctest::Contains("output dim 'k' appears in no operand"));
}

}  // namespace
