// The quantized wire (zest/layout/wire.hpp, zest/tensor/wire_codec.hpp): int8 blocks with
// fp32 scales, ZeRO++'s qwZ and qgZ in the mover. A hand-computed encoding; a group's
// all-gather and reduce-scatter on every 2-D mesh shape against a reference written here
// (each rank's block quantized on its own, decoded, and for the reduce-scatter summed in rank
// order), within half a quantum of the exact values; the bytes each rank sends equal
// step_wire_bytes (and are about a quarter of fp32's); what the wire does not carry stays exact.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/layout/wire.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/wire_codec.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using mesh_t = mesh<"dp", "tp">;
constexpr std::uint32_t block = 16;
constexpr wire_format q16 = int8_blocks(block);

// The reference: each block's scale is its largest magnitude over 127; values round to the
// nearest multiple of it.
std::vector<float> quantized(std::span<const float> x, std::size_t b, std::vector<float>* scales) {
  std::vector<float> out(x.size());
  for (std::size_t first = 0; first < x.size(); first += b) {
    const std::size_t last = std::min(first + b, x.size());
    float largest = 0;
    for (std::size_t i = first; i < last; ++i) largest = std::max(largest, std::fabs(x[i]));
    const float scale = largest / 127.0F;
    for (std::size_t i = first; i < last; ++i) {
      out[i] = scale == 0 ? 0.0F : static_cast<float>(std::lround(x[i] / scale)) * scale;
      if (scales) scales->push_back(scale);
    }
  }
  return out;
}

// got against the reference decoding `want` of the exact values `exact`: within one quantum
// of the reference (a rounding tie may go either way) and within half a quantum (plus float
// rounding) of the exact value.
void check_quantized(std::span<const float> got, std::span<const float> want,
                     std::span<const float> exact, std::span<const float> quantum) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << ", reference " << want[i] << ", exact " << exact[i]
                    << ", quantum " << quantum[i]);
    CHECK(std::fabs(got[i] - want[i]) <= quantum[i] * 1.0001F + 1e-30F);
    CHECK(std::fabs(got[i] - exact[i]) <= quantum[i] * 0.5001F + 1e-6F * std::fabs(exact[i]));
  }
}

// A tensor's global values as floats (what make_shard stores).
template <std::size_t Rank>
std::vector<float> global_floats(const std::array<std::size_t, Rank>& g, std::uint32_t salt) {
  const auto d = global_values(g, salt);
  return {d.begin(), d.end()};
}

template <fixed_string Dims, std::size_t Rank>
std::uint64_t wire_bytes_of(layout_value from, layout_value to,
                            const std::array<std::size_t, Rank>& g, const mesh_t& m,
                            const wire_format& wire) {
  const auto plan = transition_plan_for<Dims>(from, to, g, m);
  const auto shape = make_transition_shape(view_of<Dims>, g, m.sizes());
  detail::mesh_coords here{};
  for (std::size_t a = 0; a < mesh_t::axis_count; ++a) here[a] = m.coord(a);
  std::uint64_t b = 0;
  layout_value v = from;
  for (const auto& s : plan) {
    if (is_collective(s.kind)) b += detail::step_wire_bytes(s, v, shape, here, wire, sizeof(float));
    v = detail::after_step(v, s);
  }
  return b;
}

TEST_CASE(
    "int8 blocks, by hand: scales first, bytes padded to 4, non-finite blocks decode to NaN") {
  CHECK(q16.bytes(0) == 0);
  CHECK(int8_blocks(4).bytes(6) == 2 * 4 + 8);
  CHECK(int8_blocks(256).bytes(1000) == 4 * 4 + 1000);
  CHECK(q16.carries(step_kind::all_gather, 2));
  CHECK(q16.carries(step_kind::reduce_scatter, 2));
  CHECK_FALSE(q16.carries(step_kind::all_reduce, 2));
  CHECK_FALSE(q16.carries(step_kind::all_to_all, 2));
  CHECK_FALSE(q16.carries(step_kind::all_gather, 1));  // over one rank: exact
  CHECK_FALSE(exact_wire.carries(step_kind::all_gather, 2));
  CHECK(int8_all_gathers(16).carries(step_kind::all_gather, 2));
  CHECK_FALSE(int8_all_gathers(16).carries(step_kind::reduce_scatter, 2));
  CHECK(int8_reduce_scatters(16).carries(step_kind::reduce_scatter, 2));
  CHECK_FALSE(int8_reduce_scatters(16).carries(step_kind::all_gather, 2));
  CHECK(int8_all_gathers(0) == exact_wire);
  CHECK(q16.collective_for(step_kind::reduce_scatter, 2) == collective::all_to_all);
  CHECK(q16.collective_for(step_kind::reduce_scatter, 1) == collective::reduce_scatter);

  // Blocks of 4: {1, -2, 0.75, 127} has scale 1; {0, 3} scale 3/127.
  const std::vector<float> x{1, -2, 0.75F, 127, 0, 3};
  std::vector<std::uint8_t> wire(int8_blocks(4).bytes(x.size()), 0xAB);
  for (std::size_t b = 0; b < 2; ++b)
    detail::encode_blocks_fn<float>{x.data(), 6, 4, wire.data()}(b);
  float s0 = 0, s1 = 0;
  std::memcpy(&s0, wire.data(), 4);
  std::memcpy(&s1, wire.data() + 4, 4);
  CHECK(s0 == 1.0F);
  CHECK(s1 == 3.0F / 127.0F);
  const std::vector<std::int8_t> q{1, -2, 1, 127, 0, 127};
  for (std::size_t i = 0; i < q.size(); ++i) CHECK(static_cast<std::int8_t>(wire[8 + i]) == q[i]);
  std::vector<float> back(6);
  for (std::size_t i = 0; i < 6; ++i) detail::decode_fn<float>{wire.data(), 6, 4, back.data()}(i);
  CHECK(back == std::vector<float>{1, -2, 1, 127, 0, 3.0F / 127.0F * 127.0F});

  // A block with NaN or an infinity: NaN throughout; the other block unharmed.
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const std::vector<float> y{1, bad, 2, 3, 4, 5};
    std::vector<std::uint8_t> w(int8_blocks(4).bytes(6));
    for (std::size_t b = 0; b < 2; ++b)
      detail::encode_blocks_fn<float>{y.data(), 6, 4, w.data()}(b);
    for (std::size_t i = 0; i < 6; ++i) detail::decode_fn<float>{w.data(), 6, 4, back.data()}(i);
    for (std::size_t i = 0; i < 4; ++i) CHECK(std::isnan(back[i]));
    CHECK(back[4] == 102.0F * (5.0F / 127.0F));  // round(4 * 127 / 5) = 102
    CHECK(back[5] == 127.0F * (5.0F / 127.0F));
  }

  // A block of tiny values (a denormal scale: 127 / largest would overflow): each value
  // within half a quantum, none NaN; and an all-zero block.
  const std::vector<float> tiny{1e-38F, 0, -5e-39F, 1e-45F, 0, 0, 0, 0};
  std::vector<std::uint8_t> t(int8_blocks(4).bytes(8));
  for (std::size_t b = 0; b < 2; ++b)
    detail::encode_blocks_fn<float>{tiny.data(), 8, 4, t.data()}(b);
  std::vector<float> tiny_back(8);
  for (std::size_t i = 0; i < 8; ++i) detail::decode_fn<float>{t.data(), 8, 4, tiny_back.data()}(i);
  for (std::size_t i = 0; i < 8; ++i) {
    INFO("element " << i << ": " << tiny_back[i] << " for " << tiny[i]);
    CHECK(std::isfinite(tiny_back[i]));
    CHECK(std::fabs(tiny_back[i] - tiny[i]) <= 0.51F * 1e-38F / 127.0F + 1e-45F);
  }
  CHECK(tiny_back[0] == 127.0F * (1e-38F / 127.0F));
  for (std::size_t i = 4; i < 8; ++i) CHECK(tiny_back[i] == 0.0F);
}

TEST_CASE("a quantized all-gather: every rank's blocks decoded, within half a quantum") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    INFO(m.describe());
    const std::size_t n = static_cast<std::size_t>(m.size(0));
    // "mh" split on its first dim (rows: received in place), "hm" on its last (strided
    // blocks), "h" long enough for several blocks per rank.
    const std::array<std::size_t, 2> g_mh{7, 5}, g_hm{5, 9};
    const std::array<std::size_t, 1> g_h{300};
    const layout_value mh_from = layout_value_of<mesh_t, "mh", layout<split<'m', "dp">>>;
    const layout_value hm_from = layout_value_of<mesh_t, "hm", layout<split<'m', "dp">>>;
    const layout_value h_from = layout_value_of<mesh_t, "h", layout<split<'h', "dp">>>;
    const layout_value full = replicated_layout(2);
    std::array<std::size_t, 2> l_mh{}, l_hm{};
    std::array<std::size_t, 1> l_h{};
    const auto mh = make_shard<float, "mh">(mh_from, g_mh, m, 1, &l_mh);
    const auto hm = make_shard<float, "hm">(hm_from, g_hm, m, 2, &l_hm);
    const auto h = make_shard<float, "h">(h_from, g_h, m, 3, &l_h);

    m.reset_stats();
    detail::transition_group<float, mesh_t> group(m, q16);
    group.add("mh", mh_from, transition_plan_for<"mh">(mh_from, full, g_mh, m),
              detail::to_shard_extents(g_mh), detail::to_shard_extents(l_mh),
              std::span<const float>(mh));
    group.add("hm", hm_from, transition_plan_for<"hm">(hm_from, full, g_hm, m),
              detail::to_shard_extents(g_hm), detail::to_shard_extents(l_hm),
              std::span<const float>(hm));
    group.add("h", h_from, transition_plan_for<"h">(h_from, full, g_h, m),
              detail::to_shard_extents(g_h), detail::to_shard_extents(l_h),
              std::span<const float>(h));
    group.run();
    const auto& dp = m.axis(0).stats();
    CHECK(dp.calls() == 1);
    CHECK(dp[collective::all_gather].calls == 1);
    const std::uint64_t wire_bytes = wire_bytes_of<"mh">(mh_from, full, g_mh, m, q16) +
                                     wire_bytes_of<"hm">(hm_from, full, g_hm, m, q16) +
                                     wire_bytes_of<"h">(h_from, full, g_h, m, q16);
    CHECK(dp.bytes_sent() == wire_bytes);
    CHECK(dp.bytes_sent() ==
          (n - 1) * (q16.bytes(mh.size()) + q16.bytes(hm.size()) + q16.bytes(h.size())));
    // About a quarter of fp32's bytes: 1 + 4/16 bytes per element and the padding.
    if (n > 1) {
      const double fp32 = 4.0 * static_cast<double>((n - 1) * (mh.size() + hm.size() + h.size()));
      CHECK(static_cast<double>(dp.bytes_sent()) / fp32 < 0.35);
    }

    // The reference: rank c's block of each tensor (its dp block), quantized alone.
    auto gathered = [&](std::size_t k, const auto& g, std::size_t dim, std::uint32_t salt) {
      const auto exact = global_floats(g, salt);
      std::vector<float> want(exact.size()), quantum(exact.size());
      std::size_t outer = 1, inner = 1;
      for (std::size_t i = 0; i < dim; ++i) outer *= g[i];
      for (std::size_t i = dim + 1; i < g.size(); ++i) inner *= g[i];
      for (std::size_t c = 0; c < n; ++c) {
        const block_range r = balanced_block(g[dim], n, c);
        std::vector<float> part;
        for (std::size_t o = 0; o < outer; ++o)
          for (std::size_t j = r.offset; j < r.offset + r.size; ++j)
            for (std::size_t i = 0; i < inner; ++i)
              part.push_back(exact[(o * g[dim] + j) * inner + i]);
        std::vector<float> scales;
        const auto decoded = quantized(part, block, &scales);
        std::size_t at = 0;
        for (std::size_t o = 0; o < outer; ++o)
          for (std::size_t j = r.offset; j < r.offset + r.size; ++j)
            for (std::size_t i = 0; i < inner; ++i, ++at) {
              want[(o * g[dim] + j) * inner + i] = decoded[at];
              quantum[(o * g[dim] + j) * inner + i] = scales[at];
            }
      }
      const auto got = group.release(k);
      check_quantized(std::span<const float>(got.data(), got.size()), want, exact, quantum);
      if (n == 1) CHECK(std::vector<float>(got.begin(), got.end()) == exact);  // nothing sent
    };
    gathered(0, g_mh, 0, 1);
    gathered(1, g_hm, 1, 2);
    gathered(2, g_h, 0, 3);
  }
}

TEST_CASE("a quantized reduce-scatter: an int8 all-to-all, the parts decoded and summed") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    INFO(m.describe());
    const std::size_t n = static_cast<std::size_t>(m.size(0));
    const std::size_t me = static_cast<std::size_t>(m.coord(0));
    const std::array<std::size_t, 2> g_mh{8, 6};
    const std::array<std::size_t, 1> g_h{70};
    const std::array<std::size_t, 1> g_z{3};  // on 4 ranks one part is empty
    const layout_value mh_from = layout_value_of<mesh_t, "mh", layout<partial<"dp">>>;
    const layout_value mh_to = layout_value_of<mesh_t, "mh", layout<split<'m', "dp">>>;
    const layout_value h_from = layout_value_of<mesh_t, "h", layout<partial<"dp">>>;
    const layout_value h_to = layout_value_of<mesh_t, "h", layout<split<'h', "dp">>>;
    std::array<std::size_t, 2> l_mh{};
    std::array<std::size_t, 1> l_h{}, l_z{};
    const auto mh = make_shard<float, "mh">(mh_from, g_mh, m, 4, &l_mh);
    const auto h = make_shard<float, "h">(h_from, g_h, m, 5, &l_h);
    const auto z = make_shard<float, "h">(h_from, g_z, m, 6, &l_z);

    m.reset_stats();
    detail::transition_group<float, mesh_t> group(m, q16);
    group.add("mh", mh_from, transition_plan_for<"mh">(mh_from, mh_to, g_mh, m),
              detail::to_shard_extents(g_mh), detail::to_shard_extents(l_mh),
              std::span<const float>(mh));
    group.add("h", h_from, transition_plan_for<"h">(h_from, h_to, g_h, m),
              detail::to_shard_extents(g_h), detail::to_shard_extents(l_h),
              std::span<const float>(h));
    group.add("h", h_from, transition_plan_for<"h">(h_from, h_to, g_z, m),
              detail::to_shard_extents(g_z), detail::to_shard_extents(l_z),
              std::span<const float>(z));
    group.run();
    const auto& dp = m.axis(0).stats();
    CHECK(dp.calls() == 1);
    // Over one rank nothing is quantized: the reduce-scatter stays one.
    CHECK(dp[n > 1 ? collective::all_to_all : collective::reduce_scatter].calls == 1);
    CHECK(dp.bytes_sent() == wire_bytes_of<"mh">(mh_from, mh_to, g_mh, m, q16) +
                                 wire_bytes_of<"h">(h_from, h_to, g_h, m, q16) +
                                 wire_bytes_of<"h">(h_from, h_to, g_z, m, q16));
    // A tensor's blocks are its own: "mh" alone (sent and received in place) ends as it
    // does among the others.
    const auto alone = [&] {
      detail::transition_group<float, mesh_t> one(m, q16);
      one.add("mh", mh_from, transition_plan_for<"mh">(mh_from, mh_to, g_mh, m),
              detail::to_shard_extents(g_mh), detail::to_shard_extents(l_mh),
              std::span<const float>(mh));
      one.run();
      const auto b = one.release(0);
      return std::vector<float>(b.begin(), b.end());
    }();

    // The reference: rank r's summand (make_shard's formula at dp coordinate r), my part of
    // it quantized alone, decoded, summed over r in rank order.
    auto reduced = [&](std::size_t k, const auto& g, std::uint32_t salt) {
      constexpr std::size_t rank = std::tuple_size_v<std::remove_cvref_t<decltype(g)>>;
      const std::size_t row = g.size() == 1 ? 1 : g[1];
      const block_range rows = balanced_block(g[0], n, me);
      const std::size_t count = rows.size * row;
      std::vector<float> want(count, 0), exact(count, 0), quantum(count, 0);
      for (std::size_t r = 0; r < n; ++r) {
        std::vector<float> part(count);
        std::vector<double> whole(count);
        for (std::size_t e = 0; e < count; ++e) {
          std::array<std::size_t, rank> idx{};
          idx[0] = rows.offset + e / row;
          if constexpr (rank == 2) idx[1] = e % row;
          const double x =
              value_at(idx, salt) / static_cast<double>(n) +
              (static_cast<double>(r) - 0.5 * static_cast<double>(n - 1)) * spread_at(idx);
          part[e] = static_cast<float>(x);
          exact[e] += part[e];
        }
        std::vector<float> scales;
        const auto decoded = quantized(part, block, &scales);
        for (std::size_t e = 0; e < count; ++e) {
          want[e] += decoded[e];
          quantum[e] += scales[e];  // the error bound adds up over the summands
        }
      }
      const auto got = group.release(k);
      check_quantized(std::span<const float>(got.data(), got.size()), want, exact, quantum);
      if (k == 0) CHECK(std::vector<float>(got.begin(), got.end()) == alone);
    };
    reduced(0, g_mh, 4);
    reduced(1, g_h, 5);
    reduced(2, g_z, 6);
  }
}

TEST_CASE("what the wire does not carry travels exact; integers refuse a quantized wire") {
  for (const auto& shape : mesh_shapes()) {
    mesh_t m(MPI_COMM_WORLD, shape);
    const std::array<std::size_t, 2> g{6, 5};
    const layout_value from = layout_value_of<mesh_t, "mh", layout<partial<"dp">>>;
    const layout_value full = replicated_layout(2);
    std::array<std::size_t, 2> local{};
    const auto x = make_shard<float, "mh">(from, g, m, 6, &local);
    const auto plan = transition_plan_for<"mh">(from, full, g, m);
    auto run = [&](wire_format w) {
      detail::transition_group<float, mesh_t> group(m, w);
      group.add("mh", from, plan, detail::to_shard_extents(g), detail::to_shard_extents(local),
                std::span<const float>(x));
      group.run();
      const auto out = group.release(0);
      return std::vector<float>(out.begin(), out.end());
    };
    REQUIRE(plan.size() == 1);
    REQUIRE(plan[0].kind == step_kind::all_reduce);
    CHECK(run(q16) == run(exact_wire));
  }
  mesh_t m(MPI_COMM_WORLD, mesh_shapes().front());
  CHECK_THROWS_WITH_AS((detail::transition_group<std::int32_t, mesh_t>(m, q16)),
                       doctest::Contains("float, bfloat16 and float16 elements only"),
                       std::logic_error);
}

}  // namespace
